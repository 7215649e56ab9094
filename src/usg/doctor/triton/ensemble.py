"""Triton ensemble checks: the steps, their tensor wiring, and batching across steps.

Step models are read from the ensemble's repository (its parent directory), then from every
other repository given on the same command line, as Triton does with several
``--model-repository`` flags. A step model absent from all of them is one TRITON031; the
tensors it would produce count as produced, so no TRITON032 cascade follows.
Codes: TRITON030-TRITON039.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from usg.doctor.findings import Finding, RootCause, Severity
from usg.doctor.registry import CodeInfo, check
from usg.doctor.runner import CheckContext
from usg.doctor.triton.checks import tf
from usg.doctor.triton.config import TritonModel, dtype_name, load_triton_model

__all__: list[str] = []

E, W = Severity.ERROR, Severity.WARNING

C_NO_SCHED = CodeInfo(
    "TRITON030",
    E,
    RootCause.CONFIG_INVALID,
    "ensemble without steps",
    'platform: "ensemble" needs ensemble_scheduling { step [ ... ] }.',
)
C_UNKNOWN = CodeInfo(
    "TRITON031",
    E,
    RootCause.CONFIG_INVALID,
    "ensemble step names an unknown model",
    "A step's model_name has no model directory (or no parsable config) in the repository.",
)
C_MAP = CodeInfo(
    "TRITON032",
    E,
    RootCause.CONFIG_INVALID,
    "ensemble tensor mapping incomplete",
    "A step input is not mapped, a map key is not a tensor of the step model, a consumed "
    "tensor is never produced, or an ensemble output is never produced.",
)
C_TWICE = CodeInfo(
    "TRITON033",
    E,
    RootCause.CONFIG_INVALID,
    "ensemble tensor produced twice",
    "Two steps (or a step and the ensemble inputs) write the same tensor name.",
)
C_CYCLE = CodeInfo(
    "TRITON034",
    E,
    RootCause.CONFIG_INVALID,
    "ensemble steps form a cycle",
    "Steps depend on each other's outputs in a loop; Triton rejects the ensemble.",
)
C_DTYPE = CodeInfo(
    "TRITON035",
    E,
    RootCause.DTYPE_OR_RANGE,
    "ensemble dtype mismatch",
    "The producer of a tensor and its consumer declare different data types.",
)
C_SHAPE = CodeInfo(
    "TRITON036",
    E,
    RootCause.SHAPE_OR_RANK,
    "ensemble shape mismatch",
    "The producer of a tensor and its consumer declare incompatible dims, both as declared and as full "
    "shapes (with the batch dim of a model whose max_batch_size > 0), as Triton compares them.",
)
C_MBS = CodeInfo(
    "TRITON037",
    E,
    RootCause.BATCH_DIM_CONFIG,
    "ensemble max_batch_size above a step's",
    "The ensemble's max_batch_size must be <= the max_batch_size of every batching step model "
    "(a step with max_batch_size 0 takes full shapes instead).",
)
C_UNUSED = CodeInfo(
    "TRITON038",
    W,
    RootCause.CONFIG_INVALID,
    "ensemble input never consumed",
    "An ensemble input is not read by any step.",
)

C_NESTED = CodeInfo(
    "TRITON039",
    E,
    RootCause.CONFIG_INVALID,
    "ensembles depend on each other in a loop",
    "An ensemble is a step of itself, directly or through other ensembles' steps; Triton refuses "
    "to load it ('circular dependency between ensembles').",
)
_MAX_NESTING = 64  # ensembles inside ensembles followed before giving up


@dataclass(frozen=True)
class _Tensor:
    """A tensor end as declared by a model: dtype name, dims, and the model's batching."""

    owner: str  # "ensemble input", "step 0 (det) output 'y'"...
    dtype: str | None  # None: the declaring model is missing (reported once as TRITON031)
    dims: list[int] | None
    batching: bool = False  # the declaring model has max_batch_size > 0

    @property
    def full(self) -> list[int] | None:
        """The shape with the batch dim, as Triton's ensemble scheduler passes the tensor on."""
        if self.dims is None:
            return None
        return [-1, *self.dims] if self.batching else self.dims


def _decl(tensors: Any) -> dict[str, Any]:
    return {t.name: t for t in tensors}


def _dims(t: Any) -> list[int]:
    return list(t.dims)


def _own_dims(t: Any) -> list[int]:
    """An ensemble's own input/output: Triton reads its reshape.shape when it has one."""
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def _compatible(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == -1 or y == -1 or x == y for x, y in zip(a, b, strict=True))


