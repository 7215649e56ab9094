from pathlib import Path

import pytest

from usg.errors import GraphError
from usg.graph import GraphBuilder, load_graph
from usg.graph.paths import resolve_path


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return p


def test_malformed_yaml_names_line_and_column(tmp_path):
    p = write(tmp_path, "name: x\nnodes:\n  a: {fn: testops:upper, inputs: {text: inputs.text}\n")
    with pytest.raises(GraphError, match=r"g\.yaml:\d+:\d+: malformed YAML") as exc:
        load_graph(p)
    assert "fix:" in str(exc.value)


def test_missing_graph_file(tmp_path):
    with pytest.raises(GraphError, match="graph file does not exist"):
        load_graph(tmp_path / "nope.yaml")


def test_cycle_is_reported_with_its_path(tmp_path):
    p = write(
        tmp_path,
        """
inputs: {text: {modality: text}}
nodes:
  a: {fn: "testops:upper", inputs: {text: b.text}}
  b: {fn: "testops:upper", inputs: {text: a.text}}
outputs: {out: a.text}
""",
    )
    with pytest.raises(GraphError, match=r"cycle: (a -> b -> a|b -> a -> b)") as exc:
        load_graph(p)
    assert "break the cycle" in str(exc.value)


def test_unknown_fn_module_and_attribute(tmp_path):
    p = write(
        tmp_path,
        """
inputs: {text: {modality: text}}
nodes:
  a: {fn: "testops:uper", inputs: {text: inputs.text}}
  b: {fn: "no_such_module_xyz:f", inputs: {text: inputs.text}}
outputs: {a: a.text, b: b.text}
""",
    )
    with pytest.raises(GraphError) as exc:
        load_graph(p)
    msg = str(exc.value)
    assert "2 problems" in msg
    assert "'testops' has no attribute 'uper'" in msg and "upper" in msg
    assert "module 'no_such_module_xyz' cannot be imported" in msg


def test_every_problem_is_collected_once(tmp_path):
    p = write(
        tmp_path,
        """
inputs: {text: {modality: text}, img: {modality: picture}}
models:
  m: {backend: onnxruntime, path: missing.onnx}
  t: {backend: nosuch}
nodes:
  a: {fn: "testops:upper", inputs: {text: inputs.txt}}
  b: {model: mm, inputs: {x: a.text}}
  c: {fn: "testops:upper", model: m, inputs: {text: zz.text}}
  d: {fn: "testops:upper", inputs: {text: inputs.text}, bogus: 1}
outputs: {o: a.text}
""",
    )
    with pytest.raises(GraphError) as exc:
        load_graph(p)
    text = str(exc.value)
    for fragment in [
        "unknown modality 'picture'",
        "model file",
        "missing.onnx does not exist",
        "unknown backend 'nosuch'",
        "unknown graph input 'inputs.txt'",
        "did you mean 'text'",
        "unknown model 'mm'",
        "exactly one of 'model' or 'fn'",
        "unknown node 'zz'",
        "unknown key 'bogus'",
    ]:
        assert fragment in text, fragment
    assert len(exc.value.problems) == 8
    assert all(p.fix for p in exc.value.problems)


