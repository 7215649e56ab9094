"""One model as its own HTTP microservice (FastAPI on uvicorn), for the ``http-stitched`` baseline.

``python -m usg.bench.baselines.http_service --port N onnx --path MODEL.onnx --threads T``
serves ``POST /infer``: body = ``.npy`` of the stacked [n,…] input, answer = ``.npy`` of the
first output. ``... embed --tokenizer tokenizer.json --path minilm.onnx`` serves ``POST /embed``:
JSON ``{"texts": [...]}`` → ``.npy`` [n, 384]. ``GET /health`` answers once the model is loaded.
Inference runs in the server's thread pool (ONNX Runtime releases the GIL).
"""

# no `from __future__ import annotations`: FastAPI resolves the endpoint annotations at runtime
import argparse
import io
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["build_app", "main"]


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npy_load(data: bytes) -> np.ndarray:
    return np.asarray(np.load(io.BytesIO(data), allow_pickle=False))


def build_app(args: argparse.Namespace) -> Any:
    from fastapi import FastAPI, Request, Response
    from starlette.concurrency import run_in_threadpool

    from usg.bench.baselines.models import TextEmbedder, onnx_session

    app = FastAPI(title=f"usg-bench {args.kind} {Path(args.path).name}")
    if args.kind == "onnx":
        backend = onnx_session(Path(args.path), args.threads)
        input_name = next(iter(backend.input_specs))

        def run(x: np.ndarray) -> np.ndarray:
            out = backend.infer({input_name: x})
            return np.asarray(next(iter(out.values())))

        @app.post("/infer")
        async def infer(request: Request) -> Response:
            x = npy_load(await request.body())
            y = await run_in_threadpool(run, x)
            return Response(npy_bytes(y), media_type="application/octet-stream")

    else:
        embedder = TextEmbedder(Path(args.tokenizer), Path(args.path), threads=args.threads, max_length=args.max_length)

        @app.post("/embed")
        async def embed(request: Request) -> Response:
            texts = (await request.json())["texts"]
            y = await run_in_threadpool(embedder.embed, texts)
            return Response(npy_bytes(y), media_type="application/octet-stream")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="usg.bench.baselines.http_service")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    sub = parser.add_subparsers(dest="kind", required=True)
    onnx = sub.add_parser("onnx")
    onnx.add_argument("--path", required=True)
    onnx.add_argument("--threads", type=int, default=0)
    emb = sub.add_parser("embed")
    emb.add_argument("--path", required=True)
    emb.add_argument("--tokenizer", required=True)
    emb.add_argument("--threads", type=int, default=0)
    emb.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args(argv)
    import uvicorn

    uvicorn.run(build_app(args), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
