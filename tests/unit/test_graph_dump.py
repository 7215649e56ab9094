"""graph_to_mapping is the loader's inverse: dump → YAML → load gives an equal graph."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from usg.graph import load_graph
from usg.graph.deploy import DeployPolicy, DeploySpec
from usg.graph.dump import graph_to_mapping
from usg.graph.model import BatchPolicy, Graph

GRAPH = """
name: every-field
inputs:
  text: {modality: text, optional: true}
  x: {modality: tensor, dtype: float32, shape: [1, N], range: [0, 1]}
limits: {max_image_pixels: 1000}
cache: {backend: memory, max_bytes: 1000, ttl_s: 5, default: true, hmac_key_env: USG_CACHE_KEY}
models:
  m:
    backend: python
    options: {callable: "testops:identity", concurrency: 2}
    inputs: {x: {range: [0, 1]}}
    export: {exporter: hf-text-encoder, source: somewhere}
    batch:
      max_size: 8
      max_delay_ms: 2.5
      preferred_sizes: [4, 8]
      max_tokens: 512
      max_queue: 64
      max_pad_waste: 0.5
      adaptive: true
      target_p95_ms: 150
      pad: {axes: {x: [1]}, buckets: [16, 32], multiple: 8, value: {x: -1}, trim: {y: {1: "x:1/1"}}}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}, cache: {ttl_s: 9}}
  split: {fn: "testops:split_rows", inputs: {x: inputs.x}, options: {parts: 2}, cache: false}
  dbl: {model: m, map: [x], inputs: {x: split.items}}
outputs: {upper: up.text, y: dbl.y, raw: inputs.x}
deploy:
  router: {num_replicas: 2, num_cpus: 0.5}
  models: {m: {min_replicas: 1, max_replicas: 3, target_ongoing_requests: 4, num_gpus: 1}}
  nodes: {up: {own_deployment: true}, split: {own_deployment: false}}
"""


def _load(tmp_path: Path, name: str, text: str) -> Graph:
    p = tmp_path / name
    p.write_text(text)
    return load_graph(p)


def _same(a: Graph, b: Graph) -> None:
    for f in dataclasses.fields(Graph):
        if f.name != "source":
            assert getattr(a, f.name) == getattr(b, f.name), f.name


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    g = _load(tmp_path, "g.yaml", GRAPH)
    assert g.models["m"].batch.pad is not None and g.deploy.nodes  # the fixture sets every part
    assert g.nodes["up"].cache.ttl_s == 9 and g.nodes["split"].cache is None and g.nodes["dbl"].cache is not None
    again = _load(tmp_path, "again.yaml", yaml.safe_dump(graph_to_mapping(g), sort_keys=False))
    _same(g, again)


def test_every_data_model_field_is_exercised_by_the_round_trip_fixture(tmp_path: Path) -> None:
    """A new field with a non-default value in the fixture must survive the dump (or this fails)."""
    g = _load(tmp_path, "g.yaml", GRAPH)
    batch = g.models["m"].batch
    unset = [
        f.name for f in dataclasses.fields(BatchPolicy) if getattr(batch, f.name) == getattr(BatchPolicy(), f.name)
    ]
    assert unset == ["max_pixels"]  # max_tokens and max_pixels are alternatives; max_pixels checked below
    policy = g.deploy.model("m")
    assert policy != DeployPolicy() and g.deploy != DeploySpec()
    pixels = dataclasses.replace(
        g, models={"m": dataclasses.replace(g.models["m"], batch=dataclasses.replace(batch, max_pixels=9))}
    )
    assert graph_to_mapping(pixels)["models"]["m"]["batch"]["max_pixels"] == 9


def test_model_paths_are_replaced_where_asked(tmp_path: Path) -> None:
    g = _load(tmp_path, "g.yaml", GRAPH)
    doc = graph_to_mapping(g, model_paths={"m": "m/1/model.onnx"})
    assert doc["models"]["m"]["path"] == "m/1/model.onnx"
    assert list(doc["nodes"]) == list(g.nodes)
