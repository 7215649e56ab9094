"""Benchmark inputs: documents (images) and texts, from a folder/file or rendered with known text."""

from __future__ import annotations

import base64
import io
import itertools
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from usg.errors import UsageError

if TYPE_CHECKING:
    from usg.graph import Graph

__all__ = ["Sample", "default_samples", "load_samples", "sample_cycle", "takes_documents"]

_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"}
_TEXT_SUFFIXES = {".txt"}

_DEFAULT_DOCS: tuple[tuple[tuple[str, int, str, float], ...], ...] = (
    (
        ("Quarterly report 2026", 34, "DejaVuSans-Bold.ttf", 0.0),
        ("Revenue grew by 12 percent", 28, "DejaVuSans.ttf", 0.0),
        ("Operating costs were stable", 24, "DejaVuSans.ttf", 0.0),
    ),
    (
        ("Shipping address", 30, "DejaVuSerif.ttf", 0.0),
        ("42 Baker Street London", 26, "DejaVuSerif-Bold.ttf", 0.0),
        ("Order 7781-AX ready", 26, "DejaVuSansMono.ttf", 0.0),
        ("Tracking code QX93020", 22, "DejaVuSansMono-Bold.ttf", 0.0),
    ),
    (
        ("Signed copy attached", 30, "DejaVuSans.ttf", 0.0),
        ("Please return by Friday", 28, "DejaVuSans.ttf", 5.0),
        ("Thank you", 32, "DejaVuSerif-Italic.ttf", 0.0),
    ),
    (
        ("Terms and conditions apply", 18, "DejaVuSans.ttf", 0.0),
        ("Invoice number 55012", 20, "DejaVuSans.ttf", 0.0),
        ("Payment due within 30 days of receipt", 20, "DejaVuSans.ttf", 0.0),
        ("Bank transfer only", 20, "DejaVuSans.ttf", 0.0),
    ),
)
_DEFAULT_TEXTS = (
    "total amount due",
    "where is the shipping address",
    "signed copy of the contract",
    "payment terms and conditions",
)


@dataclass(frozen=True)
class Sample:
    """One request's inputs: an RGB uint8 HWC image and/or a text — or, for graphs with other
    inputs, ``values``: graph input name -> value (as ``usg profile`` reads them from files)."""

    name: str
    image: np.ndarray | None = None
    text: str | None = None
    _png: list[bytes] = field(default_factory=list, repr=False, compare=False)
    values: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    def inputs(self) -> dict[str, Any]:
        """Graph inputs (``image``, ``text``) for this sample, absent ones left out."""
        if self.values is not None:
            return dict(self.values)
        out: dict[str, Any] = {}
        if self.image is not None:
            out["image"] = self.image
        if self.text is not None:
            out["text"] = self.text
        return out

    def png(self) -> bytes:
        """The image PNG-encoded (cached), for HTTP targets."""
        if self.image is None:
            raise ValueError(f"sample {self.name!r} has no image")
        if not self._png:
            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(self.image).save(buf, format="PNG")
            self._png.append(buf.getvalue())
        return self._png[0]

    def json_inputs(self) -> dict[str, Any]:
        """``/v1/infer`` JSON inputs: the image base64-encoded PNG, the text as is."""
        if self.values is not None:
            raise UsageError(
                f"sample {self.name!r} holds {', '.join(self.values)}: only image and text samples are sent over "
                "HTTP; fix: benchmark the graph file in process (usg bench GRAPH --inputs DIR)"
            )
        out: dict[str, Any] = {}
        if self.image is not None:
            out["image"] = {"b64": base64.b64encode(self.png()).decode("ascii")}
        if self.text is not None:
            out["text"] = self.text
        return out


def default_samples(graph: Graph | None = None) -> list[Sample]:
    """Four rendered documents (3-4 lines each) paired with four query texts (``graph``: refused,
    naming the fix, when it takes other inputs)."""
    if not takes_documents(graph):
        assert graph is not None
        raise UsageError(
            f"graph {graph.name!r} takes {', '.join(sorted(graph.inputs))}, not the built-in document and text "
            "samples; fix: pass --inputs DIR with a file per input named after it (x.npy; usg init writes them "
            "into NAME_samples/), or STEM.INPUT files / .jsonl lines for several requests"
        )
    from usg.testing.documents import Line, render_document

    out = []
    for i, (doc, text) in enumerate(zip(_DEFAULT_DOCS, _DEFAULT_TEXTS, strict=True)):
        image = render_document([Line(t, size=s, font=f, angle=a) for t, s, f, a in doc])
        out.append(Sample(f"doc{i}", image, text))
    return out


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:  # corrupt, truncated, a header-declared bomb
        raise UsageError(
            f"--inputs: {str(path)!r} is not a readable image ({exc}); fix: re-encode it or take it out of the folder"
        ) from None


