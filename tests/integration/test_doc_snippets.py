"""Every shell and Python block of README.md and docs/*.md runs as pasted (issue #22, item 5).

Each page's blocks run in order in a folder of their own holding a copy of the bundled files
(``examples/``, ``tests/resources/``), so a block may use what an earlier block of the same page
wrote. A block that cannot run here carries a marker (``<!-- snippet: skip REASON -->``, see
``tests/resources/doc_snippets.py`` and docs/index.md); any other block that fails fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import PYTHON, SHELL, Snippet, extract, shell_script
from procs import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [s for page in PAGES for s in extract(page, ROOT)]
BLOCK_TIMEOUT_S = 600

pytest.importorskip("rapidocr_onnxruntime", reason="the pages' examples run the bundled graph (usg[ocr])")


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """One folder per page, made when its first block runs: a copy of the bundled files."""
    made: dict[str, Path] = {}

    def get(page: str) -> Path:
        if page not in made:
            d = tmp_path_factory.mktemp(page.replace("/", "_").replace(".md", ""))
            shutil.copytree(ROOT / "examples", d / "examples")
            shutil.copytree(ROOT / "tests" / "resources", d / "tests" / "resources")
            made[page] = d
        return made[page]

    return get


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("USG_CACHE", str(Path.home() / ".cache" / "usg"))
    env["HOME"] = str(workdir)  # nothing a snippet writes under ~ outlives the test
    env["MPLBACKEND"] = "Agg"
    env["NO_COLOR"] = "1"
    return env


def _run(snippet: Snippet, workdir: Path) -> subprocess.CompletedProcess[str]:
    if snippet.lang in PYTHON:
        script = workdir / f"_snippet_{snippet.line}.py"
        script.write_text(snippet.code, encoding="utf-8")
        cmd = [sys.executable, script.name]
    else:
        cmd = ["bash", "-c", shell_script(snippet, free_port())]
    return subprocess.run(
        cmd, cwd=workdir, env=_env(workdir), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.id for s in SNIPPETS])
def test_snippet_runs_as_pasted(snippet: Snippet, workdirs) -> None:
    if snippet.action == "skip":
        pytest.skip(f"marked in the page: {snippet.reason}")
    workdir = workdirs(snippet.page)
    if snippet.action in ("file", "append"):
        target = workdir / snippet.path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a" if snippet.action == "append" else "w", encoding="utf-8") as f:
            f.write(snippet.code)
        return
    if not snippet.runnable:
        return  # yaml, plain output: read, not run
    if snippet.lang in SHELL and shutil.which("bash") is None:
        pytest.skip("needs bash")
    proc = _run(snippet, workdir)
    assert proc.returncode == snippet.exit_code, (
        f"{snippet.id} ({snippet.lang}) exited {proc.returncode}, expected {snippet.exit_code}; if it cannot run "
        f"here, mark it <!-- snippet: skip REASON -->\n--- block ---\n{snippet.code}"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
