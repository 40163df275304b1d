import os

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


@pytest.fixture(scope="module")
def one_worker_pool():
    """A decode pool of one worker process under the built-in spec, for tests of the paths through a worker."""
    from sloscope.analytics.decode_pool import DecodePool  # here, so that collecting the other tests loads none of it
    from sloscope.slo_spec import load_spec

    spec = load_spec(None)
    pool = DecodePool(1, frozenset(spec.tiers), spec.default_tier)
    yield pool
    pool.close()
