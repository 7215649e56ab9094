"""README.md and the docs site's pages: relative links resolve, and the command table is complete."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from usg.cli import _COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _relative_links(page: Path) -> list[str]:
    links = _LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"^([a-z][a-z0-9+.-]*:|#)", link)]


def test_the_pages_exist():
    assert (ROOT / "mkdocs.yml").is_file()
    assert {p.name for p in PAGES} >= {"README.md", "index.md", "quickstart.md", "graph.md", "serving.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page):
    missing = [link for link in _relative_links(page) if not (page.parent / link.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_link_pattern_finds_links_and_skips_code():
    page = "see [a](a.md#x), ![p](img/p.svg), [web](https://x.org), [top](#t)\n"
    page += "```\n[no](code.md)\n```\n`[no](inline.md)`"
    assert _LINK.findall(_prose(page)) == ["a.md#x", "img/p.svg", "https://x.org", "#t"]


def test_readme_command_table_lists_every_command():
    readme = ROOT / "README.md"
    table = [line for line in readme.read_text(encoding="utf-8").splitlines() if line.startswith("| `usg ")]
    named = {line.split("`usg ", 1)[1].split()[0].rstrip("`") for line in table}
    assert set(_COMMANDS) <= named, f"README.md's command table lacks: {sorted(set(_COMMANDS) - named)}"
