"""A picture of a graph for ``usg graph show --format mermaid|dot|svg|png``.

Graph inputs, nodes (model calls with their batch policy, Python functions), ``map``
fan-out and outputs; each node is coloured by the modalities of the graph inputs that
gate it (a node runs only when those inputs are present). ``svg`` and ``png`` are drawn by
Graphviz's ``dot`` program from the DOT text. The text forms are deterministic, so a
committed picture can be checked to be current.
"""

from __future__ import annotations

import shutil
import subprocess

from usg.errors import USGError
from usg.graph import Graph

__all__ = ["FORMATS", "gating_modalities", "render_picture", "to_dot", "to_mermaid"]

FORMATS = ("mermaid", "dot", "svg", "png")

# fill colours per gating modality set; a node gated by several modalities gets "mixed"
_COLOURS = {
    "image": "#fde2c8",
    "text": "#cfe8fc",
    "audio": "#e3d5f7",
    "tensor": "#dff2d8",
    "mixed": "#f2f2c4",
    "none": "#eeeeee",
}


def gating_modalities(g: Graph) -> dict[str, frozenset[str]]:
    """For each node, the modalities of the graph inputs it needs (transitively) to run."""
    needs: dict[str, frozenset[str]] = {}
    for name in g.order:
        mods: set[str] = set()
        for ref in g.nodes[name].inputs.values():
            if ref.is_graph_input:
                mods.add(g.inputs[ref.port].modality.value)
            else:
                mods |= needs.get(ref.source, frozenset())
        needs[name] = frozenset(mods)
    return needs


def _colour_key(mods: frozenset[str]) -> str:
    if not mods:
        return "none"
    return next(iter(mods)) if len(mods) == 1 else "mixed"


def _batch_label(g: Graph, model: str) -> str:
    b = g.models[model].batch
    if not b.enabled:
        return "batch off"
    return f"batch ≤{b.max_size}, {b.max_delay_ms:g} ms" + (", pad" if b.pad else "")


def _node_lines(g: Graph, name: str) -> list[str]:
    n = g.nodes[name]
    if n.model:
        m = g.models[n.model]
        lines = [name, f"model {n.model} ({m.backend})", _batch_label(g, n.model)]
    else:
        lines = [name, n.align.describe() if n.align is not None else f"fn {n.fn}"]
    if n.map:
        lines.append(f"map over {', '.join(n.map)}")
    return lines


def _edges(g: Graph) -> list[tuple[str, str, str, bool]]:
    """(from id, to id, label, fan-out) per pair of connected boxes, in graph order (wires merged)."""
    merged: dict[tuple[str, str], tuple[list[str], bool]] = {}
    for name in g.order:
        n = g.nodes[name]
        for port, ref in n.inputs.items():
            src = f"in_{ref.port}" if ref.is_graph_input else f"n_{ref.source}"
            label = port if ref.is_graph_input or ref.port == port else f"{ref.port} → {port}"
            labels, fan = merged.setdefault((src, f"n_{name}"), ([], False))
            labels.append(label)
            merged[(src, f"n_{name}")] = (labels, fan or port in n.map)
    for oname, ref in g.outputs.items():
        src = f"in_{ref.port}" if ref.is_graph_input else f"n_{ref.source}"
        merged[(src, f"out_{oname}")] = ([ref.port], False)
    return [(src, dst, ", ".join(labels), fan) for (src, dst), (labels, fan) in merged.items()]


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def to_mermaid(g: Graph) -> str:
    """A Mermaid ``flowchart`` of the graph (renders on GitHub and in MkDocs Material)."""
    gates = gating_modalities(g)
    lines = ["flowchart TD", f"  %% graph {g.name}: nodes coloured by the modality that gates them"]
    for d in g.inputs.values():
        opt = ", optional" if d.optional else ""
        lines.append(f'  in_{d.name}[/"input {_mermaid_text(d.name)}<br/>{d.modality.value}{opt}"/]')
    for name in g.order:
        label = "<br/>".join(_mermaid_text(x) for x in _node_lines(g, name))
        shape = ('[["', '"]]') if g.nodes[name].map else ('["', '"]')
        lines.append(f"  n_{name}{shape[0]}{label}{shape[1]}")
    for oname in g.outputs:
        lines.append(f'  out_{oname}(["output {_mermaid_text(oname)}"])')
    for src, dst, label, fan in _edges(g):
        arrow = "==>" if fan else "-->"
        lines.append(f'  {src} {arrow}|"{_mermaid_text(label + (" (each item)" if fan else ""))}"| {dst}')
    used = sorted({_colour_key(gates[n]) for n in g.order} | {d.modality.value for d in g.inputs.values()})
    for key in used:
        lines.append(f"  classDef {key} fill:{_COLOURS.get(key, _COLOURS['none'])},stroke:#555")
    for d in g.inputs.values():
        lines.append(f"  class in_{d.name} {d.modality.value}")
    for name in g.order:
        lines.append(f"  class n_{name} {_colour_key(gates[name])}")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(g: Graph) -> str:
    """A Graphviz DOT digraph of the graph, with a legend of the gating colours."""
    gates = gating_modalities(g)
    lines = [
        f'digraph "{_dot_text(g.name)}" {{',
        "  rankdir=TB;",
        '  node [fontname="Helvetica", fontsize=10, style="filled,rounded", shape=box];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for d in g.inputs.values():
        label = _dot_text(f"input {d.name}") + "\\n" + d.modality.value + (", optional" if d.optional else "")
        colour = _COLOURS.get(d.modality.value, _COLOURS["none"])
        lines.append(f'  in_{d.name} [label="{label}", shape=parallelogram, fillcolor="{colour}"];')
    for name in g.order:
        label = "\\n".join(_dot_text(x) for x in _node_lines(g, name))
        colour = _COLOURS[_colour_key(gates[name])]
        extra = ", peripheries=2" if g.nodes[name].map else ""
        lines.append(f'  n_{name} [label="{label}", fillcolor="{colour}"{extra}];')
    for oname in g.outputs:
        lines.append(f'  out_{oname} [label="output {_dot_text(oname)}", shape=oval, fillcolor="white"];')
    for src, dst, label, fan in _edges(g):
        style = ', style=bold, label="' + _dot_text(label) + ' (each item)"' if fan else f', label="{_dot_text(label)}"'
        lines.append(f"  {src} -> {dst} [{style.lstrip(', ')}];")
    used = sorted({_colour_key(gates[n]) for n in g.order})
    lines.append('  subgraph cluster_legend { label="gated by"; fontsize=9; style=dashed;')
    for key in used:
        lines.append(f'    legend_{key} [label="{key}", fillcolor="{_COLOURS[key]}", fontsize=9];')
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_picture(g: Graph, fmt: str) -> bytes:
    """The picture in ``fmt`` (one of :data:`FORMATS`) as bytes; svg/png need Graphviz's ``dot``."""
    if fmt == "mermaid":
        return to_mermaid(g).encode()
    dot = to_dot(g)
    if fmt == "dot":
        return dot.encode()
    exe = shutil.which("dot")
    if exe is None:
        raise USGError(
            f"--format {fmt} draws with Graphviz's `dot` program, which is not on PATH; "
            "fix: apt-get install graphviz (or brew install graphviz), or use --format mermaid|dot"
        )
    proc = subprocess.run([exe, f"-T{fmt}"], input=dot.encode(), capture_output=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise USGError(f"graphviz dot -T{fmt} failed: {proc.stderr.decode(errors='replace').strip()[:500]}")
    return proc.stdout
