"""What DuckDB and ClickHouse analyses of the same OTLP files must agree on, for the parity tests and
benchmarks/rca_accuracy.py --clickhouse."""


def incident_summary(result: dict) -> list[tuple]:
    """Each incident of an rca document as (tier, service, node, start, end, [causes, best first])."""
    return [(i["tier"], i["service"], i["node"], i["start"], i["end"], [c["cause"] for c in i["causes"]])
            for i in result["incidents"]]
