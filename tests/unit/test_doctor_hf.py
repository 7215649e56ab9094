"""VLM token/patch coupling on real published configs (no errors) and mutated copies (each mismatch found)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from usg.doctor.findings import RootCause, Severity
from usg.doctor.hf.coupling import check_vlm_coupling
from usg.doctor.registry import checks_for
from usg.vision_tokens import anyres_tokens, qwen2_vl_resize

HF = Path(__file__).parents[1] / "resources" / "hf"
REAL = ["llava-1.5-7b-hf", "llava-v1.6-mistral-7b-hf", "Qwen2-VL-2B-Instruct", "paligemma-3b-pt-224"]


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(HF / name, dst)
    return dst


def _edit(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_text(json.dumps(data))


def _errors(d: Path) -> list:
    return [f for f in check_vlm_coupling(d, None) if f.severity is Severity.ERROR]


@pytest.mark.parametrize("name", REAL)
def test_real_configs_have_no_errors(name: str) -> None:
    found = list(check_vlm_coupling(HF / name, object()))
    assert [f for f in found if f.severity is not Severity.INFO] == []
    assert any(f.code == "HF000" for f in found)


def test_real_numbers() -> None:
    def info(name: str) -> dict[str, Any]:
        return next(f for f in check_vlm_coupling(HF / name, None) if f.code == "HF000").evidence

    assert info("llava-1.5-7b-hf")["vision_features"] == 576  # (336/14)^2 + CLS - CLS
    assert info("llava-v1.6-mistral-7b-hf")["max_image_tokens"] == 2928  # 576 + 48*48 + 48 newlines
    assert info("paligemma-3b-pt-224")["vision_features"] == 256
    q = info("Qwen2-VL-2B-Instruct")
    assert q["vision_features_448"] == 256 and q["max_image_tokens"] == 16384


def test_registered_for_hf_model_target() -> None:
    assert check_vlm_coupling in [c.func for c in checks_for("hf_model")]


def test_siglip_tower_with_default_strategy_729_vs_728(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(
        d / "config.json",
        vision_config__model_type="siglip_vision_model",
        vision_config__image_size=378,
        vision_config__hidden_size=1152,
    )
    _edit(d / "preprocessor_config.json", crop_size={"height": 378, "width": 378}, size={"shortest_edge": 378})
    errs = _errors(d)
    hf001 = [f for f in errs if f.code == "HF001"]
    assert len(hf001) == 1
    f = hf001[0]
    assert (f.evidence["image_tokens"], f.evidence["image_features"]) == (729, 728)
    assert f.root_cause is RootCause.VERSION_COUPLING
    assert "num_additional_image_tokens=0" in f.fix and "'full'" in f.fix


def test_strategy_disagreement(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "processor_config.json", vision_feature_select_strategy="full")
    [f] = _errors(d)
    assert f.code == "HF001" and (f.evidence["image_tokens"], f.evidence["image_features"]) == (577, 576)
    assert "same vision_feature_select_strategy" in f.fix


def test_missing_additional_token_for_clip(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "processor_config.json", num_additional_image_tokens=0)
    [f] = _errors(d)
    assert (f.evidence["image_tokens"], f.evidence["image_features"]) == (575, 576)
    assert "num_additional_image_tokens=1" in f.fix


def test_projector_width_from_mm_hidden_size(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "config.json", mm_hidden_size=1152)
    [f] = _errors(d)
    assert f.code == "HF002" and (f.evidence["projector_in"], f.evidence["vision_hidden"]) == (1152, 1024)


def _safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors.items():
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_projector_width_from_safetensors_header(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _safetensors(
        d / "model.safetensors",
        {
            "multi_modal_projector.linear_1.weight": [8, 1152],
            "multi_modal_projector.linear_2.weight": [4096, 8],
        },
    )
    [f] = _errors(d)
    assert f.code == "HF002" and f.evidence["projector_in"] == 1152
    _safetensors(
        d / "model.safetensors",
        {
            "multi_modal_projector.linear_1.weight": [8, 1024],
            "multi_modal_projector.linear_2.weight": [2048, 8],
        },
    )
    [f] = _errors(d)
    assert f.code == "HF003" and (f.evidence["projector_out"], f.evidence["text_hidden"]) == (2048, 4096)


def test_llava_next_pinpoints_disagree(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-v1.6-mistral-7b-hf")
    _edit(d / "preprocessor_config.json", image_grid_pinpoints=[[336, 672], [672, 336], [672, 672]])
    codes = [f.code for f in _errors(d)]
    assert "HF006" in codes and "HF001" in codes  # a 1000x300 image picks a different grid


def test_llava_next_processor_patch_size(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-v1.6-mistral-7b-hf")
    _edit(d / "processor_config.json", patch_size=16)
    [f] = _errors(d)
    assert f.code == "HF001" and f.evidence["image_tokens"] != f.evidence["image_features"]


def test_image_tokens_beyond_max_length(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-v1.6-mistral-7b-hf")
    _edit(d / "tokenizer_config.json", model_max_length=2048)
    [f] = _errors(d)
    assert f.code == "HF005" and (f.evidence["image_tokens"], f.evidence["limit"]) == (2928, 2048)
    assert "image_grid_pinpoints" in f.fix and "model_max_length in tokenizer_config.json" in f.fix


def test_fixed_token_family_beyond_max_length_is_not_told_to_lower_the_resolution(tmp_path: Path) -> None:
    # LLaVA-1.5 takes 576 tokens for any image: before, the fix said "lower the image resolution (max_pixels /
    # image_grid_pinpoints)", settings this model does not have
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "tokenizer_config.json", model_max_length=512)
    [f] = _errors(d)
    assert f.code == "HF005" and (f.evidence["image_tokens"], f.evidence["limit"]) == (576, 512)
    assert "resolution" not in f.fix and "raise model_max_length in tokenizer_config.json above 576" in f.fix


def test_image_token_id_not_in_tokenizer(tmp_path: Path) -> None:
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "config.json", image_token_index=32001)
    [f] = _errors(d)
    assert f.code == "HF004" and "set image_token_index=32000" in f.fix


def test_qwen2_vl_merge_size(tmp_path: Path) -> None:
    d = _copy(tmp_path, "Qwen2-VL-2B-Instruct")
    _edit(d / "preprocessor_config.json", merge_size=1)
    errs = {f.code: f for f in _errors(d)}
    f = errs["HF006"]
    assert (f.evidence["processor"], f.evidence["model"]) == (1, 2)
    assert f.evidence["image_tokens"] == 4 * f.evidence["image_features"]
    # unmerged, an image at max_pixels is 65536 tokens: beyond the 32768 context
    assert (errs["HF005"].evidence["image_tokens"], errs["HF005"].evidence["limit"]) == (65536, 32768)


def test_qwen2_vl_projector_output(tmp_path: Path) -> None:
    d = _copy(tmp_path, "Qwen2-VL-2B-Instruct")
    _edit(d / "config.json", vision_config__hidden_size=3584)
    [f] = _errors(d)
    assert f.code == "HF003" and (f.evidence["projector_out"], f.evidence["text_hidden"]) == (3584, 1536)


def test_paligemma_seq_length_and_projection(tmp_path: Path) -> None:
    d = _copy(tmp_path, "paligemma-3b-pt-224")
    _edit(d / "preprocessor_config.json", image_seq_length=196)
    _edit(d / "config.json", vision_config__projection_dim=2304)
    errs = {f.code: f for f in _errors(d)}
    assert errs["HF001"].evidence == {"image_tokens": 196, "image_features": 256}
    assert errs["HF003"].evidence["projector_out"] == 2304


def test_invalid_json_and_non_vlm(tmp_path: Path) -> None:
    d = _copy(tmp_path, "paligemma-3b-pt-224")
    (d / "preprocessor_config.json").write_text("{not json")
    found = list(check_vlm_coupling(d, None))
    assert any(f.code == "HF007" for f in found)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert list(check_vlm_coupling(tmp_path / "bert", None)) == []


@pytest.mark.parametrize("size", [(336, 336), (480, 640), (1000, 300), (672, 672), (300, 1000), (1024, 768)])
def test_anyres_matches_transformers(size: tuple[int, int]) -> None:
    pytest.importorskip("transformers", reason="compares with transformers (usg[torch])")
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    pins = json.loads((HF / "llava-v1.6-mistral-7b-hf" / "config.json").read_text())["image_grid_pinpoints"]
    ns = SimpleNamespace(
        image_processor=SimpleNamespace(image_grid_pinpoints=pins),
        patch_size=14,
        num_additional_image_tokens=1,
        vision_feature_select_strategy="default",
    )
    ns._get_unpadded_features = lambda *a: LlavaNextProcessor._get_unpadded_features(ns, *a)
    expected = LlavaNextProcessor._get_number_of_features(ns, size[0], size[1], 336, 336) - 1  # "default"
    assert anyres_tokens(size, 336, 14, pins, 576) == expected


@pytest.mark.parametrize("size", [(448, 448), (1080, 1920), (20, 30), (5000, 4000)])
def test_qwen_resize_matches_transformers(size: tuple[int, int]) -> None:
    pytest.importorskip("transformers", reason="compares with transformers (usg[torch])")
    # the module imports torchvision, which is not installed: take the function's own source
    import ast
    import importlib.util
    import math

    spec = importlib.util.find_spec("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    scope: dict[str, Any] = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), spec.origin, "exec"), scope)
    smart_resize = scope["smart_resize"]
    assert qwen2_vl_resize(*size, 28, 3136, 12845056) == smart_resize(*size, 28, 3136, 12845056)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "config.json holds a JSON list, not the object save_pretrained writes"),
        ("[" * 100_000 + "]" * 100_000, "config.json is not valid JSON: it nests deeper than the JSON parser reads"),
    ],
)
def test_a_config_that_is_not_an_object_is_a_finding_not_no_findings(tmp_path: Path, text: str, message: str) -> None:
    """A list passed with 'no findings'; deep nesting was a DOCTOR001 'check crashed' finding."""
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    (d / "config.json").write_text(text)
    found = list(check_vlm_coupling(d))
    assert [f.code for f in found] == ["HF007"] and message in found[0].message


@pytest.mark.parametrize(
    ("field", "value"),
    [("vision_config__patch_size", -14), ("vision_config__patch_size", 0), ("vision_config__image_size", "336")],
)
def test_a_size_that_is_not_a_positive_integer_is_named(tmp_path: Path, field: str, value: Any) -> None:
    """patch_size -14 gave (336/-14)² = 576 vision features and no finding about it."""
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "config.json", **{field: value})
    messages = [f.message for f in check_vlm_coupling(d) if f.code == "HF007"]
    name = field.replace("__", ".")
    assert any(f"{name} is {value!r}; a size must be a positive integer" in m for m in messages), messages


@pytest.mark.parametrize("value", [14.5, float("inf")])
def test_a_size_that_is_a_fraction_or_infinite_is_named(tmp_path: Path, value: float) -> None:
    """14.5 was read as 14 (int() truncates); Infinity (Python's json reads it) was an OverflowError
    that ended as a 'check crashed' finding."""
    d = _copy(tmp_path, "llava-1.5-7b-hf")
    _edit(d / "config.json", vision_config__patch_size=value)
    found = list(check_vlm_coupling(d))
    messages = [f.message for f in found if f.code == "HF007"]
    assert any(f"vision_config.patch_size is {value!r}; a size must be a positive integer" in m for m in messages), [
        (f.code, f.message) for f in found
    ]
