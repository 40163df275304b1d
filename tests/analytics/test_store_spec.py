"""The spec a command runs with, as the store chooses it: the file given (recorded where the store can be written),
else the one recorded with the database, else the built-in one."""

from sloscope.analytics.store import Store

GOLD = "default_tier: gold\ntiers:\n  gold: {latency: {percentile: 90, threshold_ms: 300}, availability: 99}\n"


def test_a_given_spec_is_recorded_and_read_back_by_later_commands(tmp_path):
    slo, db = tmp_path / "slo.yaml", tmp_path / "s.duckdb"
    slo.write_text(GOLD)
    with Store(db) as store:
        assert store.spec().source == "<built-in>"
        assert list(store.spec(slo).tiers) == ["gold"]
    slo.unlink()
    with Store(db, read_only=True) as store:
        assert list(store.spec().tiers) == ["gold"] and str(db) in store.spec().source


def test_a_read_only_store_uses_the_given_spec_without_recording_it(tmp_path):
    slo, db = tmp_path / "slo.yaml", tmp_path / "s.duckdb"
    slo.write_text(GOLD)
    Store(db).close()
    with Store(db, read_only=True) as store:
        assert list(store.spec(slo).tiers) == ["gold"]
        assert store.meta("slo_spec") is None and store.spec().source == "<built-in>"
