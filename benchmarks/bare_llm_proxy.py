"""The least a process in front of the engine can do, as ``benchmarks/llm_overhead.py``'s floor.

A Starlette app under uvicorn (uvloop, httptools, no access log: ``usg serve``'s own settings)
with one route, ``POST /v1/infer``: it reads ``{"inputs": {"question": ...}}``, builds the same
chat completion ``usg.ops.llm:chat`` builds, posts it through USG's own engine client
(:class:`usg.backends.engine_http.EngineClient`, at most ``max_inflight`` at once, like the
``openai`` backend) and answers ``{"outputs": {"answer": ...}}``. No graph, validation, limits,
metrics, tracing or error mapping: what is left of ``usg serve``'s CPU a question is the HTTP in,
the HTTP out and the loopback TCP that any proxy on this machine pays.

Run: ``python benchmarks/bare_llm_proxy.py ENGINE_URL MODEL PORT MAX_TOKENS MAX_INFLIGHT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from usg.backends.engine_http import EngineClient
from usg.ops.llm import chat


def app(engine_url: str, model: str, max_tokens: int, max_inflight: int) -> Starlette:
    state: dict[str, Any] = {}

    async def infer(request: Request) -> Response:
        if "client" not in state:  # on the server's loop
            state["client"] = EngineClient(engine_url, 300.0, max_inflight)
            state["sem"] = asyncio.Semaphore(max_inflight)
        question = json.loads(await request.body())["inputs"]["question"]
        messages = chat(system="Be brief.", user="Question: {question}", question=question)["messages"]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens}
        async with state["sem"]:
            resp = await state["client"].post(f"{engine_url}/v1/chat/completions", json=body)
        answer = resp.json()["choices"][0]["message"]["content"]
        return Response(json.dumps({"outputs": {"answer": answer}}), media_type="application/json")

    async def ready(request: Request) -> Response:
        return Response("ready")

    return Starlette(routes=[Route("/v1/infer", infer, methods=["POST"]), Route("/v2/health/ready", ready)])


def main() -> None:
    engine_url, model, port, max_tokens, max_inflight = sys.argv[1:6]
    uvicorn.run(
        app(engine_url, model, int(max_tokens), int(max_inflight)),
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
        access_log=False,
        http="httptools",
        loop="uvloop",
    )


if __name__ == "__main__":
    main()
