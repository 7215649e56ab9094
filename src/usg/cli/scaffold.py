"""``usg init``'s logic: a runnable graph, a pre-processing stub and sample inputs for one ONNX model.

:func:`inspect_onnx` reads the model's inputs and outputs (names, dtypes, dims) without
loading its weights; :func:`classify` decides which graph input feeds each model input
(an image, a text through a tokenizer, or a tensor); :func:`write_scaffold` writes the
graph YAML, a Python module with the pre-processing stub next to it (the graph's folder
is on the import path of its nodes) and one sample input per graph input.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from usg.errors import InputError, UsageError

__all__ = ["KINDS", "ModelPort", "Scaffold", "classify", "inspect_onnx", "write_scaffold"]

KINDS = ("image", "text", "tensor")
_TEXT_PORTS = ("input_ids", "attention_mask", "token_type_ids")
Dim = int | str | None


@dataclass(frozen=True)
class ModelPort:
    name: str
    dtype: str  # numpy dtype name
    dims: tuple[Dim, ...]


@dataclass
class Scaffold:
    """What ``usg init`` wrote: the graph file, the ops module (if any), and the sample inputs."""

    graph: Path
    ops: Path | None
    samples: dict[str, str] = field(default_factory=dict)  # graph input -> value for `usg run -i`

    def run_command(self) -> str:
        args = " ".join(f"-i {name}={_quote(value)}" for name, value in self.samples.items())
        return f"usg run {_quote(str(self.graph))} {args}"


def _quote(text: str) -> str:
    return shlex.quote(text)


def _ident(text: str) -> str:
    out = re.sub(r"\W+", "_", text).strip("_") or "x"
    return out if not out[0].isdigit() else f"m_{out}"


def inspect_onnx(path: Path) -> tuple[list[ModelPort], list[ModelPort], dict[str, int]]:
    """(inputs, outputs, vocab size per int input that indexes an embedding table) of an ONNX file."""
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends: the file is not a model
        raise InputError(
            f"cannot read {path} as an ONNX model ({type(exc).__name__}: {exc})",
            field="MODEL",
            fix="pass an .onnx file; `usg doctor FILE` says what is wrong with it",
        ) from None
    inits = {t.name: tuple(t.dims) for t in model.graph.initializer}

    def ports(values: Any) -> list[ModelPort]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)).name
            dims: tuple[Dim, ...] = tuple(
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
            )
            out.append(ModelPort(v.name, dtype, dims))
        return out

    vocab: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in inits:
            vocab.setdefault(node.input[1], int(inits[node.input[0]][0]))
    return ports(model.graph.input), ports(model.graph.output), vocab


def _image_layout(p: ModelPort) -> str | None:
    if not p.dtype.startswith("float") or len(p.dims) != 4:
        return None
    if p.dims[1] in (1, 3):
        return "NCHW"
    if p.dims[3] in (1, 3):
        return "NHWC"
    return None


def classify(inputs: list[ModelPort], overrides: dict[str, str]) -> dict[str, str]:
    """Model input -> ``image``, ``text`` or ``tensor`` (``overrides`` win; bad ones are a UsageError)."""
    names = {p.name for p in inputs}
    for name, given in overrides.items():
        if name not in names:
            raise UsageError(f"--input-kind {name}={given}: the model has no input {name!r}; fix: use {sorted(names)}")
        if given not in KINDS:
            raise UsageError(f"--input-kind {name}={given}: unknown kind; fix: use one of {', '.join(KINDS)}")
    kinds: dict[str, str] = {}
    for p in inputs:
        kind = overrides.get(p.name)
        if kind is None:
            if _image_layout(p):
                kind = "image"
            elif p.name in _TEXT_PORTS and p.dtype in ("int64", "int32") and len(p.dims) == 2:
                kind = "text"
            else:
                kind = "tensor"
        if kind == "image" and _image_layout(p) is None:
            raise UsageError(
                f"--input-kind {p.name}=image: {p.name} is {p.dtype}{list(p.dims)}, not a float NCHW/NHWC image; "
                "fix: declare it a tensor"
            )
        if kind == "text" and (p.dtype not in ("int64", "int32") or len(p.dims) != 2):
            raise UsageError(
                f"--input-kind {p.name}=text: {p.name} is {p.dtype}{list(p.dims)}, not int [batch, seq]; "
                "fix: declare it a tensor"
            )
        kinds[p.name] = kind
    return kinds


def _sample_dims(dims: tuple[Dim, ...]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else (1 if i == 0 else 8) for i, d in enumerate(dims))


#: a sample larger than this (values, or bytes: a STRING sample's text takes 76 bytes a value) is not
#: generated: the model's declared shape is checked first
MAX_SAMPLE_VALUES = 1 << 26
MAX_SAMPLE_BYTES = 1 << 29
_SAMPLE_TEXT = "hello from usg init"


def _check_sample_size(p: ModelPort) -> None:
    shape = _sample_dims(p.dims)
    n = math.prod(shape)
    dtype = np.dtype(f"<U{len(_SAMPLE_TEXT)}") if p.dtype == "object" else np.dtype(p.dtype)
    size = n * max(dtype.itemsize, np.dtype(np.float32).itemsize)  # floats are drawn as float32 first
    if n > MAX_SAMPLE_VALUES or size > MAX_SAMPLE_BYTES:
        raise InputError(
            f"model input {p.name!r} declares the shape {list(p.dims)}: a sample would hold {n:,} values "
            f"({size / 2**30:.1f} GiB), past the {MAX_SAMPLE_VALUES:,} values or {MAX_SAMPLE_BYTES // 2**20} MiB "
            "usg init writes",
            field=p.name,
            fix="check the model's declared input shape (usg doctor MODEL); export it with dynamic axes if they "
            "are meant to vary",
        )


def _image_geometry(p: ModelPort) -> tuple[int, int, int, str]:
    """(channels, fixed height or 0, fixed width or 0, layout)."""
    layout = _image_layout(p) or "NCHW"
    c, h, w = (p.dims[1], p.dims[2], p.dims[3]) if layout == "NCHW" else (p.dims[3], p.dims[1], p.dims[2])
    fixed = [d if isinstance(d, int) and d > 0 else 0 for d in (c, h, w)]
    return fixed[0] or 3, fixed[1], fixed[2], layout


_OPS_HEAD = '''"""Pre-processing for {graph} (written by `usg init`): edit these stubs for your model.