@dataclass
class _Wiring:
    """What the walk over an ensemble's steps has learned so far."""

    m: TritonModel
    steps: list[Any]
    mbs: int
    producers: dict[str, _Tensor] = field(default_factory=dict)
    subs: list[TritonModel | None] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def where(self, i: int) -> tuple[str, int | None]:
        """The element name and config line of step ``i``."""
        name = self.steps[i].model_name
        return f"step[{i}] {name}", self.m.line_of(rf'model_name\s*:\s*"{name}"')


@check(
    "triton_model", codes=[C_NO_SCHED, C_UNKNOWN, C_MAP, C_TWICE, C_CYCLE, C_DTYPE, C_SHAPE, C_MBS, C_UNUSED, C_NESTED]
)
def check_ensemble(m: TritonModel, ctx: CheckContext) -> Iterator[Finding]:
    """Resolve the steps, wire their outputs and inputs, then the ensemble's own outputs, inputs and cycles."""
    if m.config is None or m.config.platform != "ensemble":
        return
    c = m.config
    steps = list(c.ensemble_scheduling.step)
    if not steps:
        yield tf(
            C_NO_SCHED,
            m,
            "ensemble has no ensemble_scheduling steps",
            "add ensemble_scheduling { step [ { model_name: ... input_map {...} output_map {...} } ] }",
            element="ensemble_scheduling",
            line=m.line_of("platform"),
        )
        return
    w = _Wiring(m, steps, int(c.max_batch_size))
    for t in c.input:
        w.producers[t.name] = _Tensor("ensemble input", dtype_name(t.data_type), _own_dims(t), w.mbs > 0)
    for i in range(len(steps)):
        w.subs.append(_resolve_step(w, i, ctx))
        _wire_outputs(w, i)
    for i in range(len(steps)):
        _wire_inputs(w, i)
    _check_own_outputs(w)
    _check_unused_inputs(w)
    _check_cycle(w)
    _check_nesting(w, ctx)
    yield from w.findings


def model_repositories(m: TritonModel, ctx: CheckContext) -> list[Path]:
    """Where Triton looks for a step model: the ensemble's repository, then every other one given."""
    return [m.repo, *(r for r in ctx.model_repositories if r.resolve() != m.repo.resolve())]


def _resolve_step(w: _Wiring, i: int, ctx: CheckContext) -> TritonModel | None:
    """Find step ``i``'s model in the repositories (TRITON031 if absent) and compare batch sizes (TRITON037)."""
    m, step = w.m, w.steps[i]
    el, line = w.where(i)
    repos = model_repositories(m, ctx)
    sub_dir = next((r / step.model_name for r in repos if (r / step.model_name / "config.pbtxt").is_file()), None)
    sub = load_triton_model(sub_dir, ctx) if sub_dir is not None else None
    if sub is None or sub.config is None:
        why = "no such model directory" if sub is None else "its config.pbtxt does not parse"
        known = sorted({p.name for r in repos if r.is_dir() for p in r.iterdir() if (p / "config.pbtxt").is_file()})
        w.findings.append(
            tf(
                C_UNKNOWN,
                m,
                f"step {i} uses model {step.model_name!r}: {why} in {', '.join(str(r) for r in repos)}",
                f"add {m.repo / step.model_name}/config.pbtxt, give the repository that holds it as another "
                f"path, or fix model_name (models here: {known})",
                element=el,
                line=line,
                step=i,
                model_name=step.model_name,
                repositories=[str(r) for r in repos],
            )
        )
        return None
    sub_mbs = int(sub.config.max_batch_size)
    if w.mbs > 0 and 0 < sub_mbs < w.mbs:
        w.findings.append(
            tf(
                C_MBS,
                m,
                f"ensemble max_batch_size {w.mbs} > step model {step.model_name!r} max_batch_size {sub_mbs}",
                f"set the ensemble's max_batch_size to {sub_mbs}, or raise {step.model_name!r}'s to {w.mbs}",
                element=el,
                line=m.line_of("max_batch_size"),
                ensemble_max_batch_size=w.mbs,
                step_model=step.model_name,
                step_max_batch_size=sub_mbs,
            )
        )
    return sub


