"""The probe life cycle that probes/base.py keeps for every probe: start once, collect contiguous intervals only
while started, clean up after a start that fails half-way, stop idempotently, and say each note once."""

import logging

import pytest

from sloscope.probes.base import Availability, Probe, ProbeError, ProbeUnavailable
from sloscope.probes.sample import Sample


class RecordingProbe(Probe):
    """Records which of its own parts the base class called; `fail_start` makes _start fail after opening."""

    name = "recording"
    source = "procfs"
    signals = ("hw.gpu.temperature",)

    def __init__(self, *, fail_start=None, missing=()):
        super().__init__()
        self.fail_start, self.missing = fail_start, tuple(missing)
        self.calls = []

    def check(self):
        return Availability(self.name, self.missing)

    def _start(self):
        self.calls.append("start")
        self._require_available()
        self.calls.append("opened")
        if self.fail_start is not None:
            raise self.fail_start

    def _collect(self, start_ns, now):
        self.calls.append("collect")
        return [Sample("hw.gpu.temperature", {"hw.id": "g"}, now, 40.0, "gauge", start_ns)]

    def _stop(self):
        self.calls.append("stop")


def test_collect_needs_a_start_and_intervals_follow_each_other():
    probe = RecordingProbe()
    with pytest.raises(ProbeError, match="not started"):
        probe.collect()
    with probe:
        probe.start()  # already running: not started twice
        first, second = probe.collect()[0], probe.collect()[0]
        assert probe.running and probe.calls.count("start") == 1
    assert second.start_time_unix_nano == first.time_unix_nano > first.start_time_unix_nano
    assert not probe.running and probe.calls[-1] == "stop"
    probe.stop()
    assert probe.calls.count("stop") == 2  # stopping again asks the probe again: its _stop is idempotent


def test_a_probe_with_a_period_reads_once_per_period_and_its_first_collect_reads(monkeypatch):
    from sloscope.probes import base

    clock = [10**18]
    monkeypatch.setattr(base, "now_ns", lambda: clock[0])
    probe = RecordingProbe()
    probe.period_s = 10.0
    read = []
    with probe:
        for second in range(31):  # collects every second, a few ms late or early
            clock[0] = 10**18 + second * 10**9 + (3 if second % 2 else -3) * 10**6
            if probe.collect():
                read.append(second)
    assert read == [0, 10, 20, 30]
    assert probe.calls.count("collect") == 4


@pytest.mark.parametrize("failure", [RuntimeError("attach failed"), KeyboardInterrupt()])
def test_a_start_that_fails_half_way_is_cleaned_up_and_not_running(failure):
    probe = RecordingProbe(fail_start=failure)
    with pytest.raises(type(failure)):
        probe.start()
    assert probe.calls == ["start", "opened", "stop"] and not probe.running


def test_a_probe_missing_something_says_what_and_opens_nothing():
    probe = RecordingProbe(missing=["tracefs: not mounted"])
    with pytest.raises(ProbeUnavailable, match="tracefs: not mounted"):
        probe.start()
    assert "opened" not in probe.calls and not probe.running


def test_a_note_is_kept_and_logged_once_on_the_probes_module_logger(caplog):
    probe = RecordingProbe()
    with caplog.at_level(logging.INFO, logger=__name__):
        probe._note("queue-depth sampling is off")
        probe._note("queue-depth sampling is off")
    assert probe.notes == ("queue-depth sampling is off",)
    assert [r.getMessage() for r in caplog.records] == ["recording: queue-depth sampling is off"]
