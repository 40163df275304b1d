"""Sample types and the mapping of the kernel's log2 buckets onto OTLP exponential histograms (scale 0)."""

import math

import pytest
from hypothesis import given, strategies as st

from sloscope.probes.ebpf.loader import HIST_SLOTS, HistogramDeltas, histogram
from sloscope.probes.sample import (UNIT_SHIFT, HistogramSample, Sample, counter_delta, exponential_index,
                                    log2_histogram, slot_to_index)


def kernel_slot(ns: int) -> int:
    """What probes/ebpf/hist.h computes: sloscope_ns_to_units, then bcc's bpf_log2l (0 stays slot 0)."""
    units = ns * 2097152 // 1953125 if ns < (1 << 43) else ns // 1953125 * 2097152
    if units == 0:
        return 0
    hi = units >> 32
    return (hi.bit_length() - 1) + 32 + 1 if hi else (units.bit_length() - 1) + 1


def test_unit_is_two_to_the_minus_30_seconds():
    assert UNIT_SHIFT == 30
    # 2^21 / 5^9 == 2^30 / 10^9
    assert 2097152 / 1953125 == pytest.approx(2**30 / 1e9, rel=1e-15)


@pytest.mark.parametrize("seconds,index", [(1.0, -1), (1.5, 0), (2.0, 0), (0.75, -1), (2**-20 * 1.5, -20),
                                           (3e-6, -19), (0.05, -5)])
def test_exponential_index_is_otlp_scale_0(seconds, index):
    # OTLP scale 0: bucket i covers (2^i, 2^(i+1)]
    assert exponential_index(seconds) == index
    assert 2.0**index < seconds <= 2.0 ** (index + 1)


@given(st.integers(min_value=1, max_value=10**13))
def test_kernel_slot_maps_onto_the_otlp_bucket_of_the_duration(ns):
    seconds = ns / 1e9
    units = ns * 2**30 / 1e9
    index = slot_to_index(kernel_slot(ns))
    if units < 1:
        assert kernel_slot(ns) == 0  # below one unit (0.93 ns): the zero bucket
        return
    expected = exponential_index(seconds)
    if math.log2(units) % 1 < 1e-6 or ns >= 1 << 43:
        # the documented approximation: on a power-of-two boundary (to within a unit) the kernel rounds up
        assert index in (expected, expected + 1)
    else:
        assert index == expected


def test_known_durations_land_in_their_buckets():
    assert slot_to_index(kernel_slot(40_000_000)) == -5  # 40 ms in (31.25 ms, 62.5 ms]
    assert slot_to_index(kernel_slot(1_500)) == -20  # 1.5 µs in (0.95 µs, 1.9 µs]
    assert slot_to_index(kernel_slot(3 * 10**9)) == 1  # 3 s in (2 s, 4 s]


def test_log2_histogram_layout():
    # slots 0 (zero), 21 and 23 -> indices -10 and -8, with a hole between
    h = log2_histogram("sloscope.syscall.duration", {"syscall.name": "read"}, {0: 2, 21: 5, 23: 1},
                       0.004, 10, 20)
    assert (h.zero_count, h.positive_offset, h.positive_bucket_counts) == (2, -10, [5, 0, 1])
    assert h.count == 8 and h.sum == 0.004 and h.scale == 0
    assert h.bucket_bounds(0) == (2.0**-10, 2.0**-9)
    assert h.mean == pytest.approx(0.0005)
    assert h.quantile(0.2) == 0.0  # within the zero bucket
    assert h.quantile(0.5) == 2.0**-9
    assert h.quantile(1.0) == 2.0**-7
    assert h.to_dict()["positive_bucket_counts"] == [5, 0, 1]


def test_empty_histogram():
    h = log2_histogram("sloscope.cpu.runqueue.delay", {}, {}, 0.0, 1, 2)
    assert h.count == 0 and h.positive_bucket_counts == [] and h.mean is None and h.quantile(0.5) is None


def test_samples_are_frozen():
    s = Sample("sloscope.tcp.retransmits", {}, 2, 1.0, "counter_delta", 1)
    with pytest.raises(AttributeError):
        s.value = 2.0
    assert s.to_dict()["kind"] == "counter_delta"
    assert not hasattr(s, "__dict__")  # slots
    assert not hasattr(HistogramSample("x", {}, 1, 0, 0, 0.0, 0, 0, 0, []), "__dict__")


def test_counter_delta():
    assert counter_delta(None, 5) == 0.0
    assert counter_delta(3, 5) == 2.0
    assert counter_delta(5, 3) == 0.0  # reset


def test_histogram_deltas_only_report_new_observations():
    d = HistogramDeltas()
    assert d.update({"read": {20: 3}}, {"read": 300}) == {"read": ({20: 3}, 300)}
    assert d.update({"read": {20: 3}}, {"read": 300}) == {}
    assert d.update({"read": {20: 4, 22: 1}, "write": {19: 2}}, {"read": 900, "write": 50}) == {
        "read": ({20: 1, 22: 1}, 600), "write": ({19: 2}, 50)}


def test_a_histogram_map_value_is_its_slot_counts_then_the_sum():
    value = [0] * HIST_SLOTS + [123]
    value[1], value[4] = 4, 1
    assert histogram(value) == ({1: 4, 4: 1}, 123)  # empty slots left out
