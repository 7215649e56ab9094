"""Resolve model paths: ``pkg://package/relative/path``, ``${VAR:-default}``, ``~`` and graph-relative paths."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

__all__ = ["PathResolutionError", "cache_dir", "resolve_path"]

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class PathResolutionError(ValueError):
    def __init__(self, message: str, fix: str) -> None:
        self.fix = fix
        super().__init__(message)


def cache_dir() -> Path:
    """Where USG keeps generated artifacts (exported ONNX models): ``$USG_CACHE`` or ``~/.cache/usg``."""
    return Path(os.environ.get("USG_CACHE") or Path.home() / ".cache" / "usg")


def _expand_env(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "USG_CACHE" and not os.environ.get(name):
            return str(cache_dir())
        value = os.environ.get(name)
        if value:
            return value
        if default is not None:
            return default
        state = "is set but empty" if name in os.environ else "is not set"
        raise PathResolutionError(
            f"environment variable ${{{name}}} {state}",
            f"export {name}=... or write ${{{name}:-default}} in the graph",
        )

    return _ENV.sub(sub, text)


_MAX_PATH = 4096  # PATH_MAX on Linux
_MAX_NAME = 255  # NAME_MAX: one path component


def _check_text(raw: str, text: str) -> None:
    shown = raw if len(raw) <= 80 else f"{raw[:60]}... ({len(raw)} characters)"
    if "\x00" in text:
        raise PathResolutionError(f"path {shown!r} contains a NUL character", "write the file's path without it")
    longest = max((len(part) for part in text.split("/")), default=0)
    if len(text) > _MAX_PATH or longest > _MAX_NAME:
        raise PathResolutionError(
            f"path {shown!r} is too long ({len(text)} characters, longest name {longest}; "
            f"the limits are {_MAX_PATH} and {_MAX_NAME})",
            "write the model file's real path",
        )


def resolve_path(raw: str, base_dir: Path | None) -> Path:
    """Turn a path as written in a graph file into an absolute path (which may not exist)."""
    text = os.path.expanduser(_expand_env(str(raw)))
    _check_text(str(raw), text)
    if text.startswith("pkg://"):
        rest = text[len("pkg://") :]
        package, _, rel = rest.partition("/")
        if not package or not rel:
            raise PathResolutionError(f"{raw!r} is not a package path", "write pkg://PACKAGE/relative/path/in/package")
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError) as exc:  # a dotted name whose parent is missing, a relative name
            raise PathResolutionError(
                f"package {package!r} named by {raw!r} cannot be found ({exc})",
                "write pkg://PACKAGE/relative/path with an installed package's import name, e.g. pkg://rapidocr_onnxruntime/...",
            ) from None
        if spec is None or not spec.submodule_search_locations:
            raise PathResolutionError(
                f"package {package!r} named by {raw!r} is not installed",
                f"pip install {package.replace('_', '-')}",
            )
        root = Path(next(iter(spec.submodule_search_locations)))
        return _resolved(raw, root / rel)
    path = Path(text)
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return _resolved(raw, path)


def _resolved(raw: str, path: Path) -> Path:
    """``path.resolve()``; a symlink loop on the way is a PathResolutionError, not a RuntimeError."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:  # Python < 3.13 raises RuntimeError for a loop, 3.13 OSError
        raise PathResolutionError(
            f"path {raw!r} cannot be resolved: {exc}", "fix the symbolic links on the way (one points back to itself)"
        ) from None