def test_onnx_port_names_and_edge_dtypes_checked_against_the_model(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime", reason="uses the PP-OCR ONNX files of usg[ocr]")
    det = "pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
    p = write(
        tmp_path,
        f"""
inputs: {{image: {{modality: image}}}}
models:
  det: {{path: "{det}"}}
nodes:
  raw: {{fn: "testops:raw_image", inputs: {{image: inputs.image}}}}
  det: {{model: det, inputs: {{x: raw.hwc, y: raw.hwc}}}}
outputs: {{p: det.sigmoid_0.tmp_0, q: det.nope}}
""",
    )
    with pytest.raises(GraphError) as exc:
        load_graph(p)
    text = str(exc.value)
    assert "model 'det' has no input 'y'" in text and "known: x" in text
    assert "node 'det' has no output 'nope'" in text
    # the uint8 HWC image wired straight into the float32 NCHW model
    assert "raw.hwc (uint8 [H,W,3] HWC) -> det.x (float32" in text
    assert "dtype uint8 flows into float32" in text and "rank 3" in text
    assert "insert a preprocessing node" in text


def test_map_over_single_tensor_and_list_into_tensor(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime", reason="uses the PP-OCR ONNX files of usg[ocr]")
    p = write(
        tmp_path,
        """
inputs: {x: {modality: tensor, dtype: float32, shape: [1, null]}}
models:
  det: {path: "pkg://rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"}
nodes:
  split: {fn: "testops:split_rows", inputs: {x: inputs.x}, map: true}
  split2: {fn: "testops:split_rows", inputs: {x: inputs.x}}
  cls: {model: det, inputs: {x: split2.items}}
outputs: {a: split.items, b: cls.out}
""",
    )
    with pytest.raises(GraphError) as exc:
        load_graph(p)
    text = str(exc.value)
    assert "map over inputs.x, which is a single tensor" in text
    assert "split2.items is a list" in text and "add map: x to nodes.cls" in text


def test_builder_and_yaml_produce_the_same_graph(tmp_path):
    p = write(
        tmp_path,
        """
name: g
inputs: {text: {modality: text, optional: true}}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}}
outputs: {shout: up.text}
""",
    )
    from_yaml = load_graph(p)
    built = (
        GraphBuilder("g")
        .input("text", "text", optional=True)
        .node("up", fn="testops:upper", inputs={"text": "inputs.text"})
        .output("shout", "up.text")
        .build()
    )
    assert built.nodes == from_yaml.nodes
    assert built.inputs == from_yaml.inputs
    assert built.outputs == from_yaml.outputs


def test_pkg_and_relative_paths(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime", reason="uses the PP-OCR ONNX files of usg[ocr]")
    det = resolve_path("pkg://rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", None)
    assert det.is_file()
    assert resolve_path("m.onnx", tmp_path) == (tmp_path / "m.onnx").resolve()
    with pytest.raises(ValueError, match="not installed"):
        resolve_path("pkg://no_such_pkg_xyz/a.onnx", None)


TOKENIZER_GRAPH = """
inputs: {text: {modality: text}}
models:
  tok:
    backend: python
    options: {callable: "testops:identity"%(options)s}
    batch: {max_size: 4%(batch)s}
  file: {backend: tokenizer, path: %(path)s}
nodes:
  t: {model: tok, inputs: {x: inputs.text}}
outputs: {y: t.y}
%(extra)s
"""


def graph_file(tmp_path: Path, *, options: str = "", batch: str = "", path: str = "tok.json", extra: str = "") -> Path:
    (tmp_path / "tok.json").write_text("{}")
    return write(tmp_path, TOKENIZER_GRAPH % {"options": options, "batch": batch, "path": path, "extra": extra})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch": ', pad: {axes: "\\x00"}'}, r"models\.tok\.batch\.pad\.axes: axes is '\\x00'\n.*fix: write axes:"),
        ({"batch": ", pad: {axes: {x: [a]}}"}, r"pad\.axes\.x: expected integers >= 1, got \['a'\]"),
        ({"batch": ", preferred_sizes: 1"}, r"preferred_sizes: preferred_sizes is 1, not a list\n.*\[1\]"),
        ({"path": '"\\x00"'}, r"models\.file\.path: path '\\x00' contains a NUL character"),
        ({"path": "x" * 5000}, r"models\.file\.path: path 'x{60}\.\.\. \(5000 characters\)' is too long"),
        (
            {"options": ", concurrency: all"},
            r"options\.concurrency: concurrency is 'all'\n.*fix: use a positive integer",
        ),
        ({"options": ", call_timeout_ms: -5"}, r"options\.call_timeout_ms: call_timeout_ms is -5\n.*milliseconds"),
        (
            {"extra": "limits: {max_fanout_item: 5}"},
            r"limits\.max_fanout_item: unknown limit 'max_fanout_item'\n.*fix: did you mean 'max_fanout_items'",
        ),
        (
            {"extra": "limits: {max_text_chars: '10k'}"},
            r"limits\.max_text_chars: max_text_chars is '10k'\n.*positive integer",
        ),
    ],
)
def test_bad_graph_fields_are_graph_errors_naming_field_value_and_fix(tmp_path, kwargs, match):
    with pytest.raises(GraphError, match=match):
        load_graph(graph_file(tmp_path, **kwargs))


def test_limits_are_parsed_with_defaults_and_round_trip(tmp_path):
    g = load_graph(graph_file(tmp_path, extra="limits: {max_fanout_items: 64}"))
    assert (g.limits.max_fanout_items, g.limits.max_text_chars) == (64, 20_000)
    assert g.limits.declared() == {"max_fanout_items": 64}
    assert load_graph(graph_file(tmp_path)).limits.declared() == {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # before: OverflowError / ValueError from int(inf) / int(nan), shown as "internal error"
        ({"batch": ", max_queue: .inf"}, r"batch\.max_queue: max_queue is inf\n.*fix: use a finite, non-negative int"),
        ({"batch": ", max_tokens: .nan"}, r"batch\.max_tokens: max_tokens is nan\n.*finite"),
        # before: accepted; a batch waited forever for company, a nan cap compared false with everything
        ({"batch": ", max_delay_ms: .inf"}, r"batch\.max_delay_ms: max_delay_ms is inf\n.*finite, non-negative float"),
        ({"batch": ", max_pad_waste: .nan"}, r"batch\.max_pad_waste: max_pad_waste is nan"),
        ({"batch": ", pad: {axes: [1], multiple: 8, value: .nan}"}, r"pad\.value: pad value nan is not a number"),
        ({"extra": "limits: {max_aspect_ratio: .nan}"}, r"limits\.max_aspect_ratio: max_aspect_ratio is nan"),
    ],
)
def test_non_finite_numbers_are_graph_errors_naming_field_value_and_fix(tmp_path, kwargs, match):
    with pytest.raises(GraphError, match=match):
        load_graph(graph_file(tmp_path, **kwargs))


