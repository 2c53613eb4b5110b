"""The load generator of bench_serve.py, in its own process (as ``vllm bench serve`` is): it shares
no interpreter lock with the server it measures.

    python benchmarks/bench_serve_client.py --url http://127.0.0.1:PORT --spec spec.json --out result.json

spec.json: {"requests": [[prompt_ids, max_tokens], ...], "rate": 8.0 | "inf", "seed": 0, "model": name,
"http": "raw" | "httpx"}. Arrivals are Poisson at ``rate`` requests/s (exponential gaps, seeded), or
all at once for "inf". Every request streams (``return_token_ids``), so each token's arrival time
is seen. Per request: TTFT (send -> first token), TPOT ((e2e - TTFT) / (tokens - 1)), the
inter-token gaps (ITL), e2e.

The HTTP client ("http"): by default a plain HTTP/1.1 one on asyncio's streams, one connection a
request (``raw_stream``: some 40 lines). A load generator must be cheaper than the server it
measures, and httpx is not: on 256 streams at once its per-request and per-chunk cost delays when
requests go out and when tokens are seen (``--http httpx`` measures with it; docs/benchmarks.md has both).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from contextlib import asynccontextmanager
from urllib.parse import urlsplit


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


class RawResponse:
    """A response read straight off the socket: the status, then the body's lines as they come."""

    def __init__(self, status: int, headers: dict, reader):
        self.status_code, self.headers, self.reader = status, headers, reader

    async def _chunks(self):
        r = self.reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():   # a streamed response
            while True:
                line = await r.readline()
                if not line.endswith(b"\n"):
                    raise ConnectionError("the server closed the connection inside a chunked body")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    return
                chunk = await r.readexactly(size + 2)                  # each chunk ends with CRLF
                if chunk[-2:] != b"\r\n":
                    raise ConnectionError("a chunk of the body does not end with CRLF")
                yield chunk[:-2]
        n = self.headers.get("content-length")
        yield await (r.readexactly(int(n)) if n is not None else r.read())

    async def aiter_lines(self):
        buf = b""
        async for chunk in self._chunks():
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                yield line.decode().rstrip("\r")
        if buf:
            yield buf.decode()

    async def aread(self) -> bytes:
        return b"".join([c async for c in self._chunks()])


@asynccontextmanager
async def raw_stream(url: str, body: dict):
    """POST ``body`` as JSON over a new connection; yields a RawResponse once the headers are in."""
    u = urlsplit(url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        data = json.dumps(body).encode()
        writer.write(f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        yield RawResponse(status, headers, reader)
    finally:
        writer.close()


async def one(client, url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    t0 = time.perf_counter()
    times, tokens, reasons = [], 0, []
    stream = raw_stream(f"{url}/v1/completions", body) if client is None else \
        client.stream("POST", f"{url}/v1/completions", json=body)
    async with stream as r:
        accepted = time.perf_counter()                # the headers: the engine core took the prompt
        if r.status_code != 200:
            return dict(ok=False, error=(await r.aread()).decode()[:200])
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                n = len(choice.get("token_ids", []))
                if n:
                    times.append(time.perf_counter())
                    tokens += n
                if choice["finish_reason"] is not None:
                    reasons.append(choice["finish_reason"])
    end = time.perf_counter()
    if not times:
        return dict(ok=False, error="no tokens")
    ttft = times[0] - t0
    return dict(ok=reasons == ["length"] and tokens == max_tokens, ttft=ttft, e2e=end - t0, tokens=tokens,
                sent=t0, accepted=accepted, first=times[0], last=times[-1], end=end,    # perf_counter times
                tpot=(times[-1] - times[0]) / (tokens - 1) if tokens > 1 else None,
                itl=[b - a for a, b in zip(times, times[1:])], prompt_len=len(prompt))


async def bounded(request, seconds: float = 600.0) -> dict:
    """A request that takes longer than ``seconds`` counts as failed; the run goes on."""
    try:
        return await asyncio.wait_for(request, seconds)
    except Exception as e:          # timed out, refused, cut off, garbled: this request failed, not the run
        return dict(ok=False, error=f"{type(e).__name__}: {e}"[:200])


async def run(spec: dict, url: str) -> dict:
    rng = random.Random(spec.get("seed", 0))
    rate = spec["rate"]
    async with http_client(spec.get("http", "raw")) as client:
        tasks, t0 = [], time.perf_counter()
        for prompt, max_tokens in spec["requests"]:
            tasks.append(asyncio.create_task(bounded(one(client, url, spec["model"], prompt, max_tokens))))
            if rate != "inf":
                await asyncio.sleep(rng.expovariate(float(rate)))
        results = await asyncio.gather(*tasks)
        end = time.perf_counter()
    return dict(rate=rate, duration_s=end - t0, start=t0, end=end, requests=results)


@asynccontextmanager
async def http_client(kind: str):
    """None for the raw client (a connection a request, nothing shared), else an httpx.AsyncClient."""
    if kind == "raw":
        yield None
        return
    if kind != "httpx":
        raise SystemExit(f"spec 'http' must be 'raw' or 'httpx', got {kind!r}")
    import httpx
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        yield client


def main(argv=None):
    a = parse(argv)
    with open(a.spec) as f:
        spec = json.load(f)
    if spec.get("sequential"):                       # one request at a time (the single-request latency)
        out = {"rate": "sequential", "requests": [], "duration_s": 0.0}
        for req in spec["requests"]:
            r = asyncio.run(run(dict(spec, requests=[req], rate="inf"), a.url))
            out["requests"] += r["requests"]
            out["duration_s"] += r["duration_s"]
    else:
        out = asyncio.run(run(spec, a.url))
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    from plumbing.cli import run_main
    run_main(main)
