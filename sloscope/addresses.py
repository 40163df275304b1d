"""The one HOST:PORT grammar of every address sloscope listens on (serve's --http, --grpc and --webhook, the
webhook's --listen, the collector's listen):

    address := host ":" port | ":" port | "[" ipv6 "]" ":" port      0.0.0.0:4318, :4318, [::1]:9465
    port    := 0 to 65535 (0: any free port)

An empty host is loopback, 127.0.0.1: a process opens itself to other machines only when told to, as the
manifests in deploy/ do with 0.0.0.0. Where a listener may be turned off, `off` says so.
"""

from __future__ import annotations

from sloscope.errors import ConfigError

LOOPBACK = "127.0.0.1"


def parse_address(value, where: str = "", *, may_be_off: bool = False) -> tuple[str, int] | None:
    """(host, port), or None for `off` where the listener may be off; ConfigError naming `where` otherwise."""
    text = str(value).strip()
    if may_be_off and text.lower() == "off":
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535 or (host.count(":") and not host.startswith("[")):
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}expected HOST:PORT (like 127.0.0.1:4318, :4318 or [::1]:4318)"
                          f"{' or off' if may_be_off else ''}; got {text[:60]!r}")
    return host.strip("[]") or LOOPBACK, int(port)


def address_text(address: tuple[str, int]) -> str:
    """HOST:PORT as parse_address reads it back, IPv6 hosts in brackets."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
