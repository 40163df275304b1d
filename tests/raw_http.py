"""A raw HTTP/1.1 client over one socket, for requests no well-behaved client library would send (two
Content-Lengths, a header byte at a time) and for seeing exactly what a server answers and when it closes."""

from __future__ import annotations

import select
import socket
import time


class RawClient:
    def __init__(self, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def trickle(self, data: bytes, every_s: float) -> int:
        """Send a byte at a time; returns how many got out before the server closed the connection."""
        for i in range(len(data)):
            try:
                self.sock.sendall(data[i:i + 1])
            except OSError:
                return i
            time.sleep(every_s)
        return len(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body) of the next response."""
        status_line = self.file.readline()
        if not status_line:
            raise ConnectionError("closed before a response")
        status = int(status_line.split()[1])
        headers = {}
        while (line := self.file.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers, self.file.read(int(headers.get("content-length", 0)))

    def silent_for(self, seconds: float) -> bool:
        """True when the server sends nothing (and does not close) for that long. poll, not select: a process
        that has used chDB holds descriptors past select's limit of 1024."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return not poller.poll(seconds * 1000)

    def closed_by_server(self, within_s: float = 5.0) -> bool:
        """True when the server closes the connection (EOF or reset) within the time, sending nothing more."""
        self.sock.settimeout(within_s)
        try:
            return self.file.read(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def request(path: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST",
            length: bool = True) -> bytes:
    """The bytes of one request; `length` adds a Content-Length of the body unless headers frame it."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"
