"""usg doctor parity: PyTorch vs ONNX Runtime on batch 1/2/7 and several sizes of every dynamic axis."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from usg.cli.doctor_parity_cmd import parity  # noqa: E402
from usg.doctor.findings import RootCause, Severity  # noqa: E402
from usg.doctor.parity.export import parse_dynamic_axes  # noqa: E402
from usg.doctor.parity.run import plan_shapes, run_parity  # noqa: E402
from usg.errors import UsageError  # noqa: E402

RES = Path(__file__).parents[1] / "resources"
MODELS = RES / "parity_models.py"

pytestmark = [
    # the exporters warn about tracing/deprecations we trigger on purpose (frozen shapes)
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


@pytest.fixture(autouse=True)
def _resources_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(RES))


def _codes(report) -> list[str]:
    return [f.code for f in report.findings]


def test_plan_covers_batch_1_2_7_and_three_sizes_per_axis() -> None:
    plan = dict(plan_shapes({"batch": 2, "h": 8, "w": 8}, {"batch"}))
    batches = {p["batch"] for p in plan.values()}
    assert {1, 2, 7} <= batches
    for axis in ("h", "w"):
        assert len({p[axis] for p in plan.values()}) >= 3
    assert plan["export"] == {"batch": 2, "h": 8, "w": 8}


@pytest.mark.parametrize("factory", ["interp_align_false", "interp_align_true"])
def test_interpolate_align_corners_parity_at_many_sizes(factory: str) -> None:
    report = run_parity(f"parity_models:{factory}", dynamic_axes=parse_dynamic_axes("x:0=batch,2=h,3=w"))
    assert report.exporter == "legacy"
    assert [f.severity for f in report.findings] == [Severity.INFO]
    assert len(report.cases) >= 7
    assert {c.sizes["h"] for c in report.cases} >= {4, 8, 16}
    for case in report.cases:
        assert case.passed, case
        assert max(case.max_abs_err) < 1e-4


def test_interpolate_semantic_drift_is_located(tmp_path: Path) -> None:
    """ONNX exported with align_corners=True, torch running align_corners=False: drift is in 'up'."""
    axes = parse_dynamic_axes("x:0=batch,2=h,3=w")
    run_parity("parity_models:interp_align_true", dynamic_axes=axes, workdir=tmp_path)
    onnx_file = tmp_path / "model_legacy.onnx"
    report = run_parity("parity_models:interp_align_false", onnx_path=onnx_file)
    drift = [f for f in report.findings if f.code == "PAR002"]
    assert len(drift) == 1
    f = drift[0]
    assert f.root_cause is RootCause.OP_SEMANTIC_DRIFT and f.severity is Severity.ERROR
    first = f.evidence["first_divergence"]
    assert first["method"] == "torch_modules" and first["where"] == "up"
    resize = first["drift_prone_ops"]["/up/Resize"]
    assert resize["coordinate_transformation_mode"] == "align_corners"
    assert max(f.evidence["max_abs_err"]) > 1e-2
    # the stem conv before it agrees, so the first divergence is not 'stem'
    assert "stem" not in first["where"]


def test_frozen_batch_legacy_names_the_reshape() -> None:
    report = run_parity("parity_models:frozen_batch", exporter="legacy")
    assert report.exporter == "legacy"
    frozen = [f for f in report.findings if f.code == "PAR001"]
    assert len(frozen) == 1
    f = frozen[0]
    assert f.root_cause is RootCause.DYNAMIC_SHAPE_FIXED
    assert f.location.element == "/Reshape"
    node = f.evidence["frozen_nodes"][0]
    assert node["op_type"] == "Reshape" and node["values"] == (2, -1)
    failing = {c["label"] for c in f.evidence["failing_cases"]}
    assert failing == {"batch=1", "batch=7"}
    export = report.cases[0]
    assert export.label == "export" and export.passed


def test_frozen_batch_dynamo_fixes_the_input_dim() -> None:
    report = run_parity("parity_models:frozen_batch", exporter="dynamo")
    assert report.exporter == "dynamo"
    codes = _codes(report)
    assert "PAR005" in codes and "PAR001" in codes
    par005 = next(f for f in report.findings if f.code == "PAR005")
    assert par005.evidence["onnx_dim"] == 2 and par005.evidence["axis"] == 0


def test_op_needing_newer_opset_is_retried_at_that_opset() -> None:
    report = run_parity("parity_models:attention", opset=13)
    failed = [f for f in report.findings if f.code == "PAR003"]
    assert len(failed) == 1
    f = failed[0]
    assert f.root_cause is RootCause.UNSUPPORTED_OP and f.severity is Severity.WARNING
    assert f.evidence["operator"] == "aten::scaled_dot_product_attention"
    assert (f.evidence["opset"], f.evidence["opset_with_support"]) == (13, 14)
    assert report.exporter == "legacy" and all(c.passed for c in report.cases)


def test_op_without_legacy_symbolic_falls_back_to_dynamo() -> None:
    report = run_parity("parity_models:antialias")
    failed = next(f for f in report.findings if f.code == "PAR003")
    assert failed.evidence["operator"] == "aten::_upsample_bilinear2d_aa"
    assert "dynamo" in failed.fix
    assert report.exporter == "dynamo"
    assert all(c.passed for c in report.cases)


def test_both_exporters_failing_is_an_error() -> None:
    report = run_parity("parity_models:antialias", exporter="legacy")
    assert report.exporter is None and report.cases == []
    assert [f.severity for f in report.findings] == [Severity.ERROR]


@pytest.mark.slow
def test_minilm_clean_parity() -> None:
    report = run_parity(
        "parity_models:minilm",
        dynamic_axes=parse_dynamic_axes("input_ids:0=batch,1=seq;attention_mask:0=batch,1=seq"),
    )
    assert [f.code for f in report.findings] == ["PAR000"]
    assert {c.sizes["batch"] for c in report.cases} >= {1, 2, 7}
    assert len({c.sizes["seq"] for c in report.cases}) >= 3
    errs = {c.label: max(c.max_abs_err) for c in report.cases}
    assert all(c.passed for c in report.cases)
    assert max(errs.values()) < 1e-4, errs


def test_cli_file_path_factory_json_exit_1() -> None:
    res = CliRunner().invoke(parity, ["--torch", f"{MODELS}:frozen_batch", "--exporter", "legacy", "--format", "json"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.output)["findings"]
    assert [d["code"] for d in data] == ["PAR001", "PAR000"]
    assert data[0]["root_cause"] == "dynamic_shape_fixed" and data[0]["stage"] == "parity"


def test_cli_clean_exit_0_text(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        parity,
        ["--torch", f"{MODELS}:interp_align_false", "--sizes", "batch=1,3", "--save-onnx", str(tmp_path)],
    )
    assert res.exit_code == 0, res.output
    assert "exporter: legacy" in res.output and "batch=3" in res.output
    assert (tmp_path / "model_legacy.onnx").is_file()


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon", "not of the form"),
        ("missing_module_xyz:f", "cannot import module"),
        (f"{RES}/nope.py:f", "does not exist"),
        ("parity_models:not_a_pair", r"must return \(model, example_inputs\)"),
    ],
)
def test_bad_factory_is_usage_error(spec: str, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        run_parity(spec)


def test_bad_dynamic_axes_is_usage_error() -> None:
    with pytest.raises(UsageError, match="lacks ':'"):
        parse_dynamic_axes("x0=batch")
    assert parse_dynamic_axes('{"x": [0, 2]}') == {"x": {0: "x_dim0", 2: "x_dim2"}}


def test_missing_torch_raises_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    from usg.doctor.parity import export as parity_export
    from usg.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependency, match=r"pip install 'usg\[torch\]'"):
        parity_export.import_torch()


def test_fp64_reference_finds_the_node_that_loses_precision() -> None:
    """(x + 1.5) - x at x = 1e8: float32 cancels to 0, the float64 run of the same graph gives 1.5."""
    import numpy as np
    from onnx import TensorProto, helper

    from usg.doctor.parity.bisection import first_divergence_fp64

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Sub", ["a", "x"], ["d"], name="cancel"),
        helper.make_node("Relu", ["d"], ["y"], name="relu"),
    ]
    const = helper.make_tensor("c", TensorProto.FLOAT, [], [1.5])
    graph = helper.make_graph(nodes, "g", [x], [y], [const])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    div = first_divergence_fp64(model, {"x": np.array([1e8, 1.0, -3.0], dtype=np.float32)}, 1e-4, 1e-3)
    assert div is not None
    assert (div.method, div.where) == ("fp64_reference", "cancel")
    assert div.max_abs_err == pytest.approx(1.5)
    ok = first_divergence_fp64(model, {"x": np.array([1.0, 2.0, -3.0], dtype=np.float32)}, 1e-4, 1e-3)
    assert ok is None


def _raising_factory():
    raise RuntimeError("the checkpoint is not there")


class _Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _double():
    return _Double(), {"x": torch.randn(1, 4)}


def test_a_factory_that_raises_is_the_users_error_with_where_not_a_usg_bug() -> None:
    with pytest.raises(UsageError, match=r"raised RuntimeError: the checkpoint is not there \(at .*test_doctor_parity"):
        run_parity(_raising_factory, None, None)


def _factory_torch_refuses():
    return torch.nn.Linear(-1, 3), {"x": torch.randn(1, 4)}  # raises inside torch


def test_a_factory_error_raised_inside_a_library_names_the_factorys_line() -> None:
    """The place given was the deepest frame: torch's own file (torch/nn/modules/linear.py), not the user's line."""
    line = _factory_torch_refuses.__code__.co_firstlineno + 1
    with pytest.raises(UsageError, match=rf"raised RuntimeError: .*\(at .*test_doctor_parity\.py:{line}\)"):
        run_parity(_factory_torch_refuses, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "batch=0"], "sizes must be at least 1"),
        (["--sizes", "batch=-1"], "sizes must be at least 1"),  # was an internal error (negative dimension)
        (["--atol", "-1"], "is not in the range x>=0"),
    ],
)
def test_sizes_and_tolerances_are_checked_before_anything_runs(args: list[str], message: str) -> None:
    result = CliRunner().invoke(parity, ["--torch", "m.py:f", *args])
    text = result.output + str(result.exception or "")
    assert result.exit_code != 0 and message in text


def test_a_size_whose_input_would_pass_a_gibibyte_is_refused_before_it_is_made() -> None:
    """--sizes batch=100000000 on a [1, 4] input allocated 12.8 GB before comparing."""
    with pytest.raises(UsageError, match=r"shape \[100000000, 4\] \(torch.float32\) would take 1.5 GiB"):
        run_parity(_double, None, None, sizes={"batch": [100_000_000]})


class _Masked(torch.nn.Module):
    def forward(self, ids, mask):
        return (ids.float() * mask.float()).sum(-1)


def _masked():
    return _Masked(), {"ids": torch.randint(0, 100, (2, 5)), "mask": torch.ones(2, 5, dtype=torch.long)}


@pytest.mark.parametrize(
    ("axes", "sizes", "match"),
    [
        # before: the misspelt 'maks' was ignored, only ids grew, torch failed at every case (PAR004 warnings, exit 0)
        ("ids:0=batch,1=seq;maks:0=batch,1=seq", None, r"names input 'maks'.*fix: did you mean 'mask'\?"),
        # before: a PAR003 "exporter failed" error
        ("ids:5=batch", None, r"axis 5, but its example is rank 2.*fix: use an axis from 0 to 1"),
        # before: the unknown symbol was ignored and the default sizes ran (exit 0)
        (None, {"sqe": [3, 9]}, r"--sizes names symbol\(s\) \['sqe'\].*symbols: \['batch'\]"),
    ],
)
def test_dynamic_axes_and_sizes_that_name_nothing_are_usage_errors(axes, sizes, match) -> None:
    with pytest.raises(UsageError, match=match):
        run_parity(_masked, None, parse_dynamic_axes(axes), sizes=sizes)
