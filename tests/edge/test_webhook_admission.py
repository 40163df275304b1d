"""The Alertmanager webhook's connections admitted as serve's are (edge/http_conn.py): idle connections from one
address, more than the webhook's cap, leave Alertmanager at another served. A real `sloscope webhook`."""

import json
import time

from tests.alerts.test_webhook import CONFIG, TOKEN, payload
from tests.hostile_clients import ANSWERED_S, ATTACKER, idle_keepalive, webhook_serving
from tests.raw_http import RawClient, request


def test_an_idle_flood_from_one_address_leaves_alertmanager_served(tmp_path):
    """70 idle keep-alive connections (GET /-/healthy needs no token) at the default caps (64 in all, 32 per
    address): each of Alertmanager's notifications, on a new connection, is answered at once."""
    with webhook_serving(tmp_path, CONFIG.replace("execute: true", "execute: false"), TOKEN) as port:
        flood = idle_keepalive(ATTACKER, port, 70, path="/-/healthy")
        assert len(flood) == 70  # each answered, then left idle
        try:
            for i in range(6):
                began = time.monotonic()
                with RawClient(port, timeout=5) as alertmanager:
                    alertmanager.send(request("/alerts", json.dumps(payload(fp=f"{i:016x}")).encode(),
                                              {"Authorization": f"Bearer {TOKEN.decode()}",
                                               "Content-Type": "application/json"}))
                    assert alertmanager.response()[0] == 200 and time.monotonic() - began < ANSWERED_S
        finally:
            for client in flood:
                client.close()