def _wire_outputs(w: _Wiring, i: int) -> None:
    """Record what step ``i`` produces; its output_map keys must be outputs of its model (TRITON032/033).

    A step whose model is missing (already TRITON031) still produces its mapped tensors, with
    unknown dtype and dims, so its absence is reported once and not again for every consumer.
    """
    m, step, sub = w.m, w.steps[i], w.subs[i]
    el, line = w.where(i)
    outs = _decl(sub.config.output) if sub is not None and sub.config is not None else None
    for key, tensor in step.output_map.items():
        if outs is not None and key not in outs:
            w.findings.append(
                tf(
                    C_MAP,
                    m,
                    f"step {i} ({step.model_name}) output_map key {key!r} is not an output of "
                    f"{step.model_name!r} (outputs: {sorted(outs)})",
                    f"use one of {sorted(outs)}",
                    element=el,
                    line=line,
                    step=i,
                    key=key,
                    model_outputs=sorted(outs),
                )
            )
            continue
        owner = f"step {i} ({step.model_name}) output {key!r}"
        if tensor in w.producers:
            w.findings.append(
                tf(
                    C_TWICE,
                    m,
                    f"tensor {tensor!r} is produced by {w.producers[tensor].owner} and by {owner}",
                    "give each produced tensor a unique name in output_map",
                    element=el,
                    line=line,
                    tensor=tensor,
                    producers=[w.producers[tensor].owner, owner],
                )
            )
            continue
        if outs is None or sub is None or sub.config is None:
            w.producers[tensor] = _Tensor(owner, None, None)
        else:
            batching = int(sub.config.max_batch_size) > 0
            w.producers[tensor] = _Tensor(owner, dtype_name(outs[key].data_type), _dims(outs[key]), batching)


def _wire_inputs(w: _Wiring, i: int) -> None:
    """Step ``i``'s input_map: keys are inputs of its model, tensors are produced, types agree."""
    m, step, sub = w.m, w.steps[i], w.subs[i]
    if sub is None or sub.config is None:
        return
    el, line = w.where(i)
    ins = _decl(sub.config.input)
    for key, tensor in step.input_map.items():
        if key not in ins:
            w.findings.append(
                tf(
                    C_MAP,
                    m,
                    f"step {i} ({step.model_name}) input_map key {key!r} is not an input of "
                    f"{step.model_name!r} (inputs: {sorted(ins)})",
                    f"use one of {sorted(ins)}",
                    element=el,
                    line=line,
                    step=i,
                    key=key,
                    model_inputs=sorted(ins),
                )
            )
            continue
        prod = w.producers.get(tensor)
        if prod is None:
            w.findings.append(
                tf(
                    C_MAP,
                    m,
                    f"step {i} ({step.model_name}) reads tensor {tensor!r}, which no step "
                    "and no ensemble input produces",
                    f"add {tensor!r} to the ensemble inputs or to an earlier step's output_map",
                    element=el,
                    line=line,
                    step=i,
                    tensor=tensor,
                )
            )
            continue
        batching = int(sub.config.max_batch_size) > 0
        cons = _Tensor(
            f"step {i} ({step.model_name}) input {key!r}", dtype_name(ins[key].data_type), _dims(ins[key]), batching
        )
        w.findings.extend(_agree(m, el, line, tensor, prod, cons))
    unmapped = sorted(k for k, t in ins.items() if k not in step.input_map and not t.optional)
    if unmapped:
        w.findings.append(
            tf(
                C_MAP,
                m,
                f"step {i} ({step.model_name}) leaves input(s) {unmapped} unmapped",
                f'map them in input_map {{ key: "{unmapped[0]}" value: "..." }}',
                element=el,
                line=line,
                step=i,
                unmapped=unmapped,
            )
        )


def _check_own_outputs(w: _Wiring) -> None:
    """Every ensemble output is produced by a step, with an agreeing dtype and shape."""
    m = w.m
    assert m.config is not None
    for t in m.config.output:
        prod = w.producers.get(t.name)
        line = m.line_of_tensor(t.name)
        if prod is None:
            w.findings.append(
                tf(
                    C_MAP,
                    m,
                    f"ensemble output {t.name!r} is produced by no step",
                    f"map a step output to {t.name!r} in its output_map",
                    element=f"output {t.name}",
                    line=line,
                    tensor=t.name,
                )
            )
            continue
        own = _Tensor("ensemble output", dtype_name(t.data_type), _own_dims(t), w.mbs > 0)
        w.findings.extend(_agree(m, f"output {t.name}", line, t.name, prod, own))


def _check_unused_inputs(w: _Wiring) -> None:
    assert w.m.config is not None
    consumed = {tensor for step in w.steps for tensor in step.input_map.values()}
    for t in w.m.config.input:
        if t.name not in consumed:
            w.findings.append(
                tf(
                    C_UNUSED,
                    w.m,
                    f"ensemble input {t.name!r} is read by no step",
                    f"map {t.name!r} in a step's input_map or remove it",
                    element=f"input {t.name}",
                    line=w.m.line_of_tensor(t.name),
                    tensor=t.name,
                )
            )


