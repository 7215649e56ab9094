"""Real English sentences available offline: the docstrings of the Python standard library.

For calibrating and guarding text encoders where no hub is reachable (tests, benchmarks).
Deterministic: the same modules in the same order give the same sentences.
"""

from __future__ import annotations

import importlib
import re
import sys

__all__ = ["english_sentences"]

_MODULES = (
    "argparse", "asyncio", "base64", "bisect", "calendar", "collections", "concurrent.futures", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions",
    "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.server",
    "imaplib", "inspect", "ipaddress", "itertools", "json", "locale", "logging", "mailbox", "mimetypes",
    "multiprocessing", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "platform",
    "plistlib", "poplib", "pprint", "queue", "random", "re", "sched", "secrets", "selectors", "shelve", "shlex",
    "shutil", "signal", "smtplib", "socket", "socketserver", "sqlite3", "ssl", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "types",
    "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "weakref", "wave", "xml.dom",
    "zipfile", "zoneinfo",
)  # fmt: skip
_SENTENCE = re.compile(r"^[A-Z][A-Za-z0-9 ,;:'()/-]+[.]$")


def _docstrings(module_name: str) -> list[str]:
    try:
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
    except ImportError:
        return []
    out = [module.__doc__ or ""]
    for name in sorted(vars(module)):
        obj = getattr(module, name, None)
        if getattr(obj, "__module__", None) == module_name and not name.startswith("_"):
            out.append(getattr(obj, "__doc__", None) or "")
    return out


def english_sentences(n: int, *, min_chars: int = 30, max_chars: int = 220) -> list[str]:
    """Up to ``n`` distinct sentences (prose, not code) from standard-library docstrings."""
    seen: set[str] = set()
    out: list[str] = []
    for module_name in _MODULES:
        for doc in _docstrings(module_name):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                if min_chars <= len(sentence) <= max_chars and _SENTENCE.match(sentence) and sentence not in seen:
                    seen.add(sentence)
                    out.append(sentence)
                    if len(out) >= n:
                        return out
    return out
