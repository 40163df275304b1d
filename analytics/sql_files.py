"""The queries of analytics/sql/ (DuckDB's dialect) and analytics/sql/clickhouse/ (ClickHouse's), as text: what
both stores run, each in its own dialect."""

from __future__ import annotations

import re
from importlib import resources

# A query of the same folder named in double braces, inlined as a subquery: {{signal_steps}} reads with the
# query's own parameters; {{requests start end}} reads the range of its start and end instead of since and until.
RELATION = re.compile(r"\{\{(\w+)(?: (\w+) (\w+))?\}\}")


def sql_of(folder: tuple[str, ...], name: str, reference, instead: dict[str, str] | None = None) -> str:
    """The text of analytics/sql/FOLDER/NAME.sql with its {{relations}} inlined, each relation named in `instead`
    replaced by the one it maps to; reference(p) is how the dialect writes parameter p in a query, for the renaming
    of since and until."""
    text = resources.files("sloscope.analytics").joinpath("sql", *folder, f"{name}.sql").read_text()

    def inlined(match: re.Match) -> str:
        relation, since, until = match.groups()
        body = sql_of(folder, (instead or {}).get(relation, relation), reference, instead)
        if since:
            body = body.replace(reference("since"), reference(since)).replace(reference("until"), reference(until))
        return f"(\n{body}\n)"

    return RELATION.sub(inlined, text)


def sql(name: str, instead: dict[str, str] | None = None) -> str:
    """The text of analytics/sql/NAME.sql, its {{relations}} inlined (those named in `instead` replaced)."""
    return sql_of((), name, lambda parameter: f"${parameter}", instead)


def clickhouse_sql(name: str, instead: dict[str, str] | None = None) -> str:
    """The text of analytics/sql/clickhouse/NAME.sql with its {{relations}} inlined (those named in `instead` by
    the relation it maps them to)."""
    return sql_of(("clickhouse",), name, lambda parameter: "{" + parameter + ":", instead)
