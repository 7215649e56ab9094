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
