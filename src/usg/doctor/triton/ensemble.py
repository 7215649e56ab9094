"""Triton ensemble checks: the steps, their tensor wiring, and batching across steps.

Step models are read from the ensemble's repository (its parent directory).
Codes: TRITON030-TRITON037.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Tensor:
    """A tensor end as declared by a model: dtype name, dims, and the model's batching."""

    owner: str  # "ensemble input", "step 0 (det) output 'y'"...
    dtype: str
    dims: list[int]
    batching: bool = False  # the declaring model has max_batch_size > 0

    @property
    def full(self) -> list[int]:
        """The shape with the batch dim, as Triton's ensemble scheduler passes the tensor on."""
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


@check("triton_model", codes=[C_NO_SCHED, C_UNKNOWN, C_MAP, C_TWICE, C_CYCLE, C_DTYPE, C_SHAPE, C_MBS, C_UNUSED])
def check_ensemble(m: TritonModel, ctx: CheckContext) -> Iterator[Finding]:
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
    mbs = int(c.max_batch_size)
    producers: dict[str, _Tensor] = {}
    for t in c.input:
        producers[t.name] = _Tensor("ensemble input", dtype_name(t.data_type), _own_dims(t), mbs > 0)
    step_models: list[TritonModel | None] = []
    for i, step in enumerate(steps):
        line = m.line_of(rf'model_name\s*:\s*"{step.model_name}"')
        el = f"step[{i}] {step.model_name}"
        sub_dir = m.repo / step.model_name
        sub = load_triton_model(sub_dir, ctx) if (sub_dir / "config.pbtxt").is_file() else None
        if sub is None or sub.config is None:
            why = "no such model directory" if sub is None else "its config.pbtxt does not parse"
            yield tf(
                C_UNKNOWN,
                m,
                f"step {i} uses model {step.model_name!r}: {why} in {m.repo}",
                f"add {sub_dir}/config.pbtxt or fix model_name (models here: "
                f"{sorted(p.name for p in m.repo.iterdir() if (p / 'config.pbtxt').is_file())})",
                element=el,
                line=line,
                step=i,
                model_name=step.model_name,
            )
            step_models.append(None)
            continue
        step_models.append(sub)
        sub_mbs = int(sub.config.max_batch_size)
        if mbs > 0 and 0 < sub_mbs < mbs:
            yield tf(
                C_MBS,
                m,
                f"ensemble max_batch_size {mbs} > step model {step.model_name!r} max_batch_size {sub_mbs}",
                f"set the ensemble's max_batch_size to {sub_mbs}, or raise {step.model_name!r}'s to {mbs}",
                element=el,
                line=m.line_of("max_batch_size"),
                ensemble_max_batch_size=mbs,
                step_model=step.model_name,
                step_max_batch_size=sub_mbs,
            )
        outs = _decl(sub.config.output)
        for key, tensor in step.output_map.items():
            if key not in outs:
                yield tf(
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
                continue
            owner = f"step {i} ({step.model_name}) output {key!r}"
            if tensor in producers:
                yield tf(
                    C_TWICE,
                    m,
                    f"tensor {tensor!r} is produced by {producers[tensor].owner} and by {owner}",
                    "give each produced tensor a unique name in output_map",
                    element=el,
                    line=line,
                    tensor=tensor,
                    producers=[producers[tensor].owner, owner],
                )
                continue
            producers[tensor] = _Tensor(owner, dtype_name(outs[key].data_type), _dims(outs[key]), sub_mbs > 0)
    consumed: set[str] = set()
    edges: dict[int, set[int]] = {i: set() for i in range(len(steps))}
    produced_by_step = {t: i for i, s in enumerate(steps) for t in s.output_map.values()}
    for i, (step, sub) in enumerate(zip(steps, step_models, strict=True)):
        line = m.line_of(rf'model_name\s*:\s*"{step.model_name}"')
        el = f"step[{i}] {step.model_name}"
        for tensor in step.input_map.values():
            consumed.add(tensor)
            if tensor in produced_by_step:
                edges[produced_by_step[tensor]].add(i)
        if sub is None:
            continue
        ins = _decl(sub.config.input)
        for key, tensor in step.input_map.items():
            if key not in ins:
                yield tf(
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
                continue
            prod = producers.get(tensor)
            if prod is None:
                yield tf(
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
                continue
            yield from _agree(
                m,
                el,
                line,
                tensor,
                prod,
                _Tensor(
                    f"step {i} ({step.model_name}) input {key!r}",
                    dtype_name(ins[key].data_type),
                    _dims(ins[key]),
                    int(sub.config.max_batch_size) > 0,
                ),
            )
        unmapped = sorted(k for k, t in ins.items() if k not in step.input_map and not t.optional)
        if unmapped:
            yield tf(
                C_MAP,
                m,
                f"step {i} ({step.model_name}) leaves input(s) {unmapped} unmapped",
                f'map them in input_map {{ key: "{unmapped[0]}" value: "..." }}',
                element=el,
                line=line,
                step=i,
                unmapped=unmapped,
            )
    for t in c.output:
        prod = producers.get(t.name)
        if prod is None:
            yield tf(
                C_MAP,
                m,
                f"ensemble output {t.name!r} is produced by no step",
                f"map a step output to {t.name!r} in its output_map",
                element=f"output {t.name}",
                line=m.line_of_tensor(t.name),
                tensor=t.name,
            )
        else:
            yield from _agree(
                m,
                f"output {t.name}",
                m.line_of_tensor(t.name),
                t.name,
                prod,
                _Tensor("ensemble output", dtype_name(t.data_type), _own_dims(t), mbs > 0),
            )
    for t in c.input:
        if t.name not in consumed:
            yield tf(
                C_UNUSED,
                m,
                f"ensemble input {t.name!r} is read by no step",
                f"map {t.name!r} in a step's input_map or remove it",
                element=f"input {t.name}",
                line=m.line_of_tensor(t.name),
                tensor=t.name,
            )
    cycle = _find_cycle(edges)
    if cycle:
        names = [f"{i}:{steps[i].model_name}" for i in cycle]
        yield tf(
            C_CYCLE,
            m,
            f"ensemble steps form a cycle: {' -> '.join(names)}",
            "break the loop: a step cannot (indirectly) consume its own output",
            element=f"step[{cycle[0]}]",
            line=m.line_of("ensemble_scheduling"),
            cycle=names,
        )


def _agree(m: TritonModel, el: str, line: int | None, tensor: str, prod: _Tensor, cons: _Tensor) -> Iterator[Finding]:
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
    if not _compatible(prod.dims, cons.dims) and not _compatible(prod.full, cons.full):
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
