"""The load generator of bench_serve.py, in its own process (as ``vllm bench serve`` is): it shares
no interpreter lock with the server it measures.

    python scripts/bench_serve_client.py --url http://127.0.0.1:PORT --spec spec.json --out result.json

spec.json: {"requests": [[prompt_ids, max_tokens], ...], "rate": 8.0 | "inf", "seed": 0, "model": name}.
Arrivals are Poisson at ``rate`` requests/s (exponential gaps, seeded), or all at once for "inf".
Every request streams (``return_token_ids``), so each token's arrival time is seen. Per request:
TTFT (send -> first token), TPOT ((e2e - TTFT) / (tokens - 1)), the inter-token gaps (ITL), e2e.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


async def one(client, url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    t0 = time.perf_counter()
    times, tokens, reasons = [], 0, []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
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
                tpot=(times[-1] - times[0]) / (tokens - 1) if tokens > 1 else None,
                itl=[b - a for a, b in zip(times, times[1:])], prompt_len=len(prompt))


async def run(spec: dict, url: str) -> dict:
    import httpx
    rng = random.Random(spec.get("seed", 0))
    rate = spec["rate"]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        tasks, t0 = [], time.perf_counter()
        for prompt, max_tokens in spec["requests"]:
            tasks.append(asyncio.create_task(one(client, url, spec["model"], prompt, max_tokens)))
            if rate != "inf":
                await asyncio.sleep(rng.expovariate(float(rate)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return dict(rate=rate, duration_s=duration, requests=results)


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
    main()