Each function is a graph node: called with its input ports as keyword arguments, it returns
a dict with one array per output port. This module lies next to the graph file, whose folder
is on the import path for the graph's nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
'''

_IMAGE_FN = '''

def {fn}(image: np.ndarray) -> dict[str, Any]:
    """uint8 [H, W, 3] RGB (as USG decodes images) -> {dtype} {layout} with a batch axis, for input {port!r}.

    Stub: resizes to {size_doc}, scales to [0, 1]. Replace it with your model's resize and
    normalisation (mean / std, BGR order, letterboxing ...).
    """
    from PIL import Image

    height, width = {height}, {width}  # 0: the model accepts any size on that axis
    multiple = 32  # free sizes are rounded to a multiple of 32, which most CNN backbones need
    h, w = image.shape[:2]
    if height and not width:
        width = max(multiple, round(w * height / h / multiple) * multiple)
    elif width and not height:
        height = max(multiple, round(h * width / w / multiple) * multiple)
    elif not height and not width:
        height, width = (max(multiple, round(v / multiple) * multiple) for v in (h, w))
    pixels = Image.fromarray(image).convert("{mode}").resize((width, height), Image.Resampling.BILINEAR)
    x = np.asarray(pixels, dtype=np.float32).reshape(height, width, {channels}) / 255.0
    {transpose}
    return {{"{port_id}": np.ascontiguousarray(x[None]).astype(np.{dtype})}}
'''

_TEXT_FN = '''