@pytest.mark.parametrize(
    ("field", "match"),
    [
        ("batch: {max_size: .inf}", r"models\.tok\.batch\.max_size: max_size is inf"),
        ("batch: {max_size: .nan}", r"models\.tok\.batch\.max_size: max_size is nan"),
    ],
)
def test_a_non_finite_max_size_is_a_graph_error(tmp_path, field, match):
    text = TOKENIZER_GRAPH.replace("batch: {max_size: 4%(batch)s}", field)
    p = write(tmp_path, text % {"options": "", "path": "tok.json", "extra": ""})
    (tmp_path / "tok.json").write_text("{}")
    with pytest.raises(GraphError, match=match):
        load_graph(p)


@pytest.mark.parametrize(
    ("audio", "match"),
    [
        ("sample_rate: .inf", r"inputs\.a\.sample_rate: sample_rate is inf\n.*fix: write a positive int, e\.g\. 16000"),
        ("max_seconds: .nan", r"inputs\.a\.max_seconds: max_seconds is nan"),
        ("max_seconds: .inf", r"inputs\.a\.max_seconds: max_seconds is inf"),
    ],
)
def test_non_finite_audio_fields_are_graph_errors(tmp_path, audio, match):
    text = "inputs: {a: {modality: audio, AUDIO}}\n" + "nodes:\n  u: {fn: 'testops:identity', inputs: {x: inputs.a}}\n"
    text = text.replace("AUDIO", audio) + "outputs: {y: u.y}\n"
    with pytest.raises(GraphError, match=match):
        load_graph(write(tmp_path, text))


@pytest.mark.parametrize(
    ("path", "match"),
    [
        # before: ModuleNotFoundError / ImportError out of importlib, shown as "internal error"
        (
            "pkg://usg_no_such_pkg.sub/m.onnx",
            r"models\.file\.path: package 'usg_no_such_pkg\.sub' named by .* cannot be found \(No module named",
        ),
        ("pkg://../m.onnx", r"models\.file\.path: package '\.\.' named by 'pkg://\.\./m\.onnx' cannot be found"),
    ],
)
def test_a_pkg_path_to_a_package_that_cannot_be_imported_is_a_graph_error(tmp_path, path, match):
    with pytest.raises(GraphError, match=match) as exc:
        load_graph(graph_file(tmp_path, path=path))
    assert "fix: write pkg://PACKAGE/relative/path" in str(exc.value)


