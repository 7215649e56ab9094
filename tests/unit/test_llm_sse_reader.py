"""Decoding an engine's streamed chat completion fed piece by piece (usg.backends.openai_stream):
the same answer however the bytes are cut, SSE fields and line endings, ``[DONE]``, and the
errors of a malformed or cut-off stream."""

from __future__ import annotations

import json

import pytest

from usg import BackendError
from usg.backends.openai_stream import MAX_LINE_BYTES, CallRecorder, ChatStreamReader, SSEDecoder


def _chunk(content: str | None = None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    return json.dumps({"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


STREAM = (
    f"data: {_chunk('Olá')}\n\n"
    ": keep-alive\r\n\r\n"
    f"event: message\r\nid: 7\r\ndata: {_chunk(' mundo')}\r\n\r\n"
    f"data:  {_chunk(finish='stop')}\n\n"  # two spaces: JSON with whitespace before it
    "data: [DONE]\n\n"
    "data: {after done, never parsed\n\n"
).encode()


def _read(pieces: list[bytes]) -> tuple[str, CallRecorder]:
    call = CallRecorder("m", "http://e")
    reader = ChatStreamReader(call, "model 'llm'")
    for piece in pieces:
        reader.feed(piece)
    return reader.finish(), call


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, len(STREAM)])
def test_the_answer_is_the_same_however_the_bytes_are_cut(size: int) -> None:
    text, call = _read([STREAM[i : i + size] for i in range(0, len(STREAM), size)])
    assert text == "Olá mundo"  # "á" is two UTF-8 bytes: cut between them at size 1
    assert call.deltas == 2 and call.finish_reason == "stop" and call.request_id == "c1"


def test_multi_line_data_is_joined_and_unknown_fields_are_refused() -> None:
    decoder = SSEDecoder("w")
    assert decoder.feed(b"data: a\ndata: b\n\n") == ["a\nb"]
    with pytest.raises(BackendError, match="not a Server-Sent Event field: '<html>'") as info:
        decoder.feed(b"<html>\n")
    assert info.value.status == 502


def test_a_stream_cut_mid_event_or_before_its_end_is_an_error() -> None:
    with pytest.raises(BackendError, match="ended in the middle of an event"):
        _read([f"data: {_chunk('a')}\n\ndata: {_chunk('b')}".encode()])
    with pytest.raises(BackendError, match=r"ended after 1 token deltas, before the answer finished"):
        _read([f"data: {_chunk('a')}\n\n".encode()])
    assert _read([f"data: {_chunk('a', finish='length')}\n\n".encode()])[0] == "a"  # a finish_reason ends it


def test_a_line_longer_than_the_limit_is_refused() -> None:
    decoder = SSEDecoder("w")
    decoder.feed(b"data: " + b"x" * (MAX_LINE_BYTES // 2))
    with pytest.raises(BackendError, match=f"longer than {MAX_LINE_BYTES} bytes"):
        decoder.feed(b"x" * (MAX_LINE_BYTES // 2 + 16))


def test_an_event_whose_data_lines_never_end_is_refused() -> None:
    # before: each "data:" line was kept until a blank line ended the event, so an engine that never
    # sent one grew usg serve by ~330 MB/s (13 GB before the request's 60 s deadline)
    decoder = SSEDecoder("w")
    line = b"data: " + b"x" * 1000 + b"\n"
    for _ in range(MAX_LINE_BYTES // len(line)):
        decoder.feed(line)
    with pytest.raises(BackendError, match=f"an event over {MAX_LINE_BYTES} bytes") as info:
        for _ in range(2):
            decoder.feed(line * 64)
    assert info.value.status == 502
    assert SSEDecoder("w").feed(b"data: a\n" * 1000 + b"\n") == ["\n".join(["a"] * 1000)]  # many short lines: one event


def test_a_chunk_nested_past_the_parser_is_a_malformed_chunk() -> None:
    # before: json's RecursionError escaped: a 500 "internal error (RecursionError)" and a traceback
    for data in (b"[" * 100_000, b'{"choices": [{"delta": {"content": ' + b"[" * 100_000):
        with pytest.raises(BackendError, match=r"malformed stream chunk \(not JSON\)") as info:
            _read([b"data: " + data + b"\n\n"])
        assert info.value.status == 502


def test_malformed_and_error_chunks() -> None:
    with pytest.raises(BackendError, match=r"malformed stream chunk \(not JSON\): '\{nope'"):
        _read([b"data: {nope\n\n"])
    with pytest.raises(BackendError, match=r"malformed stream chunk \(not JSON\)"):
        _read([b'data: {"a": 1} trailing\n\n'])
    with pytest.raises(BackendError, match=r"not a JSON object"):
        _read([b"data: [1, 2]\n\n"])
    with pytest.raises(BackendError, match="the engine failed while generating: CUDA out of memory"):
        _read([b'data: {"error": {"message": "CUDA out of memory"}}\n\n'])


def test_an_engine_that_ignores_max_tokens_is_cut_off() -> None:
    call = CallRecorder("m", "http://e")
    reader = ChatStreamReader(call, "model 'llm'", max_tokens=8)
    token = f"data: {_chunk('tok')}\n\n".encode()
    for _ in range(reader.max_deltas):  # twice max_tokens and a margin: still an answer
        reader.feed(token)
    with pytest.raises(BackendError, match="max_tokens") as err:
        reader.feed(token)
    assert err.value.status == 502 and f"{reader.max_deltas + 1} token deltas" in str(err.value)


@pytest.mark.parametrize(
    "filler",
    [
        f"data: {_chunk()}\n\n".encode(),  # empty deltas
        b": keep-alive\n\n",  # comments
        b"\n",  # blank lines
    ],
    ids=["empty-deltas", "comments", "blank-lines"],
)
def test_an_engine_that_streams_nothing_forever_is_cut_off(filler: bytes) -> None:
    # before: lines without text were not counted, so such a stream ran (a core busy parsing it)
    # until the request's deadline
    reader = ChatStreamReader(CallRecorder("m", "http://e"), "model 'llm'", max_tokens=8)
    with pytest.raises(BackendError, match=f"{reader.max_lines} lines") as err:
        for _ in range(reader.max_lines + 1):
            reader.feed(filler)
    assert err.value.status == 502 and "max_tokens" in str(err.value)


def test_a_full_answer_with_every_kind_of_line_is_within_the_line_bound() -> None:
    reader = ChatStreamReader(CallRecorder("m", "http://e"), "model 'llm'", max_tokens=8)
    event = f": keep-alive\r\n\r\nevent: message\r\nid: 1\r\ndata: {_chunk('tok')}\r\n\r\n".encode()
    reader.feed(f"data: {_chunk()}\n\n".encode())  # the role chunk
    for _ in range(8):
        reader.feed(event)
    reader.feed(f"data: {_chunk(finish='length')}\n\ndata: [DONE]\n\n".encode())
    assert reader.finish() == "tok" * 8


def test_a_huge_delta_is_cut_off_by_characters() -> None:
    reader = ChatStreamReader(CallRecorder("m", "http://e"), "model 'llm'", max_tokens=4)
    big = f"data: {_chunk('x' * 60_000)}\n\n".encode()
    reader.feed(big)  # within 1 KiB a token + 64 KiB
    with pytest.raises(BackendError, match="characters"):
        reader.feed(big)


def test_usage_null_on_every_chunk_and_the_usage_of_the_last() -> None:
    """vLLM sends ``"usage": null`` on each chunk and the usage on the last one."""

    def chunk(content: str | None, finish: str | None, usage: dict[str, int] | None) -> bytes:
        delta = {} if content is None else {"content": content}
        doc = {"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": usage}
        return f"data: {json.dumps(doc)}\n\n".encode()

    usage = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
    text, call = _read([chunk("a", None, None), chunk("b", None, None), chunk(None, "length", usage)])
    assert text == "ab"
    assert (call.prompt_tokens, call.completion_tokens, call.finish_reason, call.deltas) == (11, 2, "length", 2)
