"""The in-process executor, its runners and observers."""

from usg.records import NodeEvent
from usg.runtime.executor import Executor, ExecutorState, plan_request
from usg.runtime.observer import Observer
from usg.runtime.result import InferResult, to_jsonable

__all__ = ["Executor", "ExecutorState", "InferResult", "NodeEvent", "Observer", "plan_request", "to_jsonable"]
