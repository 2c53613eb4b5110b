"""bench_serve's load generator reads HTTP off the socket itself (benchmarks/bench_serve_client.py,
``raw_stream``). Here it reads what httpx reads, from a real uvicorn server whose streamed chunks
cut lines, and a UTF-8 character, in the middle; and a whole (Content-Length) error body."""
import asyncio
import contextlib
import socket
import threading
import time

import httpx
import pytest

from benchmarks.bench_serve_client import raw_stream

EVENTS = ['data: {"choices": [{"text": "caf\u00e9 \u65e5\u672c", "token_ids": [1, 2]}]}', "",
          'data: {"choices": []}', "", "data: [DONE]", ""]
BODY = "\n".join(EVENTS).encode()
CUTS = sorted({0, len(BODY), BODY.index("\u00e9".encode()) + 1, *range(0, len(BODY), 7)})   # one inside é


def _app():
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    app = FastAPI()

    @app.post("/stream")
    async def stream(request: Request):
        await request.body()

        async def pieces():                       # one HTTP chunk each: lines and the UTF-8 bytes of é cut
            for a, b in zip(CUTS, CUTS[1:]):
                yield BODY[a:b]
                await asyncio.sleep(0)
        return StreamingResponse(pieces(), media_type="text/event-stream")

    @app.post("/bad")
    async def bad(request: Request):
        return JSONResponse({"error": {"message": "max_tokens must be >= 1", "param": "max_tokens"}}, 400)
    return app


@pytest.fixture(scope="module")
def base():
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(_app(), log_level="warning"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


async def _read(url, body, raw: bool):
    async with contextlib.AsyncExitStack() as stack:
        if raw:
            r = await stack.enter_async_context(raw_stream(url, body))
        else:
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
            r = await stack.enter_async_context(client.stream("POST", url, json=body))
        if r.status_code != 200:
            return r.status_code, (await r.aread()).decode()
        return r.status_code, [line async for line in r.aiter_lines()]


@pytest.mark.parametrize("path", ["/stream", "/bad"])
def test_the_raw_client_reads_what_httpx_reads(base, path):
    body = {"prompt": [1, 2, 3], "stream": True}
    raw = asyncio.run(asyncio.wait_for(_read(base + path, body, raw=True), 30))
    ref = asyncio.run(asyncio.wait_for(_read(base + path, body, raw=False), 30))
    assert raw == ref
    if path == "/stream":
        assert raw == (200, EVENTS[:-1])          # the body's last newline ends the last line
    else:
        assert raw[0] == 400 and '"param": "max_tokens"' in raw[1].replace('":"', '": "')


@pytest.mark.parametrize("cut", [b"5\r\nhel", b"5\r\nhello\r\n", b"5\r\nhelloXY3\r\nabc\r\n0\r\n\r\n"],
                         ids=["inside_a_chunk", "before_the_next_size", "a_chunk_without_crlf"])
def test_a_cut_or_garbled_chunked_body_is_an_error_not_a_short_stream(cut):
    async def main():
        async def serve(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + cut)
            await writer.drain()
            writer.close()
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        async with server:
            async with raw_stream(url, {"prompt": [1]}) as r:
                return [line async for line in r.aiter_lines()]
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        asyncio.run(asyncio.wait_for(main(), 30))
