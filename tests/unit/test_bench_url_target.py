"""usg bench URL: a URL that does not parse, a port out of range, nobody listening, or a server that
refuses the bench's requests are errors naming the URL and the fix (before: ValueError, an
ExceptionGroup, httpx's ConnectError or HTTPStatusError shown as "internal error")."""

from __future__ import annotations

import asyncio
import functools

import httpx
import pytest

from usg.bench.samples import Sample
from usg.bench.targets import UrlTarget
from usg.cli import EXIT_USAGE, main
from usg.errors import BackendError


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1", "'http://[::1' is not a usable URL (Invalid IPv6 URL)"),
        ("http://127.0.0.1:99999", "'http://127.0.0.1:99999' is not a usable URL (Port out of range 0-65535)"),
        ("http://127.0.0.1:9", "cannot reach a server at http://127.0.0.1:9 (ConnectError"),  # discard port: closed
    ],
)
def test_a_url_it_cannot_use_exits_2(url: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", url, "--duration", "0.5", "--warmup", "0", "-c", "1"])
    err = capsys.readouterr().err.replace("\n", " ")
    assert exc.value.code == EXIT_USAGE and message in err and "internal error" not in err, err


def test_a_refused_request_names_the_status_and_the_servers_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return httpx.Response(401, json={"error": "unauthorized", "message": "missing API key"})

    monkeypatch.setattr(
        httpx, "AsyncClient", functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(answer))
    )

    async def go() -> None:
        target = UrlTarget("http://127.0.0.1:8000")
        await target.start()
        try:
            await target.infer(Sample("s", None, "hello"))
        finally:
            await target.aclose()

    with pytest.raises(BackendError, match=r"http://127\.0\.0\.1:8000/v1/infer answered 401: .*missing API key"):
        asyncio.run(go())


def _server_with_cache_hits(monkeypatch: pytest.MonkeyPatch, hits_per_scrape: int) -> None:
    state = {"hits": 0}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            state["hits"] += hits_per_scrape
            return httpx.Response(200, text=f'usg_cache_lookups_total{{node="emb",outcome="hit"}} {state["hits"]}.0\n')
        return httpx.Response(200, json={"outputs": {"upper": "HELLO"}})

    monkeypatch.setattr(
        httpx, "AsyncClient", functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(answer))
    )


@pytest.mark.parametrize("hits_per_scrape", [0, 7])
def test_a_server_answering_from_its_node_cache_is_noted(monkeypatch: pytest.MonkeyPatch, hits_per_scrape: int) -> None:
    """bench.md: the node cache is off in a benchmark. Against a URL the server's cache stayed on and the bench,
    cycling over a few samples, measured its hits (384 req/s at 5 ms, every model at 0 calls) without a word."""
    from usg.bench.runner import BenchConfig, run_bench

    _server_with_cache_hits(monkeypatch, hits_per_scrape)
    cfg = BenchConfig(
        "http://127.0.0.1:8000", concurrency=(1,), duration_s=0.2, warmup_s=0.0, samples=[Sample("s", None, "hello")]
    )
    report = asyncio.run(run_bench(cfg, None))
    noted = [n for n in report.notes if "from its node cache" in n]
    if hits_per_scrape:
        assert len(noted) == 1 and "fix: restart it with `usg serve GRAPH --no-cache`" in noted[0]
    else:
        assert not noted
