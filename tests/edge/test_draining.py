"""Stopping an HTTP server: the request in flight is answered, idle kept-alive connections are closed at once,
and no connection thread outlives the drain (one left inside the store at exit aborts the process)."""

import http.client
import threading
import time

from sloscope.receiver.server import http_server


def _serving(pages):
    server = http_server(None, "127.0.0.1", 0, pages=pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("Thread-") and "process_request_thread" in t.name]


def test_a_request_in_flight_is_answered_and_an_idle_connection_is_closed_at_once():
    entered, release = threading.Event(), threading.Event()

    def slow():
        entered.set()
        release.wait(5)
        return b"done\n", "text/plain"

    others = set(_connection_threads())  # of servers other tests left running in this process
    server, port = _serving({"/slow": slow, "/fast": lambda: (b"ok\n", "text/plain")})
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    idle.request("GET", "/fast")
    assert idle.getresponse().read() == b"ok\n"  # kept alive, now idle (the idle timeout is minutes)
    busy = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    busy.request("GET", "/slow")
    assert entered.wait(5)
    started = time.monotonic()
    drain = threading.Thread(target=server.drain)
    drain.start()
    time.sleep(0.5)
    assert drain.is_alive()  # waits for the request in flight
    release.set()
    response = busy.getresponse()
    assert (response.status, response.read(), response.getheader("Connection")) == (200, b"done\n", "close")
    drain.join(5)
    assert not drain.is_alive() and time.monotonic() - started < 3
    assert not set(_connection_threads()) - others
    idle.request("GET", "/fast")  # the idle connection was closed by the drain, not left to time out
    try:
        idle.getresponse()
        answered = True
    except (ConnectionError, http.client.HTTPException):
        answered = False
    assert not answered


def test_a_request_that_outlasts_the_grace_is_cut_off_and_the_drain_returns():
    def stuck():
        time.sleep(30)
        return b"late\n", "text/plain"

    server, port = _serving({"/stuck": stuck})
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    client.request("GET", "/stuck")
    time.sleep(0.3)
    started = time.monotonic()
    server.drain(grace_s=0.5)
    assert time.monotonic() - started < 3  # the grace and the cut-off wait, not the page's 30 s
    try:
        client.getresponse()
        answered = True
    except (ConnectionError, http.client.HTTPException, TimeoutError):
        answered = False
    assert not answered
