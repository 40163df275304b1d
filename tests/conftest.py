import os
import socket

import pytest

REQUIRE_PRIVILEGED = os.environ.get("SLOSCOPE_REQUIRE_PRIVILEGED") == "1"


def need(condition: bool, why: str) -> None:
    """Skip a test whose environment lacks something (root, eBPF, a Debian tool), except in CI where
    SLOSCOPE_REQUIRE_PRIVILEGED=1 turns the skip into a failure, so nothing privileged passes by skipping."""
    if condition:
        return
    if REQUIRE_PRIVILEGED:
        pytest.fail(f"required by SLOSCOPE_REQUIRE_PRIVILEGED=1 but unavailable: {why}")
    pytest.skip(why)


@pytest.fixture
def ipv6_loopback() -> str:
    """The IPv6 loopback address, for a test that listens there: skipped only where this machine has none."""
    need(_has_ipv6_loopback(), "no IPv6 loopback (::1) on this machine")
    return "::1"


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def one_worker_pool():
    """A decode pool of one worker process under the built-in spec, for tests of the paths through a worker."""
    from sloscope.analytics.decode_pool import DecodePool  # here, so that collecting the other tests loads none of it
    from sloscope.slo_spec import load_spec

    spec = load_spec(None)
    pool = DecodePool(1, frozenset(spec.tiers), spec.default_tier)
    yield pool
    pool.close()
