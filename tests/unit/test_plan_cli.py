"""``usg plan`` through the real command group and entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from usg.cli import cli, main
from usg.errors import UsageError

RES = Path(__file__).resolve().parents[1] / "resources" / "plan"
LLAMA3 = str(RES / "llama-3-8b.json")


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["plan", *args])


def test_table_output_for_llama3_on_l4() -> None:
    r = run(LLAMA3, "--gpu", "L4", "--max-model-len", "8192", "--concurrency", "16")
    assert r.exit_code == 0, r.output
    assert "DOES NOT FIT" in r.output
    assert "KV per token" in r.output and "128.00 KiB" in r.output
    assert "vllm serve llama-3-8b --gpu-memory-utilization 0.90 --max-model-len 8192 --max-num-seqs 5" in r.output
    assert "max_batch_size=5" in r.output
    assert "--tensor-parallel-size: 1 → 2" in r.output


def test_json_output_for_a_vlm() -> None:
    r = run(
        str(RES / "qwen2-vl-2b-instruct.json"),
        "--gpu",
        "L4",
        "--max-model-len",
        "8192",
        "--concurrency",
        "16",
        "--images-per-prompt",
        "2",
        "--image-size",
        "448x448",
        "--json",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["fits"] is True and d["model"]["image_tokens"] == 256
    assert d["settings"]["vllm"]["--limit-mm-per-prompt"] == """'{"image": 2}'"""


def test_directory_config_and_gpu_count(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(Path(LLAMA3).read_text())
    r = run(str(tmp_path), "--gpu", "L4x2", "--max-model-len", "8192", "--concurrency", "16", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["tensor_parallel_size"] == 2 and d["fits"] is True


def test_custom_gpu_file(tmp_path: Path) -> None:
    f = tmp_path / "gpus.yaml"
    f.write_text("name: MI300X\nmemory_gb: 192\nbandwidth_gbps: 5300\nbf16_tflops: 1307\n")
    r = run(LLAMA3, "--gpu-file", str(f), "--max-model-len", "8192", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gpu"]["name"] == "MI300X"


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plan.png"
    r = run(LLAMA3, "--gpu", "L4", "--max-model-len", "8192", "--concurrency", "16", "--plot", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_propagate_as_usage_errors() -> None:
    with pytest.raises(UsageError, match=r"--gpu 'B300' is not a known GPU"):
        reraise(run(LLAMA3, "--gpu", "B300"))
    with pytest.raises(UsageError, match=r"no GPU given; fix: pass --gpu NAME\[xN\]"):
        reraise(run(LLAMA3, "--max-model-len", "8192"))
    with pytest.raises(UsageError, match=r"--image-size 'big' is not WIDTHxHEIGHT"):
        reraise(run(LLAMA3, "--gpu", "L4", "--image-size", "big"))


def reraise(result: Result) -> None:
    """CliRunner keeps the exception; USG errors must reach the caller, not become a traceback print."""
    assert result.exception is not None, result.output
    raise result.exception


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "L4", "--concurrency", "-4"], "--concurrency -4 must be >= 1"),
        (["--gpu", "NoSuchGPU"], "is not a known GPU"),
        (["--gpu", "L4", "--block-size", "0"], "--block-size 0 must be >= 1"),
        (["--gpu", "L4", "--dtype", "int3"], "--dtype 'int3' is not a known dtype"),
    ],
)
def test_entry_point_exits_2_with_a_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", LLAMA3, *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "/no/such/config.json", "--gpu", "L4"])
    assert exc.value.code == 2
    assert "does not exist; fix: pass a Hugging Face config.json" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from usg.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    r = run(LLAMA3, "--gpu", "L4", "--max-model-len", "8192", "--plot", str(tmp_path / "p.png"))
    with pytest.raises(MissingDependency, match=r"usg plan --plot needs .*'matplotlib'.*pip install 'usg\[report\]'"):
        reraise(r)


def test_plot_into_missing_directory(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = run(LLAMA3, "--gpu", "L4", "--max-model-len", "8192", "--plot", str(tmp_path / "no" / "p.png"))
    with pytest.raises(UsageError, match=r"does not exist; fix: create it first"):
        reraise(r)


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        # before: matplotlib's ValueError as "internal error"
        ("p.txt", UsageError, r"--plot '.*p\.txt': '\.txt' is not a plot format; fix: end the name in one of \.png"),
        # before: exit 0 and "plot written to .../p" while the file was .../p.png
        ("p", UsageError, r"a file name without an extension is not a plot format"),
        # before: exit 0 and "plot written to DIR" while the file was DIR.png, beside it
        (".", UsageError, r"is a directory; fix: name a file in it, e\.g\. .*plan\.png"),
    ],
)
def test_plot_to_a_path_it_cannot_write_as_asked(tmp_path: Path, name: str, error: type, match: str) -> None:
    pytest.importorskip("matplotlib")
    r = run(LLAMA3, "--gpu", "L4", "--plot", str(tmp_path / name))
    with pytest.raises(error, match=match):
        reraise(r)
    assert list(tmp_path.iterdir()) == [] and not tmp_path.with_suffix(".png").exists()


def test_plot_into_an_unwritable_place_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:  # before: NotADirectoryError as "internal error"
        main(["plan", LLAMA3, "--gpu", "L4", "--plot", str(tmp_path / "file" / "p.png")])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "cannot write it (Not a directory); fix: pass a path in a writable directory" in err


def test_vlm_whose_images_fill_the_context_says_so_and_suggests_valid_knobs() -> None:
    r = run(str(RES / "qwen2-vl-2b-instruct.json"), "--gpu", "A10G", "--images-per-prompt", "2")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "DOES NOT FIT (not memory: the 2 image(s) of a prompt fill the 32768-token context)" in text
    assert "--images-per-prompt: 2 → 1" in text and "--image-size: 3584x3584 → 3556x3556" in text
    assert "33024" not in text


LLAMA_FIELDS = (
    '"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000, '
    '"intermediate_size": 11008, "max_position_embeddings": 4096'
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # before: ValueError / OverflowError / RecursionError shown as "internal error"
        ("{" + LLAMA_FIELDS + ', "hidden_size": NaN}', "field 'hidden_size' must be an integer (got nan)"),
        ("{" + LLAMA_FIELDS + ', "hidden_size": Infinity}', "field 'hidden_size' must be an integer (got inf)"),
        ("{" + LLAMA_FIELDS + ', "hidden_size": ' + "9" * 5000 + "}", "(an integer of 5000 digits)"),
        ("[" * 100_000 + "]" * 100_000, "cannot read as JSON (nested too deeply)"),
    ],
)
def test_a_hostile_config_json_exits_1_with_the_field(
    tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(config), "--gpu", "L4"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and message in err and "internal error" not in err, err


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # before: int(nan * GiB) / int(inf * GiB) raised ValueError / OverflowError, shown as "internal error"
        ("g.yaml", "name: X\nmemory_gb: .nan\n", "field 'memory_gb' must be a finite, positive number (got nan)"),
        ("g.yaml", "name: X\nmemory_gb: .inf\n", "field 'memory_gb' must be a finite, positive number (got inf)"),
        ("g.json", '{"name": "X", "memory_gb": NaN}', "field 'memory_gb' must be a finite, positive number (got nan)"),
        # before: RecursionError out of json
        ("g.json", "[" * 100_000 + "]" * 100_000, "cannot parse GPU profiles (nested too deeply)"),
    ],
)
def test_a_hostile_gpu_file_exits_1_with_the_field(
    tmp_path: Path, name: str, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    gpus = tmp_path / name
    gpus.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main(["plan", LLAMA3, "--gpu-file", str(gpus), "--gpu", "X"])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and message in err and "internal error" not in err, err
