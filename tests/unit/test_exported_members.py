"""The public API is curated: everything in __all__ exists, is sorted, and nothing private leaks."""

import subprocess
import sys
import types

import usg


def test_all_is_sorted_and_complete():
    assert usg.__all__ == sorted(usg.__all__)
    for name in usg.__all__:
        assert hasattr(usg, name), name
    # subpackages become attributes once imported; every other public name is exported on purpose
    public = {n for n in dir(usg) if not n.startswith("_") and not isinstance(getattr(usg, n), types.ModuleType)}
    assert public == set(usg.__all__)


def test_import_usg_does_not_pull_heavy_runtimes():
    code = (
        "import sys, usg; print(' '.join(m for m in ('onnxruntime', 'torch', 'starlette', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
