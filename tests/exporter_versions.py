"""The clickhouseexporter's tables as a Collector of another release creates them, for tests of tables that a
Collector made before sloscope first wrote to them (sloscope's own DDL is
analytics/sql/clickhouse/exporter_tables.sql)."""

from pathlib import Path

from sloscope.analytics.clickhouse_store import ChdbBackend
from sloscope.analytics.stores import CHDB_DATABASE

SINCE_V0160 = Path(__file__).parent / "data" / "clickhouse" / "exporter_tables_v0160.sql"


def create_tables(directory: Path, ddl: Path = SINCE_V0160, named=lambda text: text) -> None:
    """Make the tables of `ddl` in the chDB database that chdb:///DIRECTORY opens, their names `named`."""
    backend = ChdbBackend(directory, CHDB_DATABASE)
    try:
        for statement in ddl.read_text().split("\n;\n"):
            backend.execute(named(statement))
    finally:
        backend.close()
