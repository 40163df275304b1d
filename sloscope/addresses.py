"""The one HOST:PORT grammar of every address sloscope listens on (serve's --http, --grpc and --webhook, the
webhook's --listen, the collector's listen):

    address := host ":" port | ":" port | "[" ipv6 "]" ":" port      0.0.0.0:4318, :4318, [::1]:9465
    host    := a name or IPv4 address, without whitespace, brackets or colons
    ipv6    := hex digits, colons and dots (an IPv4 tail)
    port    := 0 to 65535 in ASCII digits (0: any free port)

An empty host is loopback, 127.0.0.1: a process opens itself to other machines only when told to, as the
manifests in deploy/ do with 0.0.0.0. Where a listener may be turned off, `off` (any case) says so.
docs/schemas/collector.schema.json's `listen` holds the same pattern.
"""

from __future__ import annotations

import re

from sloscope.errors import ConfigError

LOOPBACK = "127.0.0.1"
# ASCII digits only: str.isdigit and int() also take other scripts' digits (٣) and superscripts (²)
PORT = r"(?:[0-5]?[0-9]{1,4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
ADDRESS = re.compile(rf"(?:\[([0-9A-Fa-f:.]+)\]|([^\s\[\]:]*)):({PORT})")


def parse_address(value, where: str = "", *, may_be_off: bool = False) -> tuple[str, int] | None:
    """(host, port), or None for `off` where the listener may be off; ConfigError naming `where` otherwise."""
    text = str(value).strip()
    if may_be_off and text.lower() == "off":
        return None
    match = ADDRESS.fullmatch(text)
    if match is None:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}expected HOST:PORT (like 127.0.0.1:4318, :4318 or [::1]:4318)"
                          f"{' or off' if may_be_off else ''}; got {text[:60]!r}")
    ipv6, host, port = match.groups()
    return ipv6 or host or LOOPBACK, int(port)


def address_text(address: tuple[str, int]) -> str:
    """HOST:PORT as parse_address reads it back, IPv6 hosts in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