def _read_texts(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"--inputs: {str(path)!r} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            "fix: convert it to UTF-8 (e.g. iconv -f LATIN1 -t UTF-8) or take it out of the folder"
        ) from None
    except OSError as exc:
        raise UsageError(
            f"--inputs: cannot read {str(path)!r} ({exc.strerror or exc}); fix: pass readable files"
        ) from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def takes_documents(graph: Graph | None) -> bool:
    """Whether ``graph`` takes the document samples: it reads ``image`` or ``text`` and needs no other
    input (optional ones stay absent); None: assume so."""
    if graph is None:
        return True
    required = {n for n, d in graph.inputs.items() if not d.optional}
    return required <= _DOCUMENT_INPUTS and bool(_DOCUMENT_INPUTS & graph.inputs.keys())


_DOCUMENT_INPUTS = frozenset({"image", "text"})


def load_samples(path: str | Path, graph: Graph | None = None, *, required: bool = False) -> list[Sample]:
    """Samples from a file or a folder: each image is one sample; ``.txt`` files give texts
    (one per non-empty line) that are paired with the images in turn (or sent alone).
    A ``graph`` with other inputs (tensors, audio, ...) reads the folder as ``usg profile`` does:
    files named after an input (``x.npy``, ``mask.npy``: what ``usg init`` writes) form one request,
    ``STEM.INPUT.npy`` files one request per stem, ``.jsonl`` lines one request each.
    ``required``: the command has no default inputs (``usg quantize``), so the fix does not say
    to leave ``--inputs`` out."""
    p = Path(path)
    if not p.exists():
        documents = takes_documents(graph)
        what = "images / .txt files" if documents else "sample inputs (as `usg init` writes them)"
        leave = "" if required or not documents else ", or leave --inputs out (rendered documents and queries)"
        raise UsageError(f"--inputs {path}: no such file or folder; fix: pass a folder or file of {what}{leave}")
    if not takes_documents(graph):
        assert graph is not None
        from usg.monitor.profile import collect_requests

        return [Sample(r.name, values=r.raw) for r in collect_requests(graph, p)]
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    images = [f for f in files if f.suffix.lower() in _IMAGE_SUFFIXES]
    texts: list[str] = []
    for f in files:
        if f.suffix.lower() in _TEXT_SUFFIXES:
            texts.extend(_read_texts(f))
    if not images and not texts:
        raise UsageError(
            f"--inputs {path}: found no images ({', '.join(sorted(_IMAGE_SUFFIXES))}) and no .txt files; "
            "fix: point it at a folder of documents and/or text files"
        )
    if not images:
        return [Sample(f"text{i}", None, t) for i, t in enumerate(texts)]
    text_cycle = itertools.cycle(texts) if texts else None
    return [Sample(f.stem, _read_image(f), next(text_cycle) if text_cycle is not None else None) for f in images]


def sample_cycle(samples: list[Sample]) -> Iterator[Sample]:
    if not samples:
        raise UsageError("no benchmark inputs; fix: pass --inputs DIR|FILE")
    return itertools.cycle(samples)


def fresh_variant(sample: Sample, n: int) -> Sample:
    """A copy of ``sample`` whose inputs differ in their bytes (so no cache holds it) but not in
        what they say: the image with ``n + 1`` written into the lowest bits of its first values (each
    changes by at most 1), the text with ``#n`` appended."""
    image = None
    if sample.image is not None:
        image = sample.image.copy()
        flat = image.reshape(-1)
        bits = min(flat.size, 48)  # n written into the lowest bits of the first values: unique per n
        flat[:bits] ^= ((n + 1) >> np.arange(bits, dtype=np.uint64) & 1).astype(flat.dtype)
    text = f"{sample.text} #{n}" if sample.text is not None else None
    return Sample(f"{sample.name}~{n}", image=image, text=text)


def repeat_sampler(samples: list[Sample], repeat_rate: float, seed: int = 0) -> Iterator[Sample]:
    """Requests of which a share ``repeat_rate`` re-sends an input already sent (chosen at random
    among the sent ones) and the rest are fresh variants (:func:`fresh_variant`) never sent before:
    the traffic of ``usg bench --repeat-rate R``, for measuring a node cache."""
    if not samples:
        raise UsageError("no benchmark inputs; fix: pass --inputs DIR|FILE")
    if not 0.0 <= repeat_rate <= 1.0:
        raise UsageError(f"--repeat-rate {repeat_rate!r}: fix: pass a share between 0 and 1")
    rng = random.Random(seed)
    sent: list[Sample] = []
    n = 0
    while True:
        if sent and rng.random() < repeat_rate:
            yield rng.choice(sent)
            continue
        fresh = fresh_variant(samples[n % len(samples)], n)
        n += 1
        if len(sent) < 4096:  # bounded: later repeats choose among the first 4096 inputs
            sent.append(fresh)
        yield fresh
