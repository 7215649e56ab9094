"""Streaming sessions: timestamped chunks of audio, images and text in, events out.

- :class:`SessionManager` / :class:`Session` (:mod:`usg.stream.session`): the Python API;
- :class:`SessionLimits` (:mod:`usg.stream.limits`): chunk bytes, chunk rate, idle timeout,
  pending chunks and events, sessions;
- :mod:`usg.stream.wire`: the WebSocket frames of ``WS /v1/stream/{graph}`` (docs/streaming.md).

Stateful models (``state:`` on a model) keep their state per session; see :mod:`usg.runtime.streams`.
"""

from usg.stream.limits import SessionLimits
from usg.stream.session import Chunk, EventQueue, Session, SessionManager, error_event

__all__ = ["Chunk", "EventQueue", "Session", "SessionLimits", "SessionManager", "error_event"]
