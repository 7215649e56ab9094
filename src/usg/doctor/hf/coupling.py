"""VLM token/patch coupling checks on a Hugging Face model directory (target ``hf_model``).

A vision-language model works only when three numbers agree: the features the vision tower
and projector produce per image, the image tokens the processor inserts into the prompt, and
the widths the projector connects. They live in different files (``config.json``,
``preprocessor_config.json`` / ``processor_config.json``, ``tokenizer_config.json``) written by
different tools, so they drift apart — the runtime symptom is transformers' "Image features
and image tokens do not match: tokens: 729, features 728". The arithmetic is in
:mod:`usg.vision_tokens`; every mismatch is reported with both numbers and the fix.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, Location, RootCause, Severity
from usg.doctor.registry import CodeInfo, check, finding
from usg.vision_tokens import anyres_tokens, has_cls, qwen2_vl_resize, vit_tokens

__all__ = ["HF_CODES", "check_vlm_coupling"]

HF_CODES = (
    CodeInfo("HF000", Severity.INFO, RootCause.VERSION_COUPLING, "vision token arithmetic", "per-image numbers"),
    CodeInfo(
        "HF001",
        Severity.ERROR,
        RootCause.VERSION_COUPLING,
        "image tokens != image features",
        "the processor inserts a different number of image tokens than the vision tower yields features",
    ),
    CodeInfo(
        "HF002",
        Severity.ERROR,
        RootCause.VERSION_COUPLING,
        "projector input width",
        "the projector's input width differs from the vision tower's hidden size",
    ),
    CodeInfo(
        "HF003",
        Severity.ERROR,
        RootCause.CONFIG_INVALID,
        "projector output width",
        "the projector's output width differs from the language model's hidden size",
    ),
    CodeInfo(
        "HF004",
        Severity.ERROR,
        RootCause.CONFIG_INVALID,
        "image token id",
        "the config's image token id is not the tokenizer's image token or is outside the vocabulary",
    ),
    CodeInfo(
        "HF005",
        Severity.ERROR,
        RootCause.SHAPE_OR_RANK,
        "image tokens vs max length",
        "one image's tokens reach or exceed the tokenizer/model maximum length: truncation cuts them "
        "and the model fails ('Image features and image tokens do not match'), or the sequence "
        "overruns the position embeddings",
    ),
    CodeInfo(
        "HF006",
        Severity.ERROR,
        RootCause.VERSION_COUPLING,
        "patch/merge size disagree",
        "processor and model use different patch / merge / tile sizes",
    ),
    CodeInfo(
        "HF007",
        Severity.WARNING,
        RootCause.CONFIG_INVALID,
        "config unreadable",
        "a file is missing or invalid",
    ),
)

_DEFAULTS = {  # transformers' defaults for fields configs often omit
    "clip_vision_model": {"image_size": 224, "patch_size": 32, "hidden_size": 768},
    "siglip_vision_model": {"image_size": 224, "patch_size": 16, "hidden_size": 768},
    "llama": {"hidden_size": 4096, "max_position_embeddings": 2048},
    "mistral": {"hidden_size": 4096, "max_position_embeddings": 131072},
    "gemma": {"hidden_size": 3072, "max_position_embeddings": 8192},
}
_HUGE = 10**12  # tokenizer "model_max_length" placeholder for "no limit"
SAMPLE_SIZES = ((336, 336), (480, 640), (1000, 300), (672, 1344))


@dataclass
class _Ctx:
    root: Path
    config: dict[str, Any]
    pre: dict[str, Any]
    proc: dict[str, Any]
    tok: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)

    def add(self, code: str, msg: str, file: str, fix: str, **ev: Any) -> None:
        """Add a finding of ``code``; its severity and root cause come from the registry."""
        self.findings.append(finding(code, msg, Location(str(self.root / file)), fix, ev))

    def vision(self) -> dict[str, Any]:
        vc = dict(self.config.get("vision_config") or {})
        return {**_DEFAULTS.get(vc.get("model_type", ""), {}), **vc}

    def text(self) -> dict[str, Any]:
        tc = dict(self.config.get("text_config") or {})
        return {**_DEFAULTS.get(tc.get("model_type", ""), {}), **tc}

    def processor_value(self, key: str) -> Any:
        return self.proc.get(key, self.pre.get(key))


def _read_json(root: Path, name: str, findings: list[Finding]) -> dict[str, Any]:
    path = root / name
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        why = "it nests deeper than the JSON parser reads" if isinstance(exc, RecursionError) else str(exc)
        findings.append(
            finding(
                "HF007",
                f"{name} is not valid JSON: {why}",
                Location(str(path)),
                f"fix or regenerate {name} (save_pretrained)",
            )
        )
        return {}
    if not isinstance(data, dict):
        findings.append(
            finding(
                "HF007",
                f"{name} holds a JSON {type(data).__name__}, not the object save_pretrained writes: nothing in it can "
                "be checked",
                Location(str(path)),
                f"fix or regenerate {name} (save_pretrained)",
            )
        )
        return {}
    return data


def _crop(pre: dict[str, Any]) -> int | None:
    for key in ("crop_size", "size"):
        v = pre.get(key)
        if isinstance(v, dict):
            for k in ("height", "shortest_edge", "width"):
                if isinstance(v.get(k), int):
                    return int(v[k])
        elif isinstance(v, int):
            return v
    return None


def _projector_weight_shape(root: Path, names: tuple[str, ...]) -> tuple[list[int], str] | None:
    """Shape of a projector weight from the safetensors header (no weights are loaded)."""
    files = sorted(root.glob("*.safetensors"))
    for f in files:
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            continue
        for name in names:
            for key, meta in header.items():
                if key.endswith(name) and isinstance(meta, dict) and "shape" in meta:
                    return [int(x) for x in meta["shape"]], f"{f.name}:{key}"
    return None


def _check_token_id(c: _Ctx) -> None:
    tid = c.config.get("image_token_index", c.config.get("image_token_id"))
    if tid is None:
        return
    vocab = c.text().get("vocab_size") or c.config.get("vocab_size")
    if vocab and int(tid) >= int(vocab):
        c.add(
            "HF004",
            f"image token id {tid} is outside the language model's vocabulary ({vocab} entries)",
            "config.json",
            "resize the token embeddings after adding the image token, or set image_token_index to its id",
            image_token_id=tid,
            vocab_size=vocab,
        )
    added = c.tok.get("added_tokens_decoder")
    if not isinstance(added, dict) or not added:
        return
    expected = c.processor_value("image_token") or c.tok.get("image_token")
    entry = added.get(str(tid))
    content = entry.get("content") if isinstance(entry, dict) else None
    if content is None or (expected and content != expected):
        where = [k for k, v in added.items() if isinstance(v, dict) and expected and v.get("content") == expected]
        c.add(
            "HF004",
            f"config.json says the image token id is {tid}, but the tokenizer maps {tid} to {content!r}"
            + (f" and {expected!r} to {where[0]}" if where else ""),
            "tokenizer_config.json",
            f"set image_token_index={where[0]} in config.json" if where else "add the image token to the tokenizer",
            image_token_id=tid,
            tokenizer_token=content,
            expected_token=expected,
        )


def _check_max_length(c: _Ctx, tokens: int, what: str, shrink: str | None = None) -> None:
    """HF005 when ``tokens`` image tokens reach a length limit. ``shrink`` names the processor setting that
    lowers an image's tokens (None: the family takes the same tokens for any image size)."""
    limits = {
        "tokenizer model_max_length": c.tok.get("model_max_length"),
        "max_position_embeddings": c.text().get("max_position_embeddings") or c.config.get("max_position_embeddings"),
    }
    for name, limit in limits.items():
        if isinstance(limit, int | float) and 0 < limit < _HUGE and tokens >= int(limit):
            c.add(
                "HF005",
                f"{what} takes {tokens} image tokens, which reaches the {name} of {int(limit)}: "
                "truncation cuts image tokens and the model then fails with 'Image features and image tokens "
                "do not match'",
                "tokenizer_config.json" if name.startswith("tokenizer") else "config.json",
                _max_length_fix(name, tokens, shrink),
                image_tokens=tokens,
                limit=int(limit),
                limit_name=name,
            )