def {fn}(text: str) -> dict[str, Any]:
    """Stub tokenizer for inputs {ports}: one id per UTF-8 byte (below the vocabulary size {vocab}).

    Replace it with your model's tokenizer — or give `usg init --tokenizer tokenizer.json` to use
    USG's tokenizer backend instead of this function.
    """
    max_length = {max_length}
    ids = [1 + b % ({vocab} - 1) for b in text.encode("utf-8")][:max_length] or [1]
    input_ids = np.array([ids], dtype=np.{dtype})
    return {{{returns}}}
'''


# (height, width, fix height, fix width) tried on a model whose image axes are free: the first
# size it runs on is written into the stub (PP-OCR's rec, say, takes any width but only height 48)
_PROBES = ((96, 320, False, False), (48, 320, True, False), (32, 320, True, False), (224, 224, True, True))


def probe_image_size(model_path: Path, p: ModelPort) -> tuple[int, int] | None:
    """(fixed height or 0, fixed width or 0) the model runs with, found by running it; None if none ran."""
    import onnxruntime as ort

    channels, height, width, layout = _image_geometry(p)
    if height and width:
        return height, width
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # failed probes are expected: keep ONNX Runtime's error log quiet
    try:
        session = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    except Exception:
        return None
    for h, w, fix_h, fix_w in _PROBES:
        hh, ww = height or h, width or w
        shape = (1, channels, hh, ww) if layout == "NCHW" else (1, hh, ww, channels)
        try:
            session.run(None, {p.name: np.zeros(shape, dtype=p.dtype)})
        except Exception:
            continue
        return (hh if (fix_h or height) else 0), (ww if (fix_w or width) else 0)
    return None


def _image_stub(fn: str, p: ModelPort, size: tuple[int, int] | None) -> str:
    channels, height, width, layout = _image_geometry(p)
    if size is not None:
        height, width = size
    size_doc = f"{height}x{width}" if height and width else "the model's fixed axes (free axes: multiples of 32)"
    transpose = "x = x.transpose(2, 0, 1)  # HWC -> CHW" if layout == "NCHW" else "# the model takes HWC"
    return _IMAGE_FN.format(
        fn=fn,
        dtype=p.dtype,
        layout=layout,
        port=p.name,
        port_id=p.name,
        size_doc=size_doc,
        height=height,
        width=width,
        mode="L" if channels == 1 else "RGB",
        channels=channels,
        transpose=transpose,
    )


def _text_stub(fn: str, ports: list[ModelPort], vocab: int, max_length: int) -> str:
    values = {
        "input_ids": "input_ids",
        "attention_mask": "np.ones_like(input_ids)",
        "token_type_ids": "np.zeros_like(input_ids)",
    }
    returns = ", ".join(f'"{p.name}": {values.get(p.name, "input_ids")}' for p in ports)
    return _TEXT_FN.format(
        fn=fn,
        ports=", ".join(p.name for p in ports),
        vocab=vocab,
        max_length=max_length,
        dtype=ports[0].dtype,
        returns=returns,
    )


def _fixed_len(ports: list[ModelPort]) -> int:
    seq = ports[0].dims[1]
    return seq if isinstance(seq, int) and seq > 0 else 128


def _write_sample_image(path: Path, size: tuple[int, int] | None) -> None:
    from PIL import Image

    height, width = size or (0, 0)
    height, width = height or 96, width or 320
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), (xx + yy) % 256], axis=-1)
    Image.fromarray(rgb.astype(np.uint8)).save(path)


def _check_free(paths: list[Path], force: bool) -> None:
    taken = [str(p) for p in paths if p.exists()]
    if taken and not force:
        raise UsageError(f"{', '.join(taken)} already exist(s); fix: pass --force to overwrite, or another --name")


def _make_dir(path: Path) -> None:
    """Create ``path`` (and ``--dir``) or say which --dir to pass: a --dir under a file, or one this
    user cannot create, was an internal error (NotADirectoryError, PermissionError)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--dir {path.parent}: cannot create {path} ({exc.strerror or type(exc).__name__}); "
            "fix: pass a --dir that is a folder you can write to (it is created if missing)"
        ) from None


class _Writer:
    """Builds the graph document, the ops module and the samples, one model input kind at a time."""

    def __init__(self, model_path: Path, graph_path: Path, sample_dir: Path, ident: str, n_inputs: int) -> None:
        self.model_path, self.graph_path, self.sample_dir, self.ident = model_path, graph_path, sample_dir, ident
        self.n_inputs = n_inputs
        self.inputs: dict[str, Any] = {}
        self.models: dict[str, Any] = {}
        self.nodes: dict[str, Any] = {}
        self.wiring: dict[str, str] = {}
        self.samples: dict[str, str] = {}
        self.ops_src = _OPS_HEAD.format(graph=graph_path.name)

    def image(self, p: ModelPort, gin: str) -> None:
        node = f"pre_{_ident(p.name)}"
        self.inputs[gin] = {"modality": "image"}
        self.nodes[node] = {"fn": f"{self.ident}_ops:{node}", "inputs": {"image": f"inputs.{gin}"}}
        size = probe_image_size(self.model_path, p) if self.n_inputs == 1 else None
        self.ops_src += _image_stub(node, p, size)
        self.wiring[p.name] = f"{node}.{p.name}"
        sample = self.sample_dir / f"{gin}.png"
        _write_sample_image(sample, size)
        self.samples[gin] = str(sample)

    def unique(self, name: str) -> str:
        """``name``, or ``name_2``, ``name_3``... if a graph input already has it (``a-b`` and ``a_b``
        would both be ``a_b``: one graph input would feed two model inputs)."""
        out, i = name, 1
        while out in self.inputs:
            i += 1
            out = f"{name}_{i}"
        return out

    def tensor(self, p: ModelPort) -> None:
        gin = self.unique(_ident(p.name))
        dtype = "str" if p.dtype == "object" else p.dtype  # an ONNX STRING tensor
        self.inputs[gin] = {"modality": "tensor", "dtype": dtype, "shape": list(p.dims)}
        self.wiring[p.name] = f"inputs.{gin}"
        sample = self.sample_dir / f"{gin}.npy"
        shape = _sample_dims(p.dims)
        if dtype == "str":
            values: np.ndarray[Any, Any] = np.full(shape, _SAMPLE_TEXT)
        elif p.dtype.startswith("float"):
            # a seed per input: equal samples would hide two inputs swapped or wired to one source
            seed = zlib.crc32(gin.encode())
            values = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(p.dtype)
        else:
            values = np.zeros(shape, p.dtype)
        np.save(sample, values, allow_pickle=False)
        self.samples[gin] = str(sample)

    def text(self, ports: list[ModelPort], vocab: dict[str, int], tokenizer: str | None) -> None:
        gin = self.unique("text")
        self.inputs[gin] = {"modality": "text"}
        if tokenizer is not None:
            options = {"max_length": _fixed_len(ports)}
            self.models["tokenizer"] = {"backend": "tokenizer", "path": tokenizer, "options": options}
            self.nodes["tokenize"] = {"model": "tokenizer", "inputs": {"text": f"inputs.{gin}"}}
        else:
            size = vocab.get("input_ids", 0) if any(p.name == "input_ids" for p in ports) else 0
            self.ops_src += _text_stub("tokenize", ports, size or 256, _fixed_len(ports))
            self.nodes["tokenize"] = {"fn": f"{self.ident}_ops:tokenize", "inputs": {"text": f"inputs.{gin}"}}
        for p in ports:
            self.wiring[p.name] = f"tokenize.{p.name}"
        self.samples[gin] = "hello from usg init"  # given inline on the printed `usg run` line
        # and as a file, like every other input's sample: `usg tune/bench/quantize --inputs NAME_samples/`
        # read it (the folder was empty for a text model, so they found "no images and no .txt files")
        (self.sample_dir / f"{gin}.txt").write_text(self.samples[gin] + "\n", encoding="utf-8")


def _model_doc(model_path: Path, out_dir: Path, inputs: list[ModelPort]) -> dict[str, Any]:
    model_abs = model_path.resolve()
    inside = model_abs.is_relative_to(out_dir.resolve())  # relative only if it moves with the graph
    doc: dict[str, Any] = {
        "backend": "onnxruntime",
        "path": os.path.relpath(model_abs, out_dir.resolve()) if inside else str(model_abs),
    }
    if all(p.dims and not isinstance(p.dims[0], int) for p in inputs):
        # only equal shapes share a batch unless you declare pad: (for pad-safe models only)
        doc["batch"] = {"max_size": 8, "max_delay_ms": 2}
    return doc


def _output_names(outputs: list[ModelPort]) -> dict[str, str]:
    """Graph output name -> the model port it reads; names made unique as graph inputs' are."""
    names: dict[str, str] = {}
    for o in outputs:
        name, i = _ident(o.name), 1
        while name in names:
            i += 1
            name = f"{_ident(o.name)}_{i}"
        names[name] = "model.out" if len(outputs) == 1 else f"model.{o.name}"
    return names


def write_scaffold(
    model_path: Path,
    out_dir: Path,
    name: str,
    *,
    kinds_override: dict[str, str] | None = None,
    tokenizer: str | None = None,
    force: bool = False,
) -> Scaffold:
    """Write ``OUT_DIR/NAME.yaml`` (+ ``NAME_ops.py`` and ``NAME_samples/``) for the model; returns what it wrote."""
    import yaml

    inputs, outputs, vocab = inspect_onnx(model_path)
    if not inputs or not outputs:
        raise InputError(f"{model_path} declares no graph inputs or outputs", field="MODEL", fix="re-export the model")
    kinds = classify(inputs, kinds_override or {})
    ident = _ident(name)
    graph_path, ops_path = out_dir / f"{ident}.yaml", out_dir / f"{ident}_ops.py"
    sample_dir = out_dir / f"{ident}_samples"
    needs_ops = "image" in kinds.values() or ("text" in kinds.values() and tokenizer is None)
    _check_free([graph_path, sample_dir, *([ops_path] if needs_ops else [])], force)
    for p in inputs:
        if kinds[p.name] == "tensor":
            _check_sample_size(p)  # before anything is written
    _make_dir(sample_dir)
    w = _Writer(model_path, graph_path, sample_dir, ident, len(inputs))
    images = [p for p in inputs if kinds[p.name] == "image"]
    for p in images:
        w.image(p, "image" if len(images) == 1 else w.unique(_ident(p.name)))
    for p in inputs:
        if kinds[p.name] == "tensor":
            w.tensor(p)
    text_ports = [p for p in inputs if kinds[p.name] == "text"]
    if text_ports:
        w.text(text_ports, vocab, tokenizer)
    w.nodes["model"] = {"model": "model", "inputs": {p.name: w.wiring[p.name] for p in inputs}}
    doc = {
        "name": name,
        "description": f"{model_path.name} as a USG graph (written by usg init; edit freely)",
        "inputs": w.inputs,
        "models": {"model": _model_doc(model_path, out_dir, inputs), **w.models},
        "nodes": w.nodes,
        "outputs": _output_names(outputs),
    }
    scaffold = Scaffold(graph_path, ops_path if needs_ops else None, w.samples)
    header = (
        f"# {name}: a USG graph for {model_path.name}, written by `usg init`.\n"
        f"# Run it:   {scaffold.run_command()}\n"
        f"# Inspect:  usg graph show {graph_path}   ·   check: usg doctor {graph_path} --dry-run\n"
    )
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=1000)
    graph_path.write_text(header + body, encoding="utf-8")
    if needs_ops:
        ops_path.write_text(w.ops_src, encoding="utf-8")
    return scaffold
