"""The store interface (analytics/store_api.py): both stores implement all of it, neither derives from the other's
reader, and the stages above analytics reach a store only through it and the opening functions of
analytics/stores.py."""

import ast
import inspect

import pytest

from sloscope.analytics import clickhouse_store, store, stores
from sloscope.analytics.store_api import StoreApi, StoreReader
from sloscope.analytics.stores import open_store
from tests.project.test_architecture import ROOT, modules

# What alerts/, dashboards/ and sampling/ may import of the stores: the interface, and how to open one.
PUBLIC = {
    "sloscope.analytics.store_api": {"StoreApi", "StoreReader"},
    "sloscope.analytics.stores": {"DEFAULT_DB", "DEFAULT_STORE", "PASSWORD_ENV", "StoreURL", "add_store_arguments",
                                  "open_from_args", "open_store", "open_url", "parse_store_url", "recorded_spec",
                                  "refuse_other_files", "store_url"},
    "sloscope.analytics.store": set(),
    "sloscope.analytics.clickhouse_store": set(),
}
ABOVE_THE_STORES = ("alerts", "dashboards", "sampling")


def members(protocol) -> dict[str, object]:
    """The members a protocol declares in its own body: its methods, and its attributes (None) by their
    annotations; not what typing adds to every protocol."""
    found = {name: value for name, value in vars(protocol).items()
             if inspect.isfunction(value) and value.__qualname__.startswith(f"{protocol.__name__}.")}
    return {**found, **dict.fromkeys(vars(protocol).get("__annotations__", {}))}


INTERFACE = {**members(StoreReader), **members(StoreApi)}


def parameters(function) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()]


def assert_implements(thing, protocol) -> None:
    assert isinstance(thing, protocol), [name for name in INTERFACE if not hasattr(thing, name)]
    for name, declared in {**members(StoreReader), **(members(StoreApi) if protocol is StoreApi else {})}.items():
        if declared is not None:  # a method: the same parameters, so that a caller's arguments fit either store
            assert parameters(getattr(type(thing), name)) == parameters(declared), name


def test_the_duckdb_store_and_its_readers_implement_the_interface(tmp_path):
    with open_store(f"duckdb:///{tmp_path}/s.duckdb") as duck:
        assert isinstance(duck, store.Store)
        assert_implements(duck, StoreApi)
        with duck.reading() as reader:
            assert_implements(reader, StoreReader)
        assert_implements(duck.live_reader(), StoreReader)


def test_the_clickhouse_store_implements_the_interface(tmp_path):
    pytest.importorskip("chdb")
    with open_store(f"chdb:///{tmp_path}/ch") as ch:
        assert isinstance(ch, clickhouse_store.ClickHouseStore)
        assert_implements(ch, StoreApi)
        with ch.reading() as reader:
            assert_implements(reader, StoreReader)


def test_the_interface_declares_what_the_readers_use():
    """The members named in analytics/store_api.py's brief: queries, rollups, meta, the spec, reading, the mode."""
    assert {"sql", "frame", "rows", "scalar", "computed", "roll_up", "meta", "spec", "slo_spec", "tier_params",
            "tables", "counters", "read_only", "dialect", "path", "reading", "close"} <= set(INTERFACE)


def test_neither_store_derives_from_the_others_reader():
    duckdb_classes = {store.Reader, store.Store, store.LiveReader}
    assert not set(clickhouse_store.ClickHouseStore.__mro__) & duckdb_classes
    assert clickhouse_store.ClickHouseStore not in store.Store.__mro__
    # What they share lies in neither store's module.
    shared = set(store.Store.__mro__) & set(clickhouse_store.ClickHouseStore.__mro__) - {object}
    assert shared and all(c.__module__ == "sloscope.analytics.store_base" for c in shared)


def imported_names(path, module: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of each import of the file, `import m` as (line, m, "*")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "*") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")[:-node.level] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found += [(node.lineno, f"{target}.{alias.name}", "*") if f"{target}.{alias.name}" in PUBLIC
                          else (node.lineno, target, alias.name)]
    return found


def test_the_stages_above_reach_the_stores_only_through_the_interface_and_the_opening_functions():
    wrong = [f"{path.relative_to(ROOT)}:{line}: {name} from {target}"
             for path, module in modules() if module.partition(".")[2].split(".")[0] in ABOVE_THE_STORES
             for line, target, name in imported_names(path, module)
             if target in PUBLIC and name not in PUBLIC[target]]
    assert not wrong, "imports past the store interface:\n" + "\n".join(wrong)


def test_the_public_names_are_the_ones_the_opening_module_offers():
    assert set(stores.__all__) == PUBLIC["sloscope.analytics.stores"]
    assert all(hasattr(stores, name) for name in stores.__all__)


def test_the_check_sees_a_store_internal(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from sloscope.analytics.store import sql\nfrom sloscope.analytics import clickhouse_store\n")
    found = imported_names(bad, "sloscope.sampling.bad")
    assert [(t, n) for _, t, n in found if t in PUBLIC and n not in PUBLIC[t]] == [
        ("sloscope.analytics.store", "sql"), ("sloscope.analytics.clickhouse_store", "*")]
