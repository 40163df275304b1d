"""The contract pages in docs/ say what the code does: their tables are the catalog's and the taxonomy's."""

from pathlib import Path

from sloscope import catalog, taxonomy

DOCS = Path(__file__).resolve().parents[1] / "docs"


def catalog_rows() -> list[str]:
    return [f"| `{s.name}` | {s.instrument.value} | `{s.unit}` | {', '.join(f'`{a}`' for a in s.attributes) or '—'} "
            f"| {s.source} | {s.harmful.value} | {s.noise_floor:g} |" for s in catalog.SIGNALS]


def _evidence(e: taxonomy.Evidence) -> str:
    where = f" ({', '.join(f'{k}={v}' for k, v in e.where)})" if e.where else ""
    return f"`{e.signal}`{where}" + (f" {e.feature}" if e.feature != "level" else "")


def taxonomy_rows() -> list[str]:
    return [f"| `{c.id}` | {c.layer} | {', '.join(map(_evidence, c.evidence))} "
            f"| {', '.join(f'`{k}` > {v:g}' for k, v in c.seed_threshold.items()) or '—'} "
            f"| {', '.join(f'`{b}`' for b in c.explained_by) or '—'} | {c.physical} |" for c in taxonomy.CAUSES]


def table_rows(page: str) -> list[str]:
    return [line for line in (DOCS / page).read_text().splitlines() if line.startswith("| `")]


def test_the_catalog_page_lists_every_signal_as_the_catalog_defines_it():
    assert table_rows("catalog.md") == catalog_rows(), "docs/catalog.md's table, as it should read:\n" + \
        "\n".join(catalog_rows())


def test_the_taxonomy_page_lists_every_cause_as_the_taxonomy_defines_it():
    assert table_rows("taxonomy.md") == taxonomy_rows(), "docs/taxonomy.md's table, as it should read:\n" + \
        "\n".join(taxonomy_rows())


def test_every_contract_page_the_architecture_page_links_exists():
    text = (DOCS / "architecture.md").read_text()
    linked = [part.split(")")[0] for part in text.split("](")[1:]]
    assert linked and all((DOCS / page).is_file() for page in linked), linked
