"""Render a :class:`usg.plan.Plan`: a rich terminal report, JSON, and a memory-vs-concurrency plot."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from usg.errors import InputError, MissingDependency, UsageError
from usg.plan.planner import Plan, memory_curve

__all__ = ["PLOT_FORMATS", "plot_plan", "print_plan"]

#: extensions --plot writes (matplotlib picks the format from it; without one it appended .png to the name)
PLOT_FORMATS = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".eps", ".ps")

_GIB = 1024**3


def _gib(n: float) -> str:
    return f"{n / _GIB:,.2f} GiB"


def _pct(n: float, total: float) -> str:
    return f"{100 * n / total:.1f}%"


def print_plan(p: Plan, console: Console | None = None) -> None:
    """Print the plan as tables: model, memory per GPU, capacity, settings, advice, notes."""
    con = console or Console(width=None if sys.stdout.isatty() else 120)
    t, mem, m = p.target, p.memory, p.model
    verdict = "[bold green]FITS[/]" if p.fits else "[bold red]DOES NOT FIT[/]"
    if not p.fits and p.image_tokens * t.images_per_prompt >= t.max_model_len:
        verdict += (
            f" [red](not memory: the {t.images_per_prompt} image(s) of a prompt fill the "
            f"{t.max_model_len}-token context)[/]"
        )
    con.print(
        f"[bold]usg plan[/]: {escape(m.name)} on {p.gpu_count}× {escape(p.gpu.name)} (TP={p.tensor_parallel_size}) — "
        f"{t.concurrency} × {t.max_model_len} tokens"
        + (f", {t.images_per_prompt} image(s)/prompt" if t.images_per_prompt else "")
        + f" → {verdict}"
    )

    model = Table(title="Model", title_justify="left", show_header=False)
    model.add_column("", style="bold")
    model.add_column("", justify="right")
    c = p.params
    active = f" ({c.active / 1e9:.2f}B active)" if c.active != c.total else ""
    model.add_row("parameters", f"{c.total / 1e9:.2f}B{active}")
    if c.vision_tower:
        model.add_row("  vision tower + projector", f"{(c.vision_tower + c.projector) / 1e6:.0f}M")
    model.add_row(f"weights ({p.weight_dtype})", _gib(p.weight_bytes))
    model.add_row(f"KV per token ({p.kv_cache_dtype}, per GPU)", f"{p.kv_bytes_per_token / 1024:,.2f} KiB")
    model.add_row(f"KV per sequence at {t.max_model_len}", _gib(p.kv_bytes_per_sequence))
    if p.image_tokens:
        model.add_row("tokens per image", str(p.image_tokens))
    con.print(model)

    table = Table(title=escape(f"Memory per GPU ({p.gpu.name}, {_gib(mem.total)})"), title_justify="left")
    table.add_column("part")
    table.add_column("size", justify="right")
    table.add_column("of total", justify="right")
    table.add_row("weights", _gib(mem.weights), _pct(mem.weights, mem.total))
    table.add_row(
        f"activations ({p.max_num_batched_tokens} batched tokens)",
        _gib(mem.activations),
        _pct(mem.activations, mem.total),
    )
    table.add_row(
        f"KV cache needed ({t.concurrency} × {t.max_model_len})",
        _gib(mem.kv_required),
        _pct(mem.kv_required, mem.total),
    )
    table.add_row(f"reserve (1 − {t.gpu_memory_utilization:.2f})", _gib(mem.reserve), _pct(mem.reserve, mem.total))
    style = "green" if mem.headroom >= 0 else "red"
    label = "headroom" if mem.headroom >= 0 else "shortfall"
    table.add_row(f"[{style}]{label}[/]", f"[{style}]{_gib(abs(mem.headroom))}[/]", _pct(abs(mem.headroom), mem.total))
    con.print(table)

    cap = Table(title="Capacity", title_justify="left", show_header=False)
    cap.add_column("", style="bold")
    cap.add_column("", justify="right")
    cap.add_row(f"max concurrent sequences at {t.max_model_len}", str(p.max_concurrency))
    cap.add_row(f"KV blocks (block size {t.block_size})", f"{p.kv_blocks:,} ({p.kv_blocks * t.block_size:,} tokens)")
    cap.add_row("smallest TP that fits", str(p.min_tensor_parallel) if p.min_tensor_parallel else "none up to 64")
    tp = p.throughput
    cap.add_row(
        f"decode bound at {tp.concurrency} seqs",
        f"≤ {tp.decode_tokens_per_s:,.0f} tok/s "
        f"({tp.decode_tokens_per_s_per_seq:,.1f}/seq, {tp.decode_step_ms:.1f} ms/step)",
    )
    cap.add_row("prefill bound", f"≤ {tp.prefill_tokens_per_s:,.0f} tok/s")
    cap.add_row(f"TTFT, one {t.max_model_len}-token prompt", f"≥ {tp.ttft_ms:,.0f} ms")
    con.print(cap)

    seqs = dict(p.settings.trtllm)["max_batch_size"]
    clamp = f" (max-num-seqs {seqs}: what fits, not the {t.concurrency} asked for)" if seqs < t.concurrency else ""
    con.print(f"[bold]vLLM[/]{clamp}")
    con.print(p.settings.vllm_command(m.name), soft_wrap=True, highlight=False, markup=False)
    con.print("[bold]Triton / TensorRT-LLM[/]")
    con.print("  ".join(f"{k}={v}" for k, v in p.settings.trtllm), soft_wrap=True, highlight=False)

    if p.advice:
        con.print("[bold red]To fit, turn one of these knobs:[/]")
        for a in p.advice:
            con.print(f"  • {a}", soft_wrap=True, highlight=False, markup=False)
    if p.notes:
        con.print("[dim]notes:[/]")
        for n in p.notes:
            con.print(f"  - {n}", style="dim", soft_wrap=True, highlight=False, markup=False)


def plot_plan(p: Plan, path: str | Path) -> Path:
    """Draw memory per GPU vs concurrency with the budget line and the fit point; write ``path``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("matplotlib", "report", "usg plan --plot") from None
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"--plot {str(out)!r} is a directory; fix: name a file in it, e.g. {out / 'plan.png'}")
    if out.suffix.lower() not in PLOT_FORMATS:
        raise UsageError(
            f"--plot {str(out)!r}: {'a file name without an extension' if not out.suffix else repr(out.suffix)} "
            f"is not a plot format; fix: end the name in one of {', '.join(PLOT_FORMATS)}, e.g. plan.png"
        )
    if not out.parent.exists():
        raise UsageError(f"--plot {str(out)!r}: directory {str(out.parent)!r} does not exist; fix: create it first")
    curve = memory_curve(p.model, p.gpu, p.target, p.tensor_parallel_size)
    xs = [c for c, _ in curve]
    static = (p.memory.weights + p.memory.activations) / _GIB
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.fill_between(xs, 0, [p.memory.weights / _GIB] * len(xs), alpha=0.35, label="weights")
    ax.fill_between(xs, p.memory.weights / _GIB, [static] * len(xs), alpha=0.35, label="activations")
    ax.plot(xs, [b / _GIB for _, b in curve], color="black", label="weights + activations + KV")
    ax.axhline(
        p.memory.budget / _GIB,
        color="red",
        linestyle="--",
        label=f"budget ({p.target.gpu_memory_utilization:.2f} × total)",
    )
    ax.axhline(p.memory.total / _GIB, color="grey", linestyle=":", label="GPU memory")
    if p.max_concurrency:
        ax.axvline(p.max_concurrency, color="green", linestyle="--", label=f"max fit = {p.max_concurrency}")
    need = (p.memory.weights + p.memory.activations + p.memory.kv_required) / _GIB
    ax.plot([p.target.concurrency], [need], "o", color="green" if p.fits else "red", label="target")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"concurrent sequences at {p.target.max_model_len} tokens")
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"{p.model.name} on {p.gpu.name} (TP={p.tensor_parallel_size})")
    ax.legend(loc="upper left", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=120)
    except OSError as exc:
        raise InputError(
            f"--plot {str(out)!r}: cannot write it ({exc.strerror or exc}); fix: pass a path in a writable directory"
        ) from None
    return out
