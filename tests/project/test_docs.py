"""The contract pages in docs/ say what the code does: their tables are the catalog's and the taxonomy's. The README
stays short and links every page of docs/, and no relative link in it, the change log or docs/ leads nowhere."""

import re
from pathlib import Path

from sloscope import catalog, taxonomy

DOCS = Path(__file__).resolve().parents[2] / "docs"


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


ROOT = DOCS.parent
README = ROOT / "README.md"
README_MAX_LINES = 320
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)[^`]*?\1")


def relative_links(page: Path) -> list[str]:
    """The relative link targets of a markdown page, fragments stripped; links in code are not links."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t.split("#", 1)[0] for t in targets
            if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I) and not t.startswith("#")]


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    return [f"{page.relative_to(root)}: {target}"
            for page in pages for target in relative_links(page) if not (page.parent / target).is_file()]


def markdown_pages() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def test_the_readme_stays_short_enough_to_finish():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual belongs in docs/"


def test_every_relative_link_in_the_readme_changelog_and_docs_resolves_to_a_file():
    assert (ROOT / "CHANGELOG.md").is_file()
    assert broken_links(markdown_pages()) == []


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target).resolve() for target in relative_links(README)}
    missing = [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert missing == [], f"README.md's 'Where to read on' does not link {missing}"


def test_the_link_check_finds_a_broken_link_and_skips_urls_anchors_and_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "there.md").write_text("# There\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\n[up](../there.md#a) [gone](gone.md) [web](https://example.com/x.md) [top](#page)\n"
                    "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n[titled](../there.md \"There\")\n")
    assert relative_links(page) == ["../there.md", "gone.md", "../there.md"]
    assert broken_links([page], tmp_path) == ["docs/page.md: gone.md"]
