"""MkDocs hook: repository Markdown files outside ``docs/`` that the pages link to become site pages.

The pages link them by their path in the repository (``../benchmarks/README.md``), which works on
a code host and in the repository's link test; on the site such a link points to the included copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
INCLUDED = {"../benchmarks/README.md": "benchmarks.md"}  # link as written in docs/*.md -> site page


def on_files(files: Files, config: Any) -> Files:
    for link, uri in INCLUDED.items():
        source = (ROOT / "docs" / link).resolve()
        files.append(File.generated(config, uri, content=source.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = page.file.src_uri.count("/")
    for link, uri in INCLUDED.items():
        markdown = markdown.replace(f"]({'../' * depth}{link})", f"]({'../' * depth}{uri})")
    return markdown
