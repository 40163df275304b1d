"""What an inference service's own requests say of the load on its engine (analytics/sql/inference_load.sql):
arrivals, prompt tokens and queue time per node, service and step, as series of the catalog's INFERENCE_LOAD signals
beside the received ones. They tell a surge of arrivals, which the engine's queue follows, from a fault under a
steady load (taxonomy: inference_queue, prefill_interference)."""

from __future__ import annotations

import polars as pl

from sloscope import catalog

from sloscope.analytics.cumulative import SERIES
from sloscope.analytics.store_api import StoreReader


def load_steps(store: StoreReader, params: dict, schema: pl.Schema) -> pl.DataFrame:
    """The load series over signal_steps' parameters, in the columns and types of its frame (`schema`), each with
    the service as its attribute. Their integers are hashes of their names, as signal_series.sql's are."""
    load = store.frame(store.sql("inference_load"), params)
    if load.is_empty():
        return pl.DataFrame(schema=schema)
    long = load.unpivot(index=["node", "service", "step"], on=list(catalog.INFERENCE_LOAD), variable_name="column",
                        value_name="value").drop_nulls("value")
    named = long.with_columns(
        metric=pl.col("column").replace_strict(catalog.INFERENCE_LOAD, return_dtype=pl.String),
        attributes=pl.struct(pl.col("service").alias(catalog.SERVICE_ATTRIBUTE)).struct.json_encode())
    return named.with_columns(
        # the store's integer type: a hash is unsigned, ClickHouse's results keep none
        series=pl.struct(SERIES).hash(params["seed"]).reinterpret(signed=schema["series"].is_signed_integer()),
        step=pl.col("step").cast(schema["step"]), value=pl.col("value").cast(pl.Float64),
    ).with_columns(pl.col(SERIES).cast(pl.Categorical)).select(list(schema))
