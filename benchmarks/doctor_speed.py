"""How fast is `usg doctor`? Prints measured times; goals: 400 configs < 5 s, a 100-node ONNX model < 1 s.

Run: python benchmarks/doctor_speed.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from usg.doctor import render, run_doctor

CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: {mbs}
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 256 ] }} ]
dynamic_batching {{ preferred_batch_size: [ {pref} ] max_queue_delay_microseconds: 100 }}
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
version_policy: {{ latest: {{ num_versions: 1 }} }}
"""


def make_repo(root: Path, n: int) -> Path:
    for i in range(n):
        d = root / f"model_{i:03d}"
        (d / "1").mkdir(parents=True)
        backend, filename = ("python", "model.py") if i % 2 else ("tensorrt", "model.plan")
        # every 10th model carries a defect, so the checks do real work on findings too
        mbs = 8 if i % 10 else 0
        pref = "4, 8" if i % 7 else "4, 16"
        (d / "config.pbtxt").write_text(CONFIG.format(name=d.name, backend=backend, mbs=mbs, pref=pref))
        (d / "1" / filename).write_text("placeholder\n")
    return root


def make_onnx(path: Path, n_nodes: int = 100, width: int = 64) -> Path:
    nodes, inits = [], []
    prev = "x"
    rng = np.random.default_rng(0)
    for i in range(n_nodes // 2):
        w = numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul_{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu_{i}"))
        prev = f"r{i}"
    nodes[-1].output[0] = "y"
    g = helper.make_graph(
        nodes,
        "bench",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", width])],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = make_repo(root / "repo", 400)
        model = make_onnx(root / "bench.onnx")
        run_doctor([make_onnx(root / "warm.onnx", 4)])  # import onnxruntime etc. once, outside the timing

        t0 = time.perf_counter()
        report = run_doctor([repo])
        t1 = time.perf_counter()
        text = render(report.findings, "text")
        sarif = render(report.findings, "sarif")
        t2 = time.perf_counter()
        n_configs = sum(1 for t in report.targets if t.kind == "triton_model")
        print(
            f"triton: {n_configs} config.pbtxt checked in {t1 - t0:.3f} s "
            f"({(t1 - t0) / n_configs * 1000:.2f} ms each; goal < 5 s), "
            f"{len(report.findings)} findings, text+sarif render {t2 - t1:.3f} s "
            f"({len(text) + len(sarif)} chars)"
        )

        n_nodes = len(onnx.load(str(model), load_external_data=False).graph.node)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            onnx_report = run_doctor([model])
            times.append(time.perf_counter() - t0)
        print(
            f"onnx:   {n_nodes}-node model checked in {times[0]:.3f} s first run, {min(times):.3f} s best "
            f"of 3 (goal < 1 s; includes onnx.checker, strict shape inference and an ORT session), "
            f"{len(onnx_report.findings)} findings"
        )


if __name__ == "__main__":
    main()
