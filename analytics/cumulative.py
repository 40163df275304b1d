"""Cumulative sums and histograms become per-interval deltas when the DuckDB store writes them, against what it
keeps of each series: its last point (cumulative_state) and the running totals that its stored deltas cannot give
back (cumulative_points: each reset, a series' first point being one, and the point before each reset).

The rules (`with_deltas`): a reset is a new start time (the producer restarted) or a value that went down; the
delta after a reset is the value itself. A series' first point ever counts from its start time when it has one. A
new start time that cannot be used (none, or not before the point) leaves the interval unknown, since the reporter
may have restarted and not the counter; unless the value went down, when the counter restarted after the previous
point, as the Collector's prometheus receiver marks an exporter's restart.

A point after its series' last stored point (the common case) continues from it, and writes nothing more than its
delta and the new last point, and at a reset the running totals of the reset and of the point before it. A point
at or before the last stored point (files loaded out of time order, a Collector retrying an older batch after a
newer one got through) is placed between its stored neighbours by the same rules: its delta counted from the
stored point before it, and the delta of the stored point after it counted again, from it. A point at the time
of a stored one is a duplicate. The neighbours' running totals and times are read back from the stored deltas and
intervals, backwards from the nearest kept running total after them: no reset lies in between, since a reset and
the point before it are kept, so each delta there is a plain difference.

A histogram's interval that added nothing has no row. The point before each stored one is read back from that
one's delta, and where the point before a late one may be such a point, the last row before it stands for it
(with the same running totals; the late point's interval then starts early). A stored point with such points on
both sides has its time read back to the microsecond only. Of several such points in a row only the last is known
(the point before a row): a late point before them with other running totals (a reset) has its successor's delta
stored at that last one.

Limits: a series stored before cumulative_points existed places nothing at or before its last point of then
(kept with `reset` NULL); a point older than what retention kept is placed against the deltas left, which no
longer add up to its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from sloscope.records import HISTOGRAM_BUCKETS

SERIES = ["node", "metric", "attributes"]
# What the cumulative state of each kind of series keeps of its last point, besides its start and time.
STATE_FIELDS = {"sum": ["value"], "histogram": ["count", "sum", "buckets"]}
TABLES = {"sum": "samples", "histogram": "histograms"}
CASTS = {"start_ns": pl.Int64, "time_ns": pl.Int64, "value": pl.Float64, "count": pl.Int64, "sum": pl.Float64,
         "buckets": pl.List(pl.Int64)}
KEY = "_key"  # a point's time in microseconds, as the samples and histograms tables keep it (ts)
SID = "_series"  # a late series' number (CumulativeWrites._place_behind)


@dataclass
class Deltas:
    """What a write's cumulative points of one kind became."""

    rows: pl.DataFrame  # to insert: SERIES, time_ns, interval_s and the kind's fields as deltas
    duplicates: int = 0  # points at the time of a stored one (or repeated in the batch)
    without_baseline: int = 0  # points whose interval is unknown: no row
    recounted: int = 0  # stored rows counted again (updated, or deleted) from a point placed before them


def with_deltas(points: pl.DataFrame, fields: list[str], by: list[str] = SERIES) -> pl.DataFrame:
    """points, sorted by series (the columns `by`) and time, with each one's delta from the point before it in its
    series by the module's rules: `_delta_<field>` and interval_s (null where unknown), `_reset`, and the point
    before it as `_prev_<column>` (but its start)."""
    prev = {c: pl.col(c).shift(1).over(by) for c in ["start_ns", "time_ns"] + fields}
    first_value = fields[0]  # "value" for sums, "count" for histograms
    restarted = prev["start_ns"].is_null() | (pl.col("start_ns") != prev["start_ns"])
    went_down = pl.col(first_value) < prev[first_value]
    if "buckets" in fields:  # a bucket that went down is a reset too: its delta must not be negative (UBIGINT)
        went_down = went_down | ((pl.col("buckets") - prev["buckets"]).list.min() < 0)
    has_start = (pl.col("start_ns") > 0) & (pl.col("start_ns") < pl.col("time_ns"))
    points = points.with_columns(
        _restarted=restarted, _went_down=went_down.fill_null(False),
        _first=prev["time_ns"].is_null(), _has_start=has_start,
        **{f"_prev_{c}": prev[c] for c in ["time_ns"] + fields})
    from_start = pl.col("_restarted") & pl.col("_has_start") & (
        pl.col("_first") | (pl.col("start_ns") >= pl.col("_prev_time_ns")))
    restarted_unknown_start = pl.col("_restarted") & ~from_start & ~pl.col("_went_down")
    deltas = {}
    for c in fields:
        deltas[c] = (pl.when(from_start | pl.col("_went_down")).then(pl.col(c))
                     .when(restarted_unknown_start).then(None)
                     .otherwise(pl.col(c) - pl.col(f"_prev_{c}")))
    interval = (pl.when(from_start).then((pl.col("time_ns") - pl.col("start_ns")) / 1e9)
                .when(restarted_unknown_start).then(None)
                .otherwise((pl.col("time_ns") - pl.col("_prev_time_ns")) / 1e9))
    return points.with_columns(interval_s=interval, _reset=pl.col("_restarted") | pl.col("_went_down"),
                               **{f"_delta_{c}": d for c, d in deltas.items()})


