"""The in-process executor, its runners and observers, and the events of a streamed request."""

from usg.records import NodeEvent
from usg.runtime.align import AlignBuffer, Aligned, AlignStats
from usg.runtime.events import ExecutionEvent, Finished, NodeFinished, TokenDelta
from usg.runtime.executor import Executor, ExecutorState
from usg.runtime.observer import Observer
from usg.runtime.request import plan_request
from usg.runtime.result import InferResult, to_jsonable

__all__ = [
    "AlignBuffer",
    "AlignStats",
    "Aligned",
    "ExecutionEvent",
    "Executor",
    "ExecutorState",
    "Finished",
    "InferResult",
    "NodeEvent",
    "NodeFinished",
    "Observer",
    "TokenDelta",
    "plan_request",
    "to_jsonable",
]
