-- Version 1 -> 2: the pod's IP, so that a request stored on the unknown node can be placed once its pod is known.
ALTER TABLE requests ADD COLUMN pod_ip VARCHAR;
