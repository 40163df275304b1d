"""http.server's threading server on any address sloscope/addresses.py reads, IPv6 hosts included: socketserver
creates an IPv4 socket unless the server says otherwise, and `[::1]:4318` would fail to bind."""

from __future__ import annotations

import socket
from http.server import ThreadingHTTPServer


class AnyFamilyHTTPServer(ThreadingHTTPServer):

    def __init__(self, server_address: tuple[str, int], *args, **kwargs):
        # parse_address gives an IPv6 host without its brackets, so a colon is what marks one; a name such as
        # localhost is bound over IPv4, as before
        self.address_family = socket.AF_INET6 if ":" in server_address[0] else socket.AF_INET
        super().__init__(server_address, *args, **kwargs)