def test_a_model_path_through_a_symlink_loop_is_a_graph_error(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(GraphError, match=r"models\.file\.path: path 'a/m\.onnx' cannot be resolved: .*\n.*symbolic"):
        load_graph(graph_file(tmp_path, path="a/m.onnx"))


def test_a_model_path_that_is_a_directory_or_a_device_says_so(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tok.json").write_text("{}")
    # before: "model file .../models does not exist" for a folder that exists
    with pytest.raises(
        GraphError,
        match=r"models\.file\.path: model path .*models is a directory, not a model file "
        r"\(model files in it: tok\.json\)\n.*fix: point path at the model file inside it",
    ):
        load_graph(graph_file(tmp_path, path="models"))
    with pytest.raises(GraphError, match=r"model path /dev/null is not a regular file \(a device, pipe or socket\)"):
        load_graph(graph_file(tmp_path, path="/dev/null"))
    with pytest.raises(GraphError, match=r"model file .*nope\.json does not exist\n.*fix: check the path"):
        load_graph(graph_file(tmp_path, path="nope.json"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # before: the list of keys only, no hint at the one meant
        (
            {"batch": ", max_sise: 8"},
            r"batch\.max_sise: unknown key 'max_sise'\n.*fix: did you mean 'max_size'\? remove",
        ),
        ({"extra": "limts: {}"}, r"graph\.limts: unknown key 'limts'\n.*fix: did you mean 'limits'\?"),
        ({"extra": "deploy: {routr: {}}"}, r"deploy\.routr: unknown key 'routr'\n.*fix: did you mean 'router'\?"),
        ({"extra": "deploy: {router: {num_replica: 2}}"}, r"did you mean 'num_replicas'\?"),
    ],
)
def test_a_misspelled_key_gets_the_close_match(tmp_path, kwargs, match):
    with pytest.raises(GraphError, match=match):
        load_graph(graph_file(tmp_path, **kwargs))


def test_a_key_close_to_nothing_gets_the_list_only(tmp_path):
    with pytest.raises(GraphError, match=r"graph\.zzzz: unknown key 'zzzz'\n.*fix: remove it, or use one of: cache,"):
        load_graph(graph_file(tmp_path, extra="zzzz: 1"))


def test_an_empty_environment_variable_is_named_as_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("USG_TEST_EMPTY_DIR", "")
    monkeypatch.delenv("USG_TEST_UNSET_DIR", raising=False)
    # before: "is not set" for a variable that is set (to nothing)
    with pytest.raises(GraphError, match=r"environment variable \$\{USG_TEST_EMPTY_DIR\} is set but empty"):
        load_graph(graph_file(tmp_path, path='"${USG_TEST_EMPTY_DIR}/tok.json"'))
    with pytest.raises(GraphError, match=r"environment variable \$\{USG_TEST_UNSET_DIR\} is not set\n.*fix: export"):
        load_graph(graph_file(tmp_path, path='"${USG_TEST_UNSET_DIR}/tok.json"'))


def test_a_fn_node_wired_to_a_port_its_function_does_not_take(tmp_path):
    # the quick start's text_area(prob, *, threshold) wired as `probs:` built, then every request
    # failed with "raised TypeError: text_area() got an unexpected keyword argument 'probs'"
    (tmp_path / "area_ops.py").write_text(
        "def text_area(prob, *, threshold=0.3):\n    return {'fraction': prob}\n"
        "def any_port(**ports):\n    return {'out': 1}\n"
    )
    p = tmp_path / "g.yaml"
    p.write_text(
        """
inputs: {x: {modality: tensor}}
nodes:
  area: {fn: "area_ops:text_area", inputs: {probs: inputs.x}, options: {threshold: 0.5}}
  free: {fn: "area_ops:any_port", inputs: {whatever: inputs.x}}
outputs: {fraction: area.fraction, out: free.out}
"""
    )
    with pytest.raises(GraphError) as exc:
        load_graph(p)
    text = str(exc.value)
    assert "nodes.area.inputs.probs: fn 'area_ops:text_area' takes no argument 'probs'" in text
    assert "did you mean 'prob'?" in text
    assert "nodes.area.inputs: fn 'area_ops:text_area' needs argument 'prob'" in text
    assert "free" not in text  # **kwargs takes any port
    assert len(exc.value.problems) == 2


def test_an_onnx_model_given_as_the_graph_points_at_usg_init(tmp_path):
    # `usg run model.onnx -i ...`: was "graph is invalid ... fix: pass a UTF-8 YAML file" (no file named)
    model = tmp_path / "det.onnx"
    model.write_bytes(b"\x08\x08\x3a\xa0\xff\x00binary protobuf")
    with pytest.raises(GraphError, match=r"^graph '.*det\.onnx' is invalid") as exc:
        load_graph(model)
    assert f"fix: det.onnx is an ONNX model, not a graph: `usg init {model}` writes a runnable graph" in str(exc.value)
