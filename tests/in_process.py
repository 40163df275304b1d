"""serve's intake in this process: store, writer, intake and receiver, on OTLP/HTTP and OTLP/gRPC at 127.0.0.1
(ports chosen by the kernel), for tests that look inside the receiver."""

import http.client
import threading

from sloscope.analytics.intake import Intake
from sloscope.analytics.store import Store
from sloscope.analytics.writer import Writer
from sloscope.enrich.tiers import TierResolver
from sloscope.enrich.topology import GpuTopology
from sloscope.receiver.limits import Limits
from sloscope.receiver.server import Receiver, grpc_server, http_server
from sloscope.slo_spec import load_spec


class InProcessReceiver:
    """`wrap`, when given, stands between the receiver and the intake (wrap(intake) -> intake); with a decode
    pool every request is decoded by its workers; tls, auth and pages go to both servers as serve gives them."""

    def __init__(self, db, limits: Limits = Limits(), *, wrap=None, decode_pool=None, start_writer: bool = True,
                 queue_rows: int = 1_000_000, tls=None, auth=None, pages=None):
        self.store = Store(db)
        self.writer = Writer(self.store, max_queued_rows=queue_rows)
        if start_writer:
            self.writer.start()
        intake = Intake(self.writer, TierResolver.from_spec(load_spec(None)), GpuTopology())
        self.receiver = Receiver(wrap(intake) if wrap else intake,
                                 intake.offload(decode_pool) if decode_pool else None, 0, limits)
        self.httpd = http_server(self.receiver, "127.0.0.1", 0, pages=pages, tls=tls, auth=auth)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.grpcd, self.grpc_port = grpc_server(self.receiver, "127.0.0.1", 0, tls=tls, auth=auth)
        self.grpcd.start()
        self.http_port = self.httpd.server_address[1]

    def post(self, path, body, content_type="application/x-protobuf", headers=None):
        """(status, headers, body) of one plain-HTTP POST."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        conn.request("POST", path, body, {"Content-Type": content_type, **(headers or {})})
        response = conn.getresponse()
        result = response.status, dict(response.getheaders()), response.read()
        conn.close()
        return result

    def rows(self, query):
        """The query's rows once everything accepted is written (the writer stops first)."""
        self.writer.stop()
        return self.store.rows(query)

    def spans(self) -> int:
        return self.rows("SELECT count(*) FROM requests")[0][0]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.grpcd.stop(0)
        self.writer.stop(timeout=10)
        self.store.close()