def _rows(points: pl.DataFrame, fields: list[str]) -> pl.DataFrame:
    """Points with deltas (from with_deltas) as Deltas.rows."""
    return points.select(*SERIES, "time_ns", "interval_s", *[pl.col(f"_delta_{c}").alias(c) for c in fields])


# Deltas.rows of a write that has none, per kind.
NO_ROWS = {kind: pl.DataFrame(schema={**{c: pl.String for c in SERIES}, "time_ns": pl.Int64, "interval_s": pl.Float64,
                                     **{c: CASTS[c] for c in fields}}) for kind, fields in STATE_FIELDS.items()}


def _makes_row(kind: str) -> pl.Expr:
    """Whether a point with deltas is stored: a known interval and, for a histogram, something observed in it
    (as the store's _write_histograms keeps them)."""
    known = pl.col("interval_s").is_not_null()
    return known & (pl.col("_delta_count") > 0) if kind == "histogram" else known


class CumulativeWrites:
    """The DuckDB store's writing of cumulative points; its class provides con, frame() and _registered()."""

    def _cumulative_to_delta(self, frame: pl.DataFrame, kind: str) -> Deltas:
        """Cumulative points of a kind of STATE_FIELDS as per-interval deltas, continuing from the stored state
        of each series; those at or before it are placed among the stored points."""
        fields = STATE_FIELDS[kind]
        if frame.is_empty():
            return Deltas(NO_ROWS[kind])
        state = self._load_state(frame, kind)
        data = frame.select(SERIES + ["start_ns", "time_ns"] + fields).with_columns(is_state=pl.lit(False))
        data = data.join(state.select(SERIES + [pl.col("time_ns").alias("state_ns")]), on=SERIES, how="left")
        behind = pl.col("time_ns") <= pl.col("state_ns").fill_null(-1)
        placed = self._place_behind(data.filter(behind).drop("state_ns", "is_state"), state, kind)
        data = data.filter(~behind).drop("state_ns")
        data = data.unique(subset=SERIES + ["time_ns"], keep="first")
        merged = pl.concat([state.with_columns(is_state=pl.lit(True)).select(data.columns), data])
        merged = with_deltas(merged.sort(SERIES + ["time_ns"]), fields)
        new_state = merged.group_by(SERIES).agg(pl.all().sort_by("time_ns").last()).select(
            SERIES + ["start_ns", "time_ns"] + fields)
        self._save_state(new_state, kind)
        self._keep_resets(merged.filter(pl.col("_reset") & ~pl.col("is_state")), merged, kind)
        fresh = merged.filter(~pl.col("is_state"))
        out = _rows(fresh.filter(pl.col("interval_s").is_not_null()), fields)
        return Deltas(pl.concat([out, placed.rows]), placed.duplicates,
                      len(fresh) - len(out) + placed.without_baseline, placed.recounted)

    def _load_state(self, frame: pl.DataFrame, kind: str) -> pl.DataFrame:
        fields = STATE_FIELDS[kind]
        keys = frame.select(SERIES).unique()
        with self._registered("batch_series", keys):
            state = self.frame(
                f"SELECT s.node, s.metric, s.attributes, s.start_ns, s.time_ns, {', '.join('s.' + f for f in fields)} "
                "FROM cumulative_state s JOIN batch_series USING (node, metric, attributes) WHERE s.kind = ?",
                [kind])
        return state.with_columns(*(pl.col(c).cast(CASTS[c]) for c in ["start_ns", "time_ns"] + fields))

    def _save_state(self, state: pl.DataFrame, kind: str) -> None:
        with self._registered("new_state", state.with_columns(kind=pl.lit(kind))):
            cols = ", ".join(SERIES + ["kind", "start_ns", "time_ns"] + STATE_FIELDS[kind])
            self.con.execute(f"INSERT OR REPLACE INTO cumulative_state ({cols}) SELECT {cols} FROM new_state")

    # --- the running totals kept ----------------------------------------------------------------------

    def _keep_resets(self, resets: pl.DataFrame, points: pl.DataFrame, kind: str) -> None:
        """Keep the running totals of resets (points with deltas) and of the points before them (in points),
        unless kept."""
        if resets.is_empty():
            return
        columns = SERIES + ["start_ns", "time_ns"] + STATE_FIELDS[kind]
        before = resets.filter(pl.col("_prev_time_ns").is_not_null()).select(*SERIES, time_ns="_prev_time_ns").join(
            points.select(columns), on=SERIES + ["time_ns"]).select(columns).with_columns(reset=pl.lit(False))
        self._keep(pl.concat([resets.select(*columns, reset=pl.lit(True)), before]), kind, update=False)

    def _keep(self, points: pl.DataFrame, kind: str, update: bool) -> None:
        """Keep points' running totals; where one is kept already, update says whether its reset flag changes
        (a point's values never do)."""
        if points.is_empty():
            return
        points = points.unique(subset=SERIES + ["time_ns"], keep="first").with_columns(kind=pl.lit(kind))
        cols = ", ".join(SERIES + ["kind", "start_ns", "time_ns", "reset"] + STATE_FIELDS[kind])
        conflict = "DO UPDATE SET reset = excluded.reset" if update else "DO NOTHING"
        with self._registered("kept_points", points):
            self.con.execute(f"INSERT INTO cumulative_points ({cols}) SELECT {cols} FROM kept_points "
                             f"ON CONFLICT {conflict}")

    # --- points behind their series' last stored point ------------------------------------------------
    # There a series is known by its number among the write's late ones (SID): window functions, joins and sorts
    # take it many times faster than its three names.

    def _place_behind(self, behind: pl.DataFrame, state: pl.DataFrame, kind: str) -> Deltas:
        """Points at or before their series' last stored point, placed between their stored neighbours; the
        stored rows after them counted again."""
        if behind.is_empty():  # points in time order: the common case
            return Deltas(NO_ROWS[kind])
        fields = STATE_FIELDS[kind]
        late = behind.with_columns(**{KEY: pl.col("time_ns") // 1000}).unique(subset=SERIES + [KEY], keep="first")
        late = self._not_stored(late, state, kind)
        if late.is_empty():  # copies of stored points (a retried request, a file loaded again)
            return Deltas(NO_ROWS[kind], len(behind))
        bounds = late.group_by(SERIES).agg(first_ns=pl.col("time_ns").min(), last_ns=pl.col("time_ns").max())
        bounds = bounds.with_row_index(SID)
        late = late.join(bounds.select(SID, *SERIES), on=SERIES).drop(SERIES)
        kept = self._load_kept(bounds, kind)
        last = state.join(bounds.select(SID, *SERIES), on=SERIES).select(
            SID, "start_ns", "time_ns", *fields, reset=pl.lit(False))
        context = self._read_back(pl.concat([kept, last]).unique(subset=[SID, "time_ns"], keep="first"), bounds, kind)
        horizon = kept.filter(pl.col("reset").is_null()).group_by(SID).agg(horizon_ns=pl.col("time_ns").max())
        placeable = _apart(late, context).join(horizon, on=SID, how="left").filter(
            pl.col("time_ns") > pl.col("horizon_ns").fill_null(-1))
        columns = [SID, "start_ns", "time_ns", KEY] + fields + ["reset", "_known", "_stored", "_late"]
        placeable = placeable.with_columns(reset=pl.lit(None, pl.Boolean), _known=pl.lit(False),
                                           _stored=pl.lit(False), _late=pl.lit(True)).select(columns)
        merged = pl.concat([context.with_columns(_late=pl.lit(False)).select(columns), placeable])
        merged = with_deltas(merged.sort(SID, "time_ns"), fields, by=[SID]).with_columns(
            _after_late=pl.col("_late").shift(1).over(SID).fill_null(False) & ~pl.col("_late"))

        def named(points: pl.DataFrame) -> pl.DataFrame:
            return points.join(bounds.select(SID, *SERIES), on=SID)

        recounted, added = self._recount(named(merged.filter(pl.col("_after_late"))), kind)
        changed = merged.filter(pl.col("_late") | pl.col("_after_late"))
        self._keep(named(changed.filter(pl.col("_reset") | pl.col("_known")).select(
            SID, "start_ns", "time_ns", *fields, reset=pl.col("_reset"))), kind, update=True)
        resets = changed.filter(pl.col("_reset"))
        before_resets = merged.join(resets.select(SID, time_ns="_prev_time_ns"), on=[SID, "time_ns"], how="semi")
        self._keep_resets(named(resets), named(before_resets), kind)
        placed = merged.filter(pl.col("_late"))
        out = placed.filter(pl.col("interval_s").is_not_null())
        return Deltas(pl.concat([_rows(named(out), fields), added]), len(behind) - len(placeable),
                      len(placed) - len(out), recounted)

    def _not_stored(self, late: pl.DataFrame, state: pl.DataFrame, kind: str) -> pl.DataFrame:
        """late but for the points at the time of their series' last point or of a stored row: the quick way to
        the duplicates, before anything is read back."""
        late = late.join(state.select(*SERIES, **{KEY: pl.col("time_ns") // 1000}), on=SERIES + [KEY], how="anti")
        keys = late.select(*SERIES, KEY, ts=pl.from_epoch(KEY, time_unit="us"))
        with self._registered("late_keys", keys):
            stored = self.frame(
                f"SELECT l.node, l.metric, l.attributes, l.{KEY} FROM {TABLES[kind]} s JOIN late_keys l "
                "USING (node, metric, attributes, ts) WHERE s.ts BETWEEN ? AND ?",
                [keys["ts"].min(), keys["ts"].max()])
        return late.join(stored, on=SERIES + [KEY], how="anti")

    def _load_kept(self, bounds: pl.DataFrame, kind: str) -> pl.DataFrame:
        """The kept points of the series in bounds from the last one before the first late point on, and those
        without a reset flag (the points before which nothing is placed)."""
        fields = STATE_FIELDS[kind]
        with self._registered("late_series", bounds):
            kept = self.frame(
                f"SELECT b.{SID}, p.start_ns, p.time_ns, {', '.join('p.' + f for f in fields)}, p.reset "
                "FROM cumulative_points p JOIN late_series b USING (node, metric, attributes) WHERE p.kind = ? "
                "QUALIFY p.reset IS NULL OR p.time_ns >= coalesce(max(p.time_ns) "
                f"FILTER (WHERE p.time_ns < b.first_ns) OVER (PARTITION BY b.{SID}), b.first_ns)", [kind])
        return kept.with_columns(*(pl.col(c).cast(CASTS[c]) for c in ["start_ns", "time_ns"] + fields))

    def _load_rows(self, window: pl.DataFrame, kind: str) -> pl.DataFrame:
        """The stored deltas (`_d_<field>`) of each series in window between its lo and hi (microseconds)."""
        fields = STATE_FIELDS[kind]
        window = window.with_columns(pl.from_epoch(c, time_unit="us") for c in ("lo", "hi"))
        with self._registered("late_window", window):
            rows = self.frame(
                f"SELECT w.{SID}, epoch_us(s.ts) AS {KEY}, s.interval_s, "
                f"{', '.join(f's.{f} AS _d_{f}' for f in fields)} "
                f"FROM {TABLES[kind]} s JOIN late_window w USING (node, metric, attributes) "
                "WHERE s.ts BETWEEN w.lo AND w.hi AND s.ts BETWEEN ? AND ? AND s.interval_s IS NOT NULL",
                [window["lo"].min(), window["hi"].max()])
        return rows.with_columns(pl.col(SID).cast(pl.UInt32), *(pl.col(f"_d_{c}").cast(CASTS[c]) for c in fields))

    def _read_back(self, known: pl.DataFrame, bounds: pl.DataFrame, kind: str) -> pl.DataFrame:
        """The stored points around the late points of each series in bounds: the known ones (kept, or the last),
        and those with a stored row between the first late point and the first known point after the last one,
        their running totals and times read back from the deltas; and the point before each of them."""
        fields = STATE_FIELDS[kind]
        hi = known.join(bounds, on=SID).filter(pl.col("time_ns") >= pl.col("last_ns")).group_by(SID).agg(
            hi=pl.col("time_ns").min() // 1000)
        window = bounds.join(hi, on=SID).select(SID, *SERIES, lo=pl.col("first_ns") // 1000, hi="hi")
        rows = self._load_rows(window, kind).with_columns(
            _stored=pl.lit(True), _d_time_ns=(pl.col("interval_s") * 1e9).round().cast(pl.Int64))
        known = known.with_columns(**{KEY: pl.col("time_ns") // 1000}, _known=pl.lit(True))
        points = known.join(rows, on=[SID, KEY], how="full", coalesce=True).with_columns(
            pl.col("_known").fill_null(False), pl.col("_stored").fill_null(False)).sort(SID, KEY)
        points = points.with_columns(start_ns=pl.col("start_ns").fill_null(strategy="backward").over(SID),
                                     **{c: _read_backwards(c) for c in fields}, _back_ns=_read_backwards("time_ns"))
        points = points.with_columns(time_ns=_read_times())
        # The point before each stored one whose delta is a plain difference, where it is not the point read
        # back before it (within a microsecond, where times are read back only to it): the one before the first
        # row, or a histogram's interval that added nothing, which has no row.
        plain = pl.col("_stored") & (~pl.col("_known") | ~pl.col("reset").fill_null(True))
        before_key = (pl.col("time_ns") - pl.col("_d_time_ns")) // 1000
        previous_key = pl.col(KEY).shift(1).over(SID)
        before = points.filter(plain & (previous_key.is_null() | (before_key > previous_key + 1))).select(
            SID, "start_ns", time_ns=pl.col("time_ns") - pl.col("_d_time_ns"),
            **{c: pl.col(c) - pl.col(f"_d_{c}") for c in fields}).with_columns(**{KEY: pl.col("time_ns") // 1000})
        columns = [SID, "start_ns", "time_ns", KEY] + fields + ["reset", "_known", "_stored"]
        before = before.with_columns(reset=pl.lit(None, pl.Boolean), _known=pl.lit(False), _stored=pl.lit(False))
        points = pl.concat([points.select(columns), before.select(columns)])
        return pl.concat([points, self._row_before_idle(points, bounds, kind).select(columns)])

    def _row_before_idle(self, points: pl.DataFrame, bounds: pl.DataFrame, kind: str) -> pl.DataFrame:
        """The stored point before a series' first late point, where the points read back may lack it. That is when
        the first stored point after the late one is a histogram's interval that added nothing (no row, no reset):
        the point before the late one has the same running totals, so where the last point read back before it
        has others, a row lies between them. The last such row stands for that point, at its microsecond (the
        points after the row, if any, added nothing: only the late point's interval may start too early)."""
        fields = STATE_FIELDS[kind]
        points = points.join(bounds, on=SID).sort(SID, "time_ns")
        first_after = points.filter(pl.col("time_ns") >= pl.col("first_ns")).group_by(SID).first()
        idle = first_after.filter(~pl.col("_stored") & ~(pl.col("_known") & pl.col("reset").fill_null(True)))
        if idle.is_empty():
            return idle
        last_before = points.filter(pl.col("time_ns") < pl.col("first_ns")).group_by(SID).last().select(
            SID, _before_key=KEY, _before_start=pl.col("start_ns"), _before_first=pl.col(fields[0]))
        idle = idle.join(last_before, on=SID, how="left").filter(
            (pl.col("_before_start") != pl.col("start_ns")) | (pl.col("_before_first") != pl.col(fields[0])))
        if idle.is_empty():
            return idle
        window = idle.select(SID, *SERIES, lo=pl.col("_before_key") + 1, hi=pl.col("first_ns") // 1000 - 1)
        window = window.with_columns(pl.from_epoch(c, time_unit="us") for c in ("lo", "hi"))
        with self._registered("idle_window", window):
            last_rows = self.frame(
                f"SELECT w.{SID}, max(epoch_us(s.ts)) AS {KEY} FROM {TABLES[kind]} s "
                "JOIN idle_window w USING (node, metric, attributes) WHERE s.ts BETWEEN w.lo AND w.hi "
                f"GROUP BY w.{SID}").with_columns(pl.col(SID).cast(pl.UInt32))
        return idle.drop(KEY).join(last_rows, on=SID).with_columns(
            time_ns=pl.col(KEY) * 1000, reset=pl.lit(False), _known=pl.lit(False), _stored=pl.lit(True))

    def _recount(self, after: pl.DataFrame, kind: str) -> tuple[int, pl.DataFrame]:
        """Update or delete the stored rows of the points now after a late one; how many, and the rows of those
        that had none."""
        fields = STATE_FIELDS[kind]
        makes_row = _makes_row(kind)
        update = _rows(after.filter(pl.col("_stored") & makes_row), fields)
        delete = after.filter(pl.col("_stored") & ~makes_row).select(*SERIES, "time_ns")
        table = TABLES[kind]
        match = " AND ".join(f"t.{c} = r.{c}" for c in SERIES) + " AND t.ts = r.ts"
        as_ts = pl.from_epoch("time_ns", time_unit="ns").dt.cast_time_unit("us").alias("ts")
        if not update.is_empty():
            with self._registered("recounted", update.with_columns(as_ts)):
                self.con.execute(f"UPDATE {table} t SET interval_s = r.interval_s, "
                                 f"{', '.join(f'{c} = r.{c}' for c in fields)} FROM recounted r WHERE {match}")
        if not delete.is_empty():
            with self._registered("recounted", delete.with_columns(as_ts)):
                self.con.execute(f"DELETE FROM {table} t USING recounted r WHERE {match}")
        return len(update) + len(delete), _rows(after.filter(~pl.col("_stored") & makes_row), fields)


def _apart(points: pl.DataFrame, others: pl.DataFrame) -> pl.DataFrame:
    """points more than a microsecond from each of others in their series: where a time is read back only to the
    microsecond (_read_times), a point within one of another is that point."""
    near = others.select(SID, KEY)
    near = pl.concat([near, near.with_columns(pl.col(KEY) - 1), near.with_columns(pl.col(KEY) + 1)])
    return points.join(near, on=[SID, KEY], how="anti")


def _read_times() -> pl.Expr:
    """A point's time to the nanosecond where the stored intervals give it: back from the next known point
    (`_back_ns`), else on from the last point whose time is known; where points that are not stored lie on both
    sides (histograms' intervals that added nothing), its time in microseconds."""
    back = pl.col("_back_ns")
    exact = pl.col("_known") | (back // 1000 == pl.col(KEY))
    since = pl.col("_d_time_ns").fill_null(0).cum_sum().over(SID)
    on = (pl.when(exact).then(back - since).fill_null(strategy="forward").over(SID)) + since
    return pl.when(exact).then(back).when(on // 1000 == pl.col(KEY)).then(on).otherwise(pl.col(KEY) * 1000)


def _read_backwards(column: str) -> pl.Expr:
    """A point's running total of column (its time for "time_ns"): the known one where the point is known, else
    the next known one's, less the deltas stored between (`_d_<column>`), over points sorted by series and time."""
    delta = pl.col(f"_d_{column}")
    if column == "buckets":
        parts = [delta.list.get(i, null_on_oob=True).fill_null(0) for i in range(HISTOGRAM_BUCKETS)]
        after = pl.concat_list([p.cum_sum(reverse=True).over(SID) - p for p in parts])
    else:
        after = delta.fill_null(0).cum_sum(reverse=True).over(SID) - delta.fill_null(0)
    # after: the sum of the deltas stored after each point; the known total plus it is the same for every point
    # up to the next known one.
    anchored = pl.when(pl.col("_known")).then(pl.col(column) + after).fill_null(strategy="backward").over(SID)
    return pl.when(pl.col("_known")).then(pl.col(column)).otherwise(anchored - after)
