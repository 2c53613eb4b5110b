"""Lesson 10's wall: offline ``generate`` cannot serve a second user; the server can.

    python scripts/l10_wall.py                  # tiny Qwen3; CPU: the PyTorch attention (as the server's --impl auto)

User A sends a batch (16 requests of 200 tokens); user B sends one short request (8 tokens)
0.2 s later. Offline, the one ``LLM`` is inside A's ``generate`` until A's batch is done, so B
waits for all of it (B holds a lock around the LLM, the only safe way to share one). Served, B's
request joins the running batch at the next step. Prints both, and a verdict: OK when B's first
token came before A's batch finished when served, and only after it offline.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time

from plumbing.cli import run_main

A_N, A_TOKENS, B_TOKENS, B_DELAY = 16, 200, 8, 0.2


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the built-in tiny Qwen3")
    return ap.parse_args(argv)


def offline(llm, SamplingParams) -> tuple[float, float]:
    """(A's batch done, B's first token), seconds after A started."""
    lock, t0, done = threading.Lock(), time.perf_counter(), {}

    def user_a():
        with lock:
            llm.generate([f"user A, request {i}" for i in range(A_N)],
                         SamplingParams(max_tokens=A_TOKENS, ignore_eos=True), use_tqdm=False)
            done["a"] = time.perf_counter() - t0
    thread = threading.Thread(target=user_a)
    thread.start()
    time.sleep(B_DELAY)
    with lock:                  # generate returns everything at the end: its first token is its last
        llm.generate(["user B"], SamplingParams(max_tokens=B_TOKENS, ignore_eos=True), use_tqdm=False)
        done["b"] = time.perf_counter() - t0
    thread.join()
    return done["a"], done["b"]


async def served(base: str) -> tuple[float, float, float]:
    """(A's batch done, B's first token, B's last token), seconds after A started."""
    import httpx
    t0 = time.perf_counter()

    async def stream(client, prompt, n, marks):
        body = {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "stream": True}
        async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    marks.append(time.perf_counter() - t0)

    async def user_b(client, marks):
        await asyncio.sleep(B_DELAY)
        await stream(client, "user B", B_TOKENS, marks)
    async with httpx.AsyncClient(timeout=600) as client:
        a_marks, b_marks = [[] for _ in range(A_N)], []
        await asyncio.gather(*[stream(client, f"user A, request {i}", A_TOKENS, a_marks[i]) for i in range(A_N)],
                             user_b(client, b_marks))
    return max(m[-1] for m in a_marks), b_marks[0], b_marks[-1]


def main(argv=None) -> int:
    a = parse(argv)
    import torch
    from l4_sampler import SamplingParams
    from l9_fp8_kv import LLM
    from l10_server.serve import impl_options, make_server, running_in_thread
    kw = impl_options("cuda" if torch.cuda.is_available() else "cpu")     # as the server's --impl auto
    llm = LLM(a.model, **kw)
    llm.generate(["warm-up"], SamplingParams(max_tokens=2), use_tqdm=False)
    print(f"wall: user A sends {A_N} requests x {A_TOKENS} tokens; user B sends 1 request x {B_TOKENS} tokens "
          f"{B_DELAY} s later")
    a_done, b_first = offline(llm, SamplingParams)
    print(f"offline llm.generate: B's first token after {b_first:.3f} s; A's batch took {a_done:.3f} s")
    with running_in_thread(make_server(a.model, kw)) as base:      # its own engine core process
        sa_done, sb_first, sb_last = asyncio.run(served(base))
    print(f"served (l10_server):  B's first token after {sb_first:.3f} s, its last after {sb_last:.3f} s; "
          f"A's batch took {sa_done:.3f} s")
    ok = b_first >= a_done and sb_first < sa_done
    print("verdict: OK, offline user B waited for user A's whole batch; served, its first token came while "
          "A's batch ran" if ok else "verdict: FAIL, the timeline is not the one the lesson describes")
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
