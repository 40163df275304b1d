"""Who a client is, for the limits each listener sets per client: its IP address, whatever form the server was
given it in. A whole node's exporters may sit behind one SNAT address, so these limits are generous fractions of
the listener's own, never one or two."""

from __future__ import annotations

import ipaddress
import urllib.parse


def peer_ip(address: str | None) -> str | None:
    """A client's IP address as a pod's is written: from a socket's address or gRPC's peer ("ipv4:IP:PORT",
    "ipv6:[IP]:PORT"), an IPv4-mapped IPv6 address as IPv4; None for anything else (a Unix socket)."""
    text = address or ""
    if text.startswith(("ipv4:", "ipv6:")):
        text = urllib.parse.unquote(text[5:]).rsplit(":", 1)[0].strip("[]")  # gRPC may escape the brackets
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)
