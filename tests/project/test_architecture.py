"""The rules of docs/architecture.md: a module imports only its own package and lower floors, and reads each
grammar through floor 0."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STAGES = {"probes": 1, "simulator": 1, "edge": 1, "collectors": 2, "receiver": 2, "enrich": 3,
          "analytics": 4, "alerts": 5, "sampling": 6, "dashboards": 6, "live": 6, "commands": 7}
# Installed names: sloscope/ is the package `sloscope` (floor 0, the contracts), and each stage folder at the
# repository's top level is its subpackage (analytics/ is `sloscope.analytics`), as setup.py maps them.
FLOORS = {"sloscope": 0, **{f"sloscope.{stage}": floor for stage, floor in STAGES.items()}}


def package_of(module: str) -> str:
    """The longest FLOORS key that is module or a parent of it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FLOORS:
            return ".".join(parts[:n])
    raise KeyError(module)


def against_the_rule(own: str, other: str) -> bool:
    """Whether package `own` may not import package `other`: it is a floor up, or another package of one floor."""
    return FLOORS[other] > FLOORS[own] or (FLOORS[other] == FLOORS[own] and other != own)


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".")[:-node.level] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            # `from sloscope import catalog`: the names may be modules, each on its own floor
            found += [(node.lineno, f"{target}.{alias.name}" if f"{target}.{alias.name}" in FLOORS else target)
                      for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in {p.split(".")[0] for p in FLOORS}
            or name.split(".")[0] in STAGES]


def modules():
    for folder in ("sloscope", *STAGES):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield path, ".".join(parts if folder == "sloscope" else ("sloscope", *parts))


def test_no_import_goes_up_a_floor():
    wrong = []
    for path, module in modules():
        own = package_of(module)
        for line, name in imports(path, module):
            other = package_of(name)
            if against_the_rule(own, other):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {own} (floor {FLOORS[own]}) imports {name} "
                             f"(floor {FLOORS[other]})")
    assert not wrong, "imports against docs/architecture.md:\n" + "\n".join(wrong)


def test_every_module_has_a_floor():
    assert all(package_of(module) for _, module in modules())


def test_every_import_names_the_installed_package():
    """`analytics.store` does not exist once installed: every import of a stage goes through `sloscope.`."""
    bare = [f"{path.relative_to(ROOT)}:{line}: {name}" for path, module in modules()
            for line, name in imports(path, module) if name.split(".")[0] in STAGES]
    assert not bare, "imports outside the sloscope namespace:\n" + "\n".join(bare)


def test_the_rule_sees_an_upward_import(tmp_path):
    """The check itself: a function-level import of analytics from collectors is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sloscope.analytics.store import Store\n")
    (line, name), = imports(bad, "sloscope.collectors.bad")
    assert (line, package_of(name)) == (2, "sloscope.analytics")
    assert FLOORS["sloscope.analytics"] > FLOORS["sloscope.collectors"]


def test_the_rule_sees_a_sideways_import(tmp_path):
    """Packages of one floor do not import each other: the edge, beside the probes, does not read them."""
    bad = tmp_path / "bad.py"
    bad.write_text("from sloscope.probes.base import Probe\n")
    (_, name), = imports(bad, "sloscope.edge.bad")
    assert against_the_rule("sloscope.edge", package_of(name))
    assert not against_the_rule("sloscope.edge", "sloscope.edge")


def test_alerts_and_receiver_share_only_the_edge():
    """The Alertmanager webhook and the OTLP servers both stand on sloscope.edge: neither imports the other (the
    floors forbid it one way only)."""
    crossing = [f"{path.relative_to(ROOT)}:{line}: {module} imports {name}" for path, module in modules()
                for line, name in imports(path, module)
                if {package_of(module), package_of(name)} == {"sloscope.alerts", "sloscope.receiver"}]
    assert not crossing, "alerts and receiver import each other:\n" + "\n".join(crossing)


def test_times_are_read_by_sloscope_times_alone():
    """Each grammar once: an RFC 3339 time is parsed by sloscope/times.py, whichever module it reaches."""
    parsing = re.compile(r"\b(fromisoformat|strptime)\(")
    readers = [f"{path.relative_to(ROOT)}:{n}" for path, module in modules() if module != "sloscope.times"
               for n, line in enumerate(path.read_text().splitlines(), 1) if parsing.search(line)]
    assert not readers, "times parsed outside sloscope/times.py:\n" + "\n".join(readers)
