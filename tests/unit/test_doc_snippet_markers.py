"""The docs' code-block markers parse, and the snippet runner's shell transform does what docs/index.md says."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_snippets import Snippet, SnippetError, extract, shell_script

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_marker_in_the_pages_parses(page: Path) -> None:
    snippets = extract(page, ROOT)
    for s in snippets:
        if s.action == "skip" or s.skip_lines:
            assert s.reason, s.id


def test_readme_runs_its_main_job_and_skips_set_up_and_the_suite() -> None:
    first = extract(ROOT / "README.md", ROOT)[0]
    assert first.lang == "bash" and first.skip_lines == (1, 3)
    script = shell_script(first, 9999)
    assert "usg run examples/document_ocr/graph.yaml" in script
    assert "pip install" not in script and "python -m pytest" not in script


def _page(tmp_path: Path, text: str) -> list[Snippet]:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    return extract(page, tmp_path)


def test_markers_and_languages(tmp_path: Path) -> None:
    snippets = _page(
        tmp_path,
        "<!-- snippet: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
        "<!-- snippet: file det.yaml -->\n\n```yaml\nname: det\n```\n"
        "```console\n$ usg --help\nUsage: usg\n```\n"
        "  ```python\n  print(1)\n  ```\n"
        "<!-- snippet: exit 1 the log holds errors -->\n```sh\nusg doctor logs x.log\n```\n",
    )
    assert [(s.lang, s.action) for s in snippets] == [
        ("bash", "skip"),
        ("yaml", "file"),
        ("console", "run"),
        ("python", "run"),
        ("sh", "run"),
    ]
    assert snippets[0].reason == "needs a GPU" and not snippets[0].runnable
    assert snippets[1].path == "det.yaml" and snippets[1].code == "name: det\n"
    assert snippets[3].code == "print(1)\n" and snippets[3].line == 15
    assert snippets[4].exit_code == 1
    console = shell_script(snippets[2], 1)
    assert "usg --help" in console and "Usage: usg" not in console


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("<!-- snippet: skip -->", "needs a reason"),
        ("<!-- snippet: skipp typo -->", "unknown snippet action 'skipp'"),
        ("<!-- snippet: skip-lines a,b why -->", "not N,M"),
        ("<!-- snippet: file -->", "needs a file path"),
        ("<!-- snippet skip no colon -->", "cannot read the marker"),
    ],
)
def test_a_bad_marker_is_an_error_naming_the_page_and_line(tmp_path: Path, marker: str, message: str) -> None:
    with pytest.raises(SnippetError, match=rf"page\.md:2: .*{message}"):
        _page(tmp_path, f"{marker}\n```bash\necho\n```\n")


def test_an_unclosed_block_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SnippetError, match=r"page\.md:1: the code block opened here is never closed"):
        _page(tmp_path, "```bash\necho\n")


def test_usg_serve_runs_in_the_background_on_the_given_port(tmp_path: Path) -> None:
    (s,) = _page(
        tmp_path,
        "```bash\nusg serve g.yaml --port 8000 --max-inflight 4\ncurl -s localhost:8000/metrics | grep x\n"
        "usg serve g.yaml --index i.idx   # + POST /v1/search\n```\n",
    )
    script = shell_script(s, 4321)
    assert "usg serve g.yaml --port 4321 --max-inflight 4 &" in script
    assert "curl -s localhost:4321/metrics | grep x" in script
    assert "usg serve --port 4321 g.yaml --index i.idx &" in script  # the comment is dropped, not the port
    assert script.count("/v2/health/ready") == 4 and "8000" not in script
    assert script.startswith("set -eo pipefail")


def test_skip_lines_leave_out_those_lines_only(tmp_path: Path) -> None:
    text = "<!-- snippet: skip-lines 2 no server here -->\n```bash\necho a\ntritonserver\necho b\n```\n"
    (s,) = _page(tmp_path, text)
    script = shell_script(s, 1)
    assert "echo a" in script and "echo b" in script and "tritonserver" not in script


def test_readme_three_commands_are_what_ci_runs() -> None:
    """The README's set-up, main job and tests are .ci/run's steps 1, 2 and 4 (CI adds --quiet and --json)."""
    setup, main_job, tests = extract(ROOT / "README.md", ROOT)[0].code.splitlines()
    ci = [line.replace(" --quiet", "") for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert setup.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert "python3 -m venv .venv" in ci and ". .venv/bin/activate" in ci
    assert setup.split(" && ")[-1].replace("pip install", "python -m pip install") in ci
    assert any(line.startswith(main_job + " --json ") for line in ci), main_job
    assert tests in ci
