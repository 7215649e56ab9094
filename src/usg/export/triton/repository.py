"""File work of an export: the output folder, model files (copied or linked), model.py files, modules.

Python nodes' modules that are not installed in site-packages (a ``mypkg`` next to the graph,
say) are copied into the version folder of the Triton model that imports them: Triton's Python
backend puts that folder on ``sys.path``. ``usg`` itself must be installed on the server.
"""

from __future__ import annotations

import importlib.util
import ntpath
import os
import posixpath
import shutil
import site
import sysconfig
from collections.abc import Iterable
from pathlib import Path, PurePosixPath, PureWindowsPath

from usg.errors import UsageError

__all__ = [
    "copy_modules",
    "install_file",
    "local_modules",
    "model_files",
    "prepare_out_dir",
    "relative",
    "write_model_py",
]

MODEL_PY = '''"""Triton Python-backend model written by `usg export triton`: {what}.

The work is done by {target} (the server's Python environment needs usg installed);
its settings are the `parameters` of ../config.pbtxt.
"""

from {module} import {cls} as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''


def prepare_out_dir(out: Path, *, force: bool, keep: Iterable[Path] = ()) -> None:
    """Create ``out``; refuse a non-empty one unless ``force``, which empties it first."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"OUT_DIR {str(out)!r} is a file; fix: pass a directory path")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UsageError(
                f"OUT_DIR {str(out)!r} is not empty; fix: pass --force to replace its contents, "
                "or choose a new directory"
            )
        resolved = out.resolve()
        protected = [Path.home().resolve(), Path(resolved.anchor), Path.cwd().resolve()]
        inside = [k for k in keep if k.resolve().is_relative_to(resolved)]
        if resolved in protected or inside:
            what = f"it holds {inside[0]}" if inside else "it is the home, root or current directory"
            raise UsageError(f"refusing to empty OUT_DIR {str(out)!r}: {what}; fix: export into a new directory")
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _external_data(path: Path) -> list[str]:
    """Relative locations of an ONNX file's external tensor data files."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    found: list[str] = []
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location" and entry.value not in found:
                    found.append(entry.value)
    return found


def model_files(src: Path, dst: Path) -> list[tuple[Path, Path]]:
    """The files :func:`install_file` copies for ``src`` → ``dst``: the model and the external data
    files an ONNX file names, each checked (inside the model's folder, present) so that the export can
    refuse a model before it touches OUT_DIR."""
    pairs = [(src, dst)]
    if src.suffix == ".onnx":
        for rel in _external_data(src):
            if _leaves_folder(rel):
                raise UsageError(
                    f"model file {src} names external data at {rel!r}, outside its own folder; the export would "
                    "read and write files outside the model's and the repository's folders (ONNX Runtime refuses "
                    "such a model too); fix: save the model with its external data beside it "
                    "(onnx.save_model(..., save_as_external_data=True, location='NAME.data'))"
                )
            inside = Path(os.path.normpath(rel))
            data = src.parent / inside
            if data.is_symlink() and not _link_allowed(src, data.resolve()):
                raise UsageError(
                    f"model file {src}: its external data {rel!r} is a symbolic link to {data.resolve()}, outside the "
                    "model's folder; the export would copy that file into the repository; fix: put the data file "
                    "itself beside the model (cp --dereference), if that file is really the model's"
                )
            pairs.append((data, dst.parent / inside))
    for s, _ in pairs:
        if not s.is_file():
            raise UsageError(f"model file {s} does not exist; fix: check the graph's model paths")
    return pairs


def _link_allowed(model: Path, target: Path) -> bool:
    """Whether an external-data symlink may be followed: to a file inside the model's own folder, or
    inside a Hugging Face cache's ``blobs/`` (a snapshot's files are links into it:
    ``models--org--name/snapshots/REV/x.data -> ../../blobs/SHA``)."""
    folder = model.resolve().parent
    if target.is_relative_to(folder):
        return True
    for parent in model.absolute().parents:
        if parent.name == "snapshots" and target.is_relative_to((parent.parent / "blobs").resolve()):
            return True
    return False


def _leaves_folder(rel: str) -> bool:
    """A location that is absolute, on a drive, empty or climbs out, read as a POSIX or a Windows path
    (a model saved on Windows names 'sub\\w.data'; '..\\w.data' and 'C:w.data' leave the folder there)."""
    for flavour, norm in ((PurePosixPath, posixpath.normpath), (PureWindowsPath, ntpath.normpath)):
        p = flavour(norm(rel))
        if p.anchor or not p.parts or p.parts[0] == "..":
            return True
    return False


def install_file(src: Path, dst: Path, *, link: bool, pairs: list[tuple[Path, Path]] | None = None) -> None:
    """Copy (or symlink) a model file to ``dst``, with the external data files an ONNX file names
    (``pairs``: :func:`model_files`, when the caller checked them already)."""
    for s, d in model_files(src, dst) if pairs is None else pairs:
        d.parent.mkdir(parents=True, exist_ok=True)
        if link:
            d.symlink_to(s.resolve())
        else:
            shutil.copy2(s, d)


def write_model_py(version_dir: Path, cls: str, what: str, module: str = "usg.export.triton.python_models") -> None:
    version_dir.mkdir(parents=True, exist_ok=True)
    text = MODEL_PY.format(what=what, target=f"{module}.{cls}", module=module, cls=cls)
    (version_dir / "model.py").write_text(text, encoding="utf-8")


def _installed_roots() -> list[Path]:
    paths = [*site.getsitepackages(), site.getusersitepackages()]
    paths += [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    return [Path(p).resolve() for p in paths if p]


def local_modules(refs: Iterable[str]) -> list[Path]:
    """Top-level modules/packages of ``module:function`` refs that are not installed (nor usg)."""
    roots = _installed_roots()
    found: list[Path] = []
    for top in sorted({ref.partition(":")[0].split(".")[0] for ref in refs} - {"usg"}):
        spec = importlib.util.find_spec(top)
        if spec is None or (spec.origin in (None, "built-in", "frozen") and not spec.submodule_search_locations):
            continue
        locations = list(spec.submodule_search_locations or [])
        path = Path(locations[0]) if locations else Path(str(spec.origin))
        if any(path.resolve().is_relative_to(r) for r in roots):
            continue
        found.append(path)
    return found


def copy_modules(paths: Iterable[Path], version_dir: Path) -> None:
    for path in paths:
        dst = version_dir / path.name
        if path.is_dir():
            shutil.copytree(path, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
        else:
            shutil.copy2(path, dst)


def relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()
