"""Python callables named in graph files: ``package.module:function``, and the keywords they take.

Ground floor (imports nothing of USG): graph validation, the executor, the Ray replicas and
the Triton export all resolve ``fn:`` references with it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["accepted_params", "import_callable"]


def _add_graph_dir(module_name: str, search_dir: Path | None) -> bool:
    """Put ``search_dir`` (a graph file's folder) on ``sys.path`` when the module lives there."""
    top = module_name.split(".")[0]
    if search_dir is None or not ((search_dir / f"{top}.py").is_file() or (search_dir / top).is_dir()):
        return False
    if str(search_dir) not in sys.path:
        sys.path.append(str(search_dir))  # appended: an installed package of the same name wins
    importlib.invalidate_caches()
    return True


def import_callable(ref: str, search_dir: Path | None = None) -> Callable[..., Any]:
    """Import ``package.module:function``; raise ValueError with the fix when it cannot.

    ``search_dir`` (the graph file's folder) is where a module next to the graph is found:
    it is added to the import path when the module is not importable otherwise.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"fn {ref!r} is not of the form 'package.module:function'")
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name) or not _add_graph_dir(module_name, search_dir):
                raise
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and not module_name.startswith(exc.name):  # the module's own import failed
            raise ValueError(
                f"fn {ref!r}: module {module_name!r} cannot be imported: it needs {exc.name!r}, which is "
                f"not installed; fix: install the package that provides {exc.name!r}"
            ) from exc
        where = f" (looked next to the graph in {search_dir})" if search_dir is not None else ""
        raise ValueError(
            f"fn {ref!r}: module {module_name!r} cannot be imported ({exc}){where}; "
            f"fix: put {module_name.split('.')[0]}.py next to the graph file (its folder is on the import "
            "path for its nodes), install the package that provides it, or add its folder to PYTHONPATH"
        ) from exc
    except Exception as exc:  # the module's own code failed while importing: not a USG error
        raise ValueError(
            f"fn {ref!r}: importing module {module_name!r} raised {type(exc).__name__}: {exc}; "
            "fix that module (its top-level code runs on import)"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            names = sorted(
                n
                for n in dir(target)
                if not n.startswith("_")
                and callable(getattr(target, n))
                and getattr(getattr(target, n), "__module__", None) == module_name
            )
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(
                f"fn {ref!r}: {module_name!r} has no attribute {part!r}; {hint}it defines: {', '.join(names[:20])}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"fn {ref!r} is a {type(target).__name__}, not a callable")
    return target  # type: ignore[no-any-return,unused-ignore]


def accepted_params(func: Callable[..., Any]) -> tuple[set[str], bool]:
    """Keyword names ``func`` accepts, and whether it takes ``**kwargs``."""
    sig = inspect.signature(func)
    names = {p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return names, var_kw