def _check_cycle(w: _Wiring) -> None:
    produced_by_step = {t: i for i, s in enumerate(w.steps) for t in s.output_map.values()}
    edges: dict[int, set[int]] = {i: set() for i in range(len(w.steps))}
    for i, step in enumerate(w.steps):
        for tensor in step.input_map.values():
            if tensor in produced_by_step:
                edges[produced_by_step[tensor]].add(i)
    cycle = _find_cycle(edges)
    if cycle:
        names = [f"{i}:{w.steps[i].model_name}" for i in cycle]
        w.findings.append(
            tf(
                C_CYCLE,
                w.m,
                f"ensemble steps form a cycle: {' -> '.join(names)}",
                "break the loop: a step cannot (indirectly) consume its own output",
                element=f"step[{cycle[0]}]",
                line=w.m.line_of("ensemble_scheduling"),
                cycle=names,
            )
        )


def _check_nesting(w: _Wiring, ctx: CheckContext) -> None:
    """TRITON039: a chain of ensemble steps that leads back to this ensemble."""
    repos = model_repositories(w.m, ctx)

    def ensemble_steps(name: str) -> list[str]:
        sub_dir = next((r / name for r in repos if (r / name / "config.pbtxt").is_file()), None)
        sub = load_triton_model(sub_dir, ctx) if sub_dir is not None else None
        if sub is None or sub.config is None or sub.config.platform != "ensemble":
            return []
        return [s.model_name for s in sub.config.ensemble_scheduling.step]

    seen: set[str] = set()

    def visit(chain: list[str]) -> list[str] | None:
        if len(chain) > _MAX_NESTING:
            return None
        steps = [s.model_name for s in w.steps] if len(chain) == 1 else ensemble_steps(chain[-1])
        for name in steps:
            if name == w.m.name:
                return [*chain, name]
            if name not in seen:
                seen.add(name)
                if found := visit([*chain, name]):
                    return found
        return None

    loop = visit([w.m.name])
    if loop is None:
        return
    first = loop[1]
    i = next(i for i, s in enumerate(w.steps) if s.model_name == first)
    el, line = w.where(i)
    w.findings.append(
        tf(
            C_NESTED,
            w.m,
            f"ensemble {w.m.name!r} is a step of itself: {' -> '.join(loop)}",
            f"remove step {i} ({first!r}) or point it at the model it should run; an ensemble cannot "
            "contain itself, directly or through other ensembles",
            element=el,
            line=line,
            chain=loop,
        )
    )


def _agree(m: TritonModel, el: str, line: int | None, tensor: str, prod: _Tensor, cons: _Tensor) -> Iterator[Finding]:
    if prod.dtype is None or cons.dtype is None or prod.dims is None or cons.dims is None:
        return  # one end's model is missing: nothing to compare
    if prod.dtype != cons.dtype:
        yield tf(
            C_DTYPE,
            m,
            f"tensor {tensor!r}: {prod.owner} is {prod.dtype} but {cons.owner} is {cons.dtype}",
            f"make both {prod.dtype} (cast in the producer or change the consumer's data_type)",
            element=el,
            line=line,
            tensor=tensor,
            producer=prod.owner,
            producer_dtype=prod.dtype,
            consumer=cons.owner,
            consumer_dtype=cons.dtype,
        )
    if not _compatible(prod.dims, cons.dims) and not _compatible(prod.full or [], cons.full or []):
        yield tf(
            C_SHAPE,
            m,
            f"tensor {tensor!r}: {prod.owner} has dims {prod.dims} (full shape {prod.full}) but "
            f"{cons.owner} expects {cons.dims} (full shape {cons.full})",
            "make the dims, or the full shapes, agree (use -1 for variable dims; a model with "
            "max_batch_size > 0 adds a leading batch dim to its full shape)",
            element=el,
            line=line,
            tensor=tensor,
            producer=prod.owner,
            producer_dims=prod.dims,
            consumer=cons.owner,
            consumer_dims=cons.dims,
            producer_full_shape=prod.full,
            consumer_full_shape=cons.full,
        )


def _find_cycle(edges: dict[int, set[int]]) -> list[int] | None:
    state: dict[int, int] = {}
    stack: list[int] = []

    def visit(n: int) -> list[int] | None:
        state[n] = 1
        stack.append(n)
        for nxt in sorted(edges[n]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (found := visit(n)):
            return found
    return None