def _max_length_fix(limit_name: str, tokens: int, shrink: str | None) -> str:
    if limit_name.startswith("tokenizer"):
        longer = f"raise model_max_length in tokenizer_config.json above {tokens}"
    else:
        longer = "serve a model with a longer context (max_position_embeddings)"
    if shrink is None:
        return (
            f"{longer} (a smaller image does not help: every image takes {tokens} tokens); "
            "never truncate prompts with images"
        )
    return f"lower the image resolution ({shrink}), or {longer}; never truncate prompts with images"


@dataclass(frozen=True)
class _Tower:
    """A LLaVA-family vision tower as the model and the processor each see it."""

    image: int
    patch: int
    cls: bool
    strat_m: Any  # vision_feature_select_strategy in config.json
    strat_p: Any  # ... in the processor
    patch_p: Any  # the processor's patch_size (None: it inserts a single <image> token)
    add_p: int  # num_additional_image_tokens
    crop: int
    model_type: Any

    @property
    def feats(self) -> int:
        """Vision features per image (tile) the model produces."""
        return vit_tokens(self.image, self.patch, self.cls, self.strat_m)

    @property
    def toks(self) -> int:
        """Image tokens per image (tile) the processor inserts."""
        return (self.crop // self.patch_p) ** 2 + self.add_p - (1 if self.strat_p == "default" else 0)

    def arithmetic(self) -> str:
        return (
            f"({self.image}/{self.patch})² = {(self.image // self.patch) ** 2} patches"
            + (" + 1 CLS" if self.cls else " (no CLS: " + str(self.model_type) + ")")
            + (" - 1 (strategy 'default' drops the first token)" if self.strat_m == "default" else " (strategy 'full')")
            + f" = {self.feats}"
        )


def _positive(value: Any, where: str) -> int:
    """A size from a config (image_size, patch_size): a positive integer, else a ValueError naming it."""
    # not 14.5 (int() would make it 14), inf or NaN
    number = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not number or value < 1:
        raise ValueError(f"{where} is {value!r}; a size must be a positive integer")
    return int(value)


def _tower(c: _Ctx) -> _Tower:
    v = c.vision()
    image = _positive(v["image_size"], "vision_config.image_size")
    patch_p = c.processor_value("patch_size")
    return _Tower(
        image=image,
        patch=_positive(v["patch_size"], "vision_config.patch_size"),
        cls=has_cls(v.get("model_type")),
        strat_m=c.config.get("vision_feature_select_strategy", "default"),
        strat_p=c.processor_value("vision_feature_select_strategy"),
        patch_p=None if patch_p is None else _positive(patch_p, "the processor's patch_size"),
        add_p=int(c.processor_value("num_additional_image_tokens") or 0),
        crop=_crop(c.pre) or image,
        model_type=v.get("model_type"),
    )


def _llava(c: _Ctx, next_: bool) -> None:
    """LLaVA / LLaVA-NeXT: strategy, crop size, projector widths, then the token arithmetic."""
    t = _tower(c)
    _check_strategy_and_crop(c, t)
    _check_projector(c)
    if not isinstance(t.patch_p, int):
        c.add(
            "HF000",
            "processor has no patch_size: it inserts a single <image> token that the model expands itself "
            f"(vision features per image: {t.feats})",
            "processor_config.json",
            "none needed",
            vision_features=t.feats,
        )
        return
    if next_ and c.config.get("image_grid_pinpoints"):
        _check_anyres(c, t)
        return
    if t.toks != t.feats:
        _mismatch(c, t.toks, t.feats, t.cls, t.strat_m, t.strat_p, t.add_p, "one image", t.arithmetic())
        return
    _check_max_length(c, t.feats, "one image")
    c.add(
        "HF000",
        f"vision features per image: {t.arithmetic()}; processor inserts {t.toks}",
        "config.json",
        "none needed",
        vision_features=t.feats,
        image_tokens=t.toks,
    )


def _check_strategy_and_crop(c: _Ctx, t: _Tower) -> None:
    for who, s in (("config.json", t.strat_m), ("processor", t.strat_p)):
        if s not in (None, "default", "full"):
            c.add(
                "HF007",
                f"vision_feature_select_strategy {s!r} in {who} is neither 'default' nor 'full'",
                "config.json",
                "use 'default' (drop CLS) or 'full' (keep all tokens)",
                value=s,
            )
    if t.crop != t.image:
        c.add(
            "HF006",
            f"the image processor crops to {t.crop}px but the vision tower is built for {t.image}px "
            f"({(t.crop // t.patch) ** 2} vs {(t.image // t.patch) ** 2} patches)",
            "preprocessor_config.json",
            f"set crop_size/size to {t.image} in preprocessor_config.json",
            processor_size=t.crop,
            vision_image_size=t.image,
        )


def _check_projector(c: _Ctx) -> None:
    """The projector's input width is the tower's features, its output width the language model's."""
    v = c.vision()
    layers = c.config.get("vision_feature_layer", -2)
    width = int(v["hidden_size"]) * (len(layers) if isinstance(layers, list) else 1)
    claimed = c.config.get("mm_hidden_size")
    weight = _projector_weight_shape(c.root, ("multi_modal_projector.linear_1.weight", "mm_projector.0.weight"))
    for label, val in (
        ("mm_hidden_size", claimed),
        ("projector weight " + (weight[1] if weight else ""), weight[0][1] if weight else None),
    ):
        if val is not None and int(val) != width:
            c.add(
                "HF002",
                f"{label.strip()} is {val} but the vision tower emits {width} features per token "
                f"(hidden_size {v['hidden_size']}"
                + (f" × {len(layers)} feature layers)" if isinstance(layers, list) else ")"),
                "config.json",
                "the projector was trained for a different vision tower: use the tower with hidden_size "
                f"{val}, "
                "or the projector that matches this tower",
                projector_in=int(val),
                vision_hidden=width,
            )
    text_hidden = c.text().get("hidden_size")
    out_w = _projector_weight_shape(c.root, ("multi_modal_projector.linear_2.weight",))
    if out_w and text_hidden and out_w[0][0] != int(text_hidden):
        c.add(
            "HF003",
            f"the projector outputs {out_w[0][0]} ({out_w[1]}) but the language model's hidden_size is {text_hidden}",
            "config.json",
            "pair the projector with the language model it was trained for",
            projector_out=out_w[0][0],
            text_hidden=int(text_hidden),
        )


def _check_anyres(c: _Ctx, t: _Tower) -> None:
    """LLaVA-NeXT: the same pinpoints on both sides, and equal token counts for sample image sizes."""
    pins_m = c.config.get("image_grid_pinpoints") or []
    pins_p = c.processor_value("image_grid_pinpoints") or pins_m
    if [list(p) for p in pins_m] != [list(p) for p in pins_p]:
        c.add(
            "HF006",
            f"image_grid_pinpoints differ: config.json {pins_m} vs processor {pins_p}",
            "preprocessor_config.json",
            "copy image_grid_pinpoints from config.json into preprocessor_config.json",
            model=pins_m,
            processor=pins_p,
        )
    for size in SAMPLE_SIZES:
        fm = anyres_tokens(size, t.image, t.patch, pins_m, t.feats)
        tp = anyres_tokens(size, t.crop, t.patch_p, pins_p, t.toks)
        if fm != tp:
            where = f"a {size[0]}x{size[1]} image"
            _mismatch(c, tp, fm, t.cls, t.strat_m, t.strat_p, t.add_p, where, t.arithmetic())
            return
    worst = max(anyres_tokens((int(h), int(w)), t.image, t.patch, pins_m, t.feats) for h, w in pins_m)
    _check_max_length(c, worst, "the largest anyres image", "image_grid_pinpoints")
    c.add(
        "HF000",
        f"per tile: {t.arithmetic()}; anyres up to {worst} tokens per image; processor agrees",
        "config.json",
        "none needed",
        tile_features=t.feats,
        max_image_tokens=worst,
    )


def _mismatch(
    c: _Ctx, toks: int, feats: int, cls: bool, strat_m: Any, strat_p: Any, add_p: int, what: str, arith: str
) -> None:
    if not cls and strat_m == "default":
        fix = (
            "the vision tower has no CLS token, so strategy 'default' drops a real patch: set "
            "vision_feature_select_strategy='full' in config.json and the processor, and "
            "num_additional_image_tokens=0"
        )
    elif strat_m != strat_p:
        fix = (
            f"use the same vision_feature_select_strategy in config.json ({strat_m!r}) and the processor ({strat_p!r})"
        )
    elif add_p != (1 if cls else 0):
        has = "CLIP has a" if cls else "this tower has no"
        fix = f"set num_additional_image_tokens={1 if cls else 0} in processor_config.json ({has} CLS token)"
    else:
        fix = "make the processor's patch_size/crop size match the vision config"
    c.add(
        "HF001",
        f"for {what} the processor inserts {toks} image tokens but the model produces {feats} image features "
        f"(model side per tile: {arith}); inference fails with 'Image features and image tokens do not "
        "match: "
        f"tokens: {toks}, features {feats}'",
        "processor_config.json",
        fix,
        image_tokens=toks,
        image_features=feats,
    )


def _paligemma(c: _Ctx) -> None:
    v = c.vision()
    image, patch = int(v.get("image_size", 224)), int(v["patch_size"])
    feats = vit_tokens(image, patch, has_cls(v.get("model_type")), "full")
    declared = v.get("num_image_tokens") or c.text().get("num_image_tokens")
    seq = c.processor_value("image_seq_length")
    for name, val in (("processor image_seq_length", seq), ("config num_image_tokens", declared)):
        if val is not None and int(val) != feats:
            c.add(
                "HF001",
                f"{name} is {val} but the SigLIP tower yields ({image}/{patch})² = {feats} features per image",
                "preprocessor_config.json" if "processor" in name else "config.json",
                f"set {name.split()[-1]}={feats} (it must equal (image_size/patch_size)²; SigLIP has no CLS)",
                image_tokens=int(val),
                image_features=feats,
            )
    proj, text_hidden = v.get("projection_dim", c.config.get("projection_dim")), c.text().get("hidden_size")
    if proj and text_hidden and int(proj) != int(text_hidden):
        c.add(
            "HF003",
            f"the projector outputs {proj} (projection_dim) but the language model's hidden_size is {text_hidden}",
            "config.json",
            f"set vision_config.projection_dim={text_hidden}",
            projector_out=proj,
            text_hidden=text_hidden,
        )
    _check_max_length(c, feats, "one image")
    c.add(
        "HF000",
        f"vision features per image: ({image}/{patch})² = {feats} (SigLIP, no CLS); processor inserts {seq}",
        "config.json",
        "none needed",
        vision_features=feats,
        image_tokens=seq,
    )


def _qwen2_vl(c: _Ctx) -> None:
    v = c.vision()
    patch, merge, temporal = (
        int(v.get("patch_size", 14)),
        int(v.get("spatial_merge_size", 2)),
        int(v.get("temporal_patch_size", 2)),
    )
    p_patch = int(c.processor_value("patch_size") or patch)
    p_merge = int(c.processor_value("merge_size") or merge)
    p_temp = int(c.processor_value("temporal_patch_size") or temporal)
    min_px = int(c.processor_value("min_pixels") or 56 * 56)
    max_px = int(c.processor_value("max_pixels") or 28 * 28 * 1280)
    h, w = qwen2_vl_resize(448, 448, p_patch * p_merge, min_px, max_px)
    toks = (h // p_patch) * (w // p_patch) // (p_merge**2)
    feats = (h // patch) * (w // patch) // (merge**2)
    for name, pv, mv in (
        ("patch_size", p_patch, patch),
        ("merge_size / spatial_merge_size", p_merge, merge),
        ("temporal_patch_size", p_temp, temporal),
    ):
        if pv != mv:
            c.add(
                "HF006",
                f"processor {name} is {pv} but the vision config has {mv}: a 448x448 image becomes {toks} "
                f"<|image_pad|> tokens but {feats} merged features",
                "preprocessor_config.json",
                f"set {name.split(' /')[0]}={mv} in preprocessor_config.json",
                processor=pv,
                model=mv,
                image_tokens=toks,
                image_features=feats,
            )
    hidden, text_hidden = v.get("hidden_size"), c.config.get("hidden_size") or c.text().get("hidden_size")
    if hidden and text_hidden and int(hidden) != int(text_hidden):
        c.add(
            "HF003",
            f"the patch merger outputs vision_config.hidden_size={hidden} but the language model's "
            f"hidden_size is {text_hidden}",
            "config.json",
            f"set vision_config.hidden_size={text_hidden}",
            projector_out=hidden,
            text_hidden=text_hidden,
        )
    max_tokens = max_px // (p_patch * p_merge) ** 2
    _check_max_length(c, max_tokens, f"an image at max_pixels={max_px}", "max_pixels")
    c.add(
        "HF000",
        f"a 448x448 image: ({h}/{patch})·({w}/{patch}) patches / merge {merge}² = {feats} tokens; "
        f"up to {max_tokens} at max_pixels",
        "config.json",
        "none needed",
        vision_features_448=feats,
        image_tokens_448=toks,
        max_image_tokens=max_tokens,
    )


def _idefics(c: _Ctx) -> None:
    v = c.vision()
    image, patch = int(v.get("image_size", 364)), int(v.get("patch_size", 14))
    scale = int(c.config.get("scale_factor", 2))
    feats = (image // patch) ** 2 // (scale**2)
    seq = c.processor_value("image_seq_len")
    if seq is not None and int(seq) != feats:
        c.add(
            "HF001",
            f"processor image_seq_len is {seq} but ({image}/{patch})² / scale_factor {scale}² = {feats} "
            "features per tile",
            "processor_config.json",
            f"set image_seq_len={feats}",
            image_tokens=int(seq),
            image_features=feats,
        )
    c.add(
        "HF000",
        f"per tile: ({image}/{patch})² / {scale}² = {feats} (pixel shuffle)",
        "config.json",
        "none needed",
        vision_features=feats,
    )


_FAMILIES = {
    "llava": lambda c: _llava(c, False),
    "llava_next": lambda c: _llava(c, True),
    "paligemma": _paligemma,
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_vl,
    "idefics3": _idefics,
    "smolvlm": _idefics,
}


@check("hf_model", codes=HF_CODES)
def check_vlm_coupling(path: Path, ctx: object = None) -> Iterable[Finding]:
    """Vision tokens vs processor tokens vs projector widths for a Hugging Face VLM directory."""
    root = Path(path)
    found: list[Finding] = []
    config = _read_json(root, "config.json", found)
    c = _Ctx(
        root,
        config,
        _read_json(root, "preprocessor_config.json", found),
        _read_json(root, "processor_config.json", found),
        _read_json(root, "tokenizer_config.json", found),
        found,
    )
    family = _FAMILIES.get(str(config.get("model_type")))
    if family is None or not config.get("vision_config"):
        return found
    if not (c.pre or c.proc):
        c.add(
            "HF007",
            "no preprocessor_config.json / processor_config.json: the processor side cannot be checked",
            "preprocessor_config.json",
            "save the processor next to the model (processor.save_pretrained(dir))",
        )
    try:
        family(c)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        c.add(
            "HF007",
            f"cannot compute the vision token count: {type(exc).__name__}: {exc}",
            "config.json",
            "check vision_config (image_size, patch_size) and the processor config",
        )
    _check_token_id(c)
    return c.findings
