"""The fitted index of the packaged corpus, kept on disk between runs of ``usg doctor logs``.

Fitting the learned layer on the corpus (TF-IDF, the linear SVM, the nearest-case matrices) costs a few
seconds every time the CLI starts; a one-line log took ~6 s, most of it the fit. The fitted
:class:`~usg.doctor.logs.similar.CaseIndex` is pickled under ``$USG_CACHE/doctor/`` (the directory
USG keeps its exported models in), named by a digest of everything the fit depends on: the corpus files,
the source of the modules that fit and use it, and the versions of Python, scikit-learn and numpy. Any
change to one of them is a new file; an unreadable or stale file is refitted and replaced; a cache
that cannot be written only costs the fit.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import tempfile
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from usg.paths import cache_dir

if TYPE_CHECKING:
    from usg.doctor.logs.similar import CaseIndex

__all__ = ["cached_default_index", "index_key"]

_FORMAT = 1  # bump when what is pickled changes shape in a way the source digest would not show


def index_key() -> str:
    """A digest of what the default index depends on: corpus, fitting code, library versions."""
    import numpy

    from usg.doctor.logs import corpus, features, model, similar
    from usg.errors import MissingDependency

    try:
        import sklearn
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependency("scikit-learn", "doctor", "matching log messages against known cases") from exc

    h = hashlib.sha256(f"{_FORMAT}|{sys.version}|{sklearn.__version__}|{numpy.__version__}".encode())
    for module in (corpus, features, model, similar):
        h.update(Path(str(module.__file__)).read_bytes())
    for path in sorted(corpus.CORPUS_DIR.glob("*.jsonl")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def cached_default_index() -> CaseIndex:
    """The default index: loaded from the cache when its digest matches, else fitted and stored."""
    from usg.doctor.logs.similar import CaseIndex

    path = cache_dir() / "doctor" / f"logs-index-{index_key()}.pkl"
    try:
        with path.open("rb") as fh:
            index = pickle.load(fh)
        if isinstance(index, CaseIndex):
            return index
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
        pass  # absent, truncated, or written by other code: fit again
    index = CaseIndex.default()
    _store(path, index)
    return index


def _store(path: Path, index: CaseIndex) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for old in path.parent.glob("logs-index-*.pkl"):  # earlier corpora or code: never read again
            old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".logs-index-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                _Pickler(fh, protocol=pickle.HIGHEST_PROTOCOL).dump(index)
            os.replace(tmp, path)  # readers see the old file or the whole new one, never half of it
        finally:
            Path(tmp).unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, TypeError):
        pass  # a read-only or full cache directory (or an index that cannot be pickled) costs the next run the fit


class _Pickler(pickle.Pickler):
    """Pickles the modules the fitted objects keep a reference to (numpy, scipy.sparse) by name."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, ModuleType):
            return import_module, (obj.__name__,)
        return NotImplemented
