"""What both stores answer alike from their own queries (analytics/store_api.py): scalars, rollups, the recorded
SLO spec. The DuckDB reader (analytics/store.py) and the ClickHouse store (analytics/clickhouse_store.py) derive
from these bases, so that neither derives from the other."""

from __future__ import annotations

from pathlib import Path

from sloscope.slo_spec import load_spec, parse_spec

from sloscope.analytics.rollups import Rollups


class ReaderBase:
    """A store's reader's shared part, over the store's own `sql`, `frame`, `rows`, `meta`, `tables` and `set_meta`
    and its rollups."""

    read_only: bool
    meta_table: str  # the table `meta` reads
    _rollups: Rollups

    def scalar(self, query: str, params=None):
        rows = self.rows(query, params)
        return rows[0][0] if rows else None

    def computed(self, name: str, params: dict):
        """The rows of the query NAME, read from sloscope's rollups where they are current (analytics/rollups.py)."""
        query, params = self._rollups.query(name, params) or (self.sql(name), params)
        return self.frame(query, params)

    def roll_up(self, name: str, params: dict) -> None:
        """Rollups of the query NAME over [since, until) made ahead of analysis, where this store may write them."""
        self._rollups.fill(name, params)

    def slo_spec(self):
        """The SLO spec recorded with this store (by the last command given --slo), else the built-in one (also
        where the store has no meta table: not a sloscope store yet)."""
        recorded = self.meta("slo_spec") if self.meta_table in self.tables() else None
        return parse_spec(recorded, f"{self.path} (recorded spec)") if recorded else load_spec(None)

    def spec(self, path: str | Path | None = None):
        """The SLO spec a command runs with: the file given (recorded with the store where it can be written, so
        that later commands on it use the same tiers), else the recorded one, else the built-in one."""
        if path is None:
            return self.slo_spec()
        spec = load_spec(path)
        if not self.read_only:
            self.set_meta("slo_spec", Path(path).read_text())
        return spec


class StoreBase(ReaderBase):
    """An open store's shared part: closed (by its own `close`) at the end of a `with`."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
