"""YAML for files users write (graphs, sidecars, GPU profiles), read within bounds.

``yaml.safe_load`` keeps a file's aliases as shared objects, so a few hundred bytes of
``&a [*b, *b, ...]`` ("billion laughs") load fast and then hang or exhaust memory in
whatever walks or prints the value. It also recurses once per nesting level (thousands
of ``[`` are a RecursionError), lets a repeated mapping key silently replace the first
(two nodes named ``echo``: one of them vanishes), and turns an integer of more than
4300 digits into a bare ``ValueError``. :func:`load_bounded` refuses each of these with
a :class:`yaml.MarkedYAMLError` (line and column) whose ``fix`` says what to write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "MAX_NODES", "YAMLLimitError", "load_bounded", "read_bounded_text"]

#: nesting of mappings/sequences (a graph file needs about 6)
MAX_DEPTH = 64
#: values in the document with every alias written out (a large graph file holds a few thousand)
MAX_NODES = 1_000_000
#: digits of one integer (Python refuses more than 4300)
MAX_INT_DIGITS = 100
#: bytes of one file read with :func:`read_bounded_text`
MAX_FILE_BYTES = 8 * 1024 * 1024


class YAMLLimitError(yaml.MarkedYAMLError):
    """A document beyond one of the bounds above; ``fix`` says what to write instead."""

    def __init__(self, problem: str, mark: yaml.Mark | None, fix: str) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[int, tuple[int, int]] = {}
        self._open: set[str | None] = set()  # anchors of values still being read

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open:
                raise YAMLLimitError(
                    f"alias *{event.anchor} refers to the value that contains it (a recursive structure)",
                    event.start_mark,
                    "write the value out; an alias may only repeat a finished value",
                )
            node = super().compose_node(parent, index)
            if node is not None:
                weight, depth = self._measure(node, event.start_mark)
                self._check_depth(self._depth + depth, event.start_mark)
                self._count(weight, event.start_mark, event.anchor)
            return node
        self._depth += 1
        start = self.peek_event()
        self._check_depth(self._depth, start.start_mark)
        anchor = getattr(start, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor)
        self._count(1, node.start_mark if node is not None else None, None)
        return node

    @staticmethod
    def _check_depth(depth: int, mark: yaml.Mark) -> None:
        if depth > MAX_DEPTH:
            raise YAMLLimitError(
                f"values nested more than {MAX_DEPTH} levels deep (aliases written out)",
                mark,
                "flatten the structure (a graph file needs a few levels)",
            )

    def _count(self, weight: int, mark: yaml.Mark | None, anchor: str | None) -> None:
        self._nodes += weight
        if self._nodes > MAX_NODES:
            via = f" (alias *{anchor} alone stands for {weight:,})" if anchor else ""
            raise YAMLLimitError(
                f"the document holds more than {MAX_NODES:,} values with its aliases written out{via}",
                mark,
                "write the values out instead of aliases of aliases, or split the file",
            )

    def _measure(self, node: Node, mark: yaml.Mark, active: frozenset[int] = frozenset()) -> tuple[int, int]:
        """Values ``node`` stands for with every alias in it written out, and its nesting depth (memoized)."""
        key = id(node)
        if key in self._sizes:
            return self._sizes[key]
        if key in active:
            raise YAMLLimitError(
                "an alias refers to a value that contains it (a recursive structure)",
                mark,
                "write the value out; an alias may only repeat a finished value",
            )
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        total, depth = 1, 0
        for child in children:
            scalar = isinstance(child, ScalarNode)
            weight, child_depth = (1, 1) if scalar else self._measure(child, mark, active | {key})
            total, depth = total + weight, max(depth, child_depth)
            if total > MAX_NODES or depth > MAX_DEPTH:
                break
        self._sizes[key] = (total, depth + 1)
        return self._sizes[key]

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, yaml.Mark] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise YAMLLimitError(
                        f"key {key!r} appears twice in one mapping (first on line {seen[key].line + 1}); "
                        "YAML would keep only the last one",
                        key_node.start_mark,
                        "rename one of them (names must be unique) or delete the duplicate",
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise YAMLLimitError(
                f"an integer of {digits} digits",
                node.start_mark,
                "write a number of sensible size (limits and sizes fit in a few digits)",
            )
        return int(super().construct_yaml_int(node))


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_bounded(text: str) -> Any:
    """``yaml.safe_load`` within the bounds above; raises :class:`yaml.YAMLError` (:class:`YAMLLimitError`)."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:  # the bounds above should stop it first; never let it escape as an internal error
        raise YAMLLimitError(
            "values nested too deeply to read", None, "flatten the structure (a graph file needs a few levels)"
        ) from None
    finally:
        loader.dispose()


def read_bounded_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, reading at most ``limit`` bytes (raises ``ValueError`` past it).

    ``OSError`` and ``UnicodeDecodeError`` pass through for the caller to word.
    """
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"file is larger than {limit // (1024 * 1024)} MiB")
    return data.decode("utf-8")
