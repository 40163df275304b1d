"""What the rollup tests of both stores read: the SLI windows and the fleet's (or a node's) evidence steps of a
range in a fixed order, from a store with its rollups or with them set aside."""

import polars as pl

from sloscope.analytics.attribution import Window, signal_steps
from sloscope.analytics.slo import sli_windows
from sloscope.slo_spec import load_spec

SPEC = load_spec(None)


def raw_only(store):
    """The store with its rollups set aside: every query reads the raw tables."""
    store._rollups.query = lambda name, params: None
    return store


def headers(store, table: str) -> int:
    """How many whole batches the rollup table holds."""
    return store.scalar(f"SELECT count(*) FROM {table} WHERE header")


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns)


def sli(store, since, until) -> pl.DataFrame:
    return _sorted(pl.concat(list(sli_windows(store, SPEC, since, until).values())))


def steps(store, since, until, node=None) -> pl.DataFrame:
    window = Window(since, since + (until - since) / 2, since + (until - since) / 2, until, SPEC.resolution_s)
    return _sorted(signal_steps(store, window, SPEC.taxonomy, evidence_only=True, node=node))
