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
