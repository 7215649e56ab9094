"""Code blocks of the README and docs/*.md, as the snippet test runs them.

A fenced block is run when its language is a shell (``bash``, ``sh``, ``shell``, ``console``) or
``python``; other blocks (yaml, plain output) are only read. An HTML comment on the last
non-blank line before the fence changes that (see docs/index.md, "Code blocks in these pages"):

    <!-- snippet: skip REASON -->            not run (a GPU, a cluster, installing the project ...)
    <!-- snippet: skip-lines 1,3 REASON -->  run without those lines of the block (1-based)
    <!-- snippet: exit N -->                 the block ends with exit status N (default 0)
    <!-- snippet: file PATH -->              not run: written to PATH, for the page's later blocks
    <!-- snippet: append PATH -->            not run: appended to PATH

In a shell block, a line that starts ``usg serve`` runs in the background until the server is
ready and is stopped (SIGTERM) when the block ends; port 8000 is replaced by a free port.
``console`` blocks run their ``$ `` lines only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PYTHON", "SHELL", "Snippet", "SnippetError", "extract", "shell_script"]

SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)[^\n]*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<action>[\w-]+)\s*(?P<args>.*?)\s*-->\s*$")
_ACTIONS = {"skip", "skip-lines", "exit", "file", "append"}


class SnippetError(ValueError):
    """A marker the test cannot read (unknown action, missing reason or path)."""


@dataclass(frozen=True)
class Snippet:
    page: str  # path of the Markdown file, relative to the repository
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    action: str = "run"  # run, skip, file, append
    reason: str = ""
    path: str = ""  # file / append target
    skip_lines: tuple[int, ...] = ()
    exit_code: int = 0

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.action == "run" and self.lang in SHELL | PYTHON


def _marker(lines: list[str], fence_index: int, where: str) -> tuple[str, str] | None:
    i = fence_index - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i < 0:
        return None
    m = _MARKER.match(lines[i])
    if m is None:
        if lines[i].lstrip().startswith("<!--") and "snippet" in lines[i]:
            raise SnippetError(f"{where}: cannot read the marker {lines[i].strip()!r}; see doc_snippets.py")
        return None
    action, args = m["action"], m["args"]
    if action not in _ACTIONS:
        raise SnippetError(f"{where}: unknown snippet action {action!r}; use one of {sorted(_ACTIONS)}")
    return action, args


def _snippet(page: str, line: int, lang: str, code: str, marker: tuple[str, str] | None) -> Snippet:
    where = f"{page}:{line}"
    if marker is None:
        return Snippet(page, line, lang, code)
    action, args = marker
    if action == "skip":
        if not args:
            raise SnippetError(f"{where}: `snippet: skip` needs a reason (why this block cannot run in the test)")
        return Snippet(page, line, lang, code, "skip", reason=args)
    if action == "skip-lines":
        numbers, _, reason = args.partition(" ")
        try:
            skipped = tuple(int(n) for n in numbers.split(","))
        except ValueError:
            raise SnippetError(f"{where}: `snippet: skip-lines {args}`: not N,M,... followed by a reason") from None
        if not reason.strip():
            raise SnippetError(f"{where}: `snippet: skip-lines` needs a reason after the line numbers")
        return Snippet(page, line, lang, code, "run", reason=reason.strip(), skip_lines=skipped)
    if action == "exit":
        status, _, reason = args.partition(" ")
        if not status.isdigit():
            raise SnippetError(f"{where}: `snippet: exit {args}`: the expected exit status is a number")
        return Snippet(page, line, lang, code, "run", reason=reason.strip(), exit_code=int(status))
    if not args:
        raise SnippetError(f"{where}: `snippet: {action}` needs a file path")
    return Snippet(page, line, lang, code, action, path=args)


def extract(path: Path, root: Path) -> list[Snippet]:
    """Every fenced block of a Markdown file, with its marker applied."""
    page = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line)
            j += 1
        if j == len(lines):
            raise SnippetError(f"{page}:{i + 1}: the code block opened here is never closed")
        marker = _marker(lines, i, f"{page}:{i + 1}")
        out.append(_snippet(page, i + 1, m["lang"].lower(), "\n".join(body) + "\n", marker))
        i = j + 1
    return out


def _logical_lines(code: str) -> list[str]:
    """Lines of a shell block, a backslash continuation joined to its line."""
    out: list[str] = []
    pending = ""
    for raw in code.splitlines():
        if pending:
            raw = pending + "\n" + raw
            pending = ""
        if raw.rstrip().endswith("\\"):
            pending = raw
            continue
        out.append(raw)
    if pending:
        out.append(pending)
    return out


def _console_commands(code: str) -> str:
    return "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"


def shell_script(snippet: Snippet, port: int, *, ready_timeout_s: float = 180.0) -> str:
    """The bash script the test runs for a shell block: ``set -eo pipefail``, skipped lines left
    out, ``usg serve`` lines in the background on ``port`` with a readiness wait."""
    code = _console_commands(snippet.code) if snippet.lang == "console" else snippet.code
    kept = [line for n, line in enumerate(code.splitlines(), 1) if n not in snippet.skip_lines]
    out = ["set -eo pipefail" if snippet.exit_code == 0 else "set -o pipefail", "__usg_pids=()"]
    out.append('trap \'for p in "${__usg_pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" || true; done\' EXIT')
    for line in _logical_lines("\n".join(kept)):
        line = re.sub(r"(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", line)
        if re.match(r"^\s*usg serve\b", line):
            if re.search(r"--port[ =]8000\b", line):
                line = re.sub(r"--port[ =]8000\b", f"--port {port}", line)
            else:
                line = re.sub(r"usg serve\b", f"usg serve --port {port}", line, count=1)
            command = line.split(" #", 1)[0].rstrip()
            out += [
                f"{command} &",
                "__usg_pids+=($!)",
                f"for __i in $(seq {int(ready_timeout_s * 5)}); do",
                f"  curl -sf 127.0.0.1:{port}/v2/health/ready > /dev/null && break",
                '  kill -0 "${__usg_pids[-1]}" 2>/dev/null || { echo "usg serve exited before ready" >&2; exit 97; }',
                "  sleep 0.2",
                "done",
                f"curl -sf 127.0.0.1:{port}/v2/health/ready > /dev/null",
            ]
        else:
            out.append(line)
    return "\n".join(out) + "\n"
