"""A graph file read within bounds: alias bombs, deep nesting, huge integers, repeated keys and
files past the size limit are GraphErrors with line, column and fix (never a hang, a
MemoryError or an internal error)."""

from __future__ import annotations

from pathlib import Path

import pytest

from usg.errors import GraphError
from usg.graph import load_graph
from usg.yaml_bounded import YAMLLimitError, load_bounded

BODY = """inputs:
  text: {modality: text}
nodes:
  up: {fn: "testops:upper", inputs: {text: inputs.text}}
outputs:
  up: up.text
"""


def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines)


def _graph(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return p


def test_an_alias_bomb_is_refused_before_anything_walks_it(tmp_path: Path) -> None:
    # 10**7 values once written out; on the old loader `name: *a6` became a 50 MB string
    # (and one level more a MemoryError or a hang)
    text = "description:\n" + "\n".join("  " + line for line in _bomb(7).splitlines()) + "\nname: *a6\n" + BODY
    with pytest.raises(GraphError, match=r"g\.yaml:\d+:\d+: the document holds more than 1,000,000 values") as exc:
        load_graph(_graph(tmp_path, text))
    assert "alias *a" in str(exc.value) and "fix: write the values out" in str(exc.value)


def test_aliases_a_graph_really_uses_still_load() -> None:
    text = (
        "defaults: &b {max_size: 8, max_delay_ms: 2}\n"
        "models:\n  m1: {batch: *b}\n  m2: {batch: {<<: *b, max_size: 4}}\n"
    )
    data = load_bounded(text)
    assert data["models"]["m1"]["batch"] == {"max_size": 8, "max_delay_ms": 2}
    assert data["models"]["m2"]["batch"] == {"max_size": 4, "max_delay_ms": 2}


@pytest.mark.parametrize("opening", ["[" * 5000, "{a: " * 5000])
def test_deep_nesting_is_a_graph_error_not_a_recursion_error(tmp_path: Path, opening: str) -> None:
    closing = "]" * 5000 if opening.startswith("[") else "}" * 5000
    text = BODY + "description: " + opening + "1" + closing + "\n"
    with pytest.raises(GraphError, match=r"g\.yaml:\d+:\d+: values nested more than 64 levels deep"):
        load_graph(_graph(tmp_path, text))


def test_nesting_through_aliases_is_bounded_too() -> None:
    lines = ["a0: &a0 " + "[" * 60 + "]" * 60]
    lines += [f"a{i}: &a{i} " + "[" * 60 + f"*a{i - 1}" + "]" * 60 for i in range(1, 20)]
    with pytest.raises(YAMLLimitError, match="nested more than 64 levels"):
        load_bounded("\n".join(lines))


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(YAMLLimitError, match=r"alias \*a refers to the value that contains it"):
        load_bounded("a: &a [1, *a]\n")


def test_an_integer_of_thousands_of_digits_is_a_graph_error(tmp_path: Path) -> None:
    text = BODY + "limits: {max_text_chars: " + "9" * 5000 + "}\n"
    with pytest.raises(GraphError, match=r"g\.yaml:7:\d+: an integer of 5000 digits"):
        load_graph(_graph(tmp_path, text))


def test_a_repeated_node_name_is_a_graph_error_not_a_silent_replacement(tmp_path: Path) -> None:
    text = BODY.replace("outputs:", '  up: {fn: "testops:upper", inputs: {text: inputs.text}}\noutputs:')
    with pytest.raises(GraphError, match=r"g\.yaml:5:3: key 'up' appears twice in one mapping \(first on line 4\)"):
        load_graph(_graph(tmp_path, text))


def test_a_file_past_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    p = tmp_path / "g.yaml"
    with p.open("wb") as fh:
        fh.truncate(9 * 1024 * 1024)  # sparse: /dev/zero's shape, not its endlessness
    with pytest.raises(GraphError, match=r"g\.yaml: graph file is larger than 8 MiB") as exc:
        load_graph(p)
    assert "not a data file" in str(exc.value)
