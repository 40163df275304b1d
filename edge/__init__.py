"""Serving HTTP and gRPC to untrusted clients, whatever the payload: framing, body limits, draining, TLS, bearer
tokens and gRPC admission, under the OTLP receiver and the Alertmanager webhook alike."""
