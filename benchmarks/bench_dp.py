"""Data parallelism (stage 12) through stage 10's server: ``--dp`` replicas of the engine, one per GPU,
against one engine, all requests at once (rate inf), output tokens per second; and, on a workload of
shared prefixes, least-loaded routing against prefix-aware routing.

    python -m benchmarks.bench_dp                # 2 GPUs, a random-weight Qwen3-0.6B (a few minutes)
    python -m benchmarks.bench_dp --tiny         # CPU smoke test of the script (tiny model, 2 processes)

Rows, each a fresh server (``l10_server.serve.make_server``, engine options as ``--impl auto``):
``dp 1`` and ``dp N`` on nano-vllm's workload (1,024 requests, so that every replica's batch is
full; prompt and output lengths uniform in [100, 1024], random ids, ignore_eos, greedy); then on
the shared-prefix workload (``--groups`` system prompts of ``--prefix-len`` tokens, each followed
by a random question of 32-96 tokens, 64-256 output tokens; prefix caching on, its default)
``dp 1``, ``dp N`` least-loaded and ``dp N`` prefix.
Before each timed run the server serves a few short requests of other prompts (compiles, graphs).
The load generator is benchmarks/bench_serve_client.py, a process of its own, sending every
request at once. Per row: output tok/s, p50 TTFT and TPOT, the requests and generated tokens each
replica took, its prefix-cache hit rate (from /metrics, labelled by engine); and each replica's
stretch of steps on the client's clock (``replica``), so that a shortfall is pinned on the engines
(a replica that finished early: the load was uneven, or the run's tail) or on what surrounds them
(the server, the client: engines that finished together, long before the client); and the steady
state (``full_stretch``: while every replica's batch is full) apart from the tail. The goal (issue 40):
dp 2 at least 1.9x dp 1 on the first workload.

Every process (server, engine cores, their workers) runs with NVLink multicast off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: set here, inherited).
A GPU run writes benchmarks/results/bench_dp/<n>x<gpu>.{json,md,png}; --tiny writes under out/bench_dp/.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time

NVLS_OFF = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
GOAL = 1.9


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dp", type=int, default=2, help="replicas compared with one engine")
    ap.add_argument("--num-requests", type=int, default=1024, help="requests of the random workload: enough that "
                    "every replica runs full batches (max_num_seqs 256 each)")
    ap.add_argument("--groups", type=int, default=16, help="shared-prefix workload: system prompts")
    ap.add_argument("--per-group", type=int, default=16, help="shared-prefix workload: requests per system prompt")
    ap.add_argument("--prefix-len", type=int, default=1024, help="shared-prefix workload: tokens of a system prompt")
    ap.add_argument("--skip", default="", help="comma-separated workloads to leave out: random,prefix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="folder for bench_dp.{json,md,png} (default: benchmarks/results/"
                                                "bench_dp/<n>x<gpu>.* on GPUs, out/bench_dp/ for --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, short requests, CPU ok: smoke-test the script")
    a = ap.parse_args(argv)
    if a.dp < 2:
        ap.error(f"--dp must be at least 2 (it is compared with one engine), got {a.dp}")
    if not set(filter(None, a.skip.split(","))) <= {"random", "prefix"}:
        ap.error(f"--skip takes random, prefix or both: got {a.skip!r}")
    return a


def shared_prefix(groups, per_group, prefix_len, vocab, seed):
    """``groups`` system prompts, ``per_group`` random questions after each, shuffled (arrival order)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(prefix_len)] for _ in range(groups)]
    work = [(s + [rng.randrange(vocab) for _ in range(rng.randint(32, 96))], rng.randint(64, 256))
            for s in systems for _ in range(per_group)]
    rng.shuffle(work)
    return work


SERIES = ("vllm:generation_tokens_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
          "tll:engine_step_seconds_total", "tll:engine_send_seconds_total", "tll:engine_busy_periods_total",
          "tll:engine_busy_since_seconds", "tll:engine_last_step_end_seconds")
CLOCKS = ("engine_busy_since_seconds", "engine_last_step_end_seconds")    # times, not counts: never differenced


def per_engine(url: str) -> dict:
    """/metrics' engine-core series by engine index (urllib: the GPU box has no httpx)."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families
    with urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name in SERIES:
                out.setdefault(s.labels["engine"], {})[s.name.split(":")[1].removesuffix("_total")] = s.value
    return out


def replica(before: dict, after: dict, start: float, end: float) -> dict:
    """One engine core over a timed run: its counters' change, and its stretch of steps on the
    client's clock (one monotonic clock for every process of the machine). ``span_s``: its first
    step's wake-up to its last step's end (None if it went idle in between: then the stretch is not
    one); ``done_before_end_s``: how long before the client's last token it finished stepping (the
    run's tail, where this replica's GPU had nothing left); ``tok_per_s``: its tokens over its span."""
    d = {k: v if k in CLOCKS else v - before.get(k, 0) for k, v in after.items()}
    one = d.get("engine_busy_periods") == 1
    span = d["engine_last_step_end_seconds"] - d["engine_busy_since_seconds"] if one else None
    return dict(d, hit_rate=d["prefix_cache_hits"] / max(d["prefix_cache_queries"], 1), span_s=span,
                start_s=d["engine_busy_since_seconds"] - start if one else None,
                done_before_end_s=end - d["engine_last_step_end_seconds"],
                tok_per_s=d["generation_tokens"] / span if span else None,
                send_share=d["engine_send_seconds"] / span if span else None)


class Sampler(threading.Thread):
    """Every engine core's latest snapshot (running, waiting, tokens so far) every ``period`` s while a
    run goes on: the server runs in this process, so its AsyncLLM's snapshots are read directly."""

    def __init__(self, llm, period: float = 0.1):
        super().__init__(daemon=True)
        self.llm, self.period, self.samples, self.done = llm, period, [], threading.Event()

    def run(self):
        while not self.done.is_set():
            self.samples.append((time.perf_counter(), [(s.get("running", 0), s.get("generation_tokens", 0))
                                                       for s in list(self.llm.snapshots)]))
            self.done.wait(self.period)


def full_stretch(samples: list) -> dict | None:
    """The run's stretch where every engine ran its most requests at once (its batch full: the
    steady state), from samples ``(t, [(running, tokens), ...])``: its seconds, output tok/s, and
    the seconds after it (the tail, batches draining). None if no two samples are full."""
    if not samples:
        return None
    peak = [max(s[1][e][0] for s in samples) for e in range(len(samples[0][1]))]
    full = [i for i, (_, engines) in enumerate(samples) if all(r == p > 0 for (r, _), p in zip(engines, peak))]
    if len(full) < 2:
        return None
    (t0, a), (t1, b) = samples[full[0]], samples[full[-1]]
    tokens = sum(y for _, y in b) - sum(y for _, y in a)
    return dict(seconds=t1 - t0, tok_per_s=tokens / (t1 - t0) if t1 > t0 else None, peak=peak,
                tail_s=samples[-1][0] - t1)


def serve(path, name, kw, work, warm, label, seed) -> dict:
    """One fresh server with these engine options: warmed up, then ``work`` all at once."""
    from benchmarks.bench_serve import _client_run
    from benchmarks.bench_serve_report import summarize
    from l10_server.serve import make_server, running_in_thread
    t = time.perf_counter()
    server = make_server(path, kw, name, max_pending=100_000)
    start_s = time.perf_counter() - t
    with running_in_thread(server, timeout=600) as url:
        _client_run(url, name, warm, "inf", seed)
        before = per_engine(url)
        sampler = Sampler(server.async_llm)
        sampler.start()
        raw = _client_run(url, name, work, "inf", seed)
        sampler.done.set()
        sampler.join()
        after = per_engine(url)
        client = server.async_llm.client
        sent = list(getattr(getattr(client, "router", None), "sent", [len(work) + len(warm)]))
    r = summarize(raw, label)
    r.update(start_s=start_s, describe=server.describe, routed=sent, full=full_stretch(sampler.samples),
             engines={e: replica(before.get(e, {}), d, raw["start"], raw["end"]) for e, d in sorted(after.items())})
    print(r["line"] + f"; replicas took {sent} requests (warm-up included)", flush=True)
    return r


def checkpoint(a):
    """(path, served name, prompt/output length bounds, vocabulary size)."""
    from benchmarks.outputs import scratch_dir
    if a.tiny:
        from plumbing.tiny import tiny_checkpoint
        path, name, lo, hi = str(tiny_checkpoint("qwen3")), "tiny-qwen3", 4, 24
        a.num_requests, a.groups, a.per_group, a.prefix_len = 16, 2, 6, 32
    else:
        from benchmarks.bench_serve import write_tokenizer
        from harness.random_checkpoint import build_checkpoint
        path, name, lo, hi = build_checkpoint(os.path.join(scratch_dir("bench_dp"), "qwen3-0.6b-random")), \
            "qwen3-0.6b-random", 100, 1024
    with open(os.path.join(path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    if not a.tiny:
        write_tokenizer(path, vocab)                # a server sends text: the random checkpoint needs one
    return path, name, lo, hi, vocab


def measure(a, device, path, name, lo, hi, vocab) -> list:
    """Every row: dp 1 and dp N on the random workload, then dp 1, N least-loaded, N prefix on shared prefixes."""
    from benchmarks.bench_common import workload
    from l10_server.serve import impl_options
    skip = set(filter(None, a.skip.split(",")))
    kw = dict(impl_options(device), device=device, seed=a.seed)
    warm = workload(4 * a.dp, min(lo, 16), min(hi, 64), vocab, a.seed + 1)
    if a.tiny:                                      # short outputs: a CPU is slow even without the interpreter
        warm = [(p, 4) for p, _ in warm]
    rows = []
    if "random" not in skip:
        work = workload(a.num_requests, lo, hi, vocab, a.seed)
        for dp in (1, a.dp):
            rows.append(dict(serve(path, name, dict(kw, data_parallel_size=dp) if dp > 1 else kw, work, warm,
                                   f"dp {dp}", a.seed), workload="random", dp=dp,
                             routing="least_loaded" if dp > 1 else "-"))
    if "prefix" not in skip:
        work = shared_prefix(a.groups, a.per_group, a.prefix_len, vocab, a.seed + 5)
        if a.tiny:
            work = [(p, min(m, 12)) for p, m in work]
        for dp, routing in ((1, None), (a.dp, "least_loaded"), (a.dp, "prefix")):
            opts = kw if dp == 1 else dict(kw, data_parallel_size=dp, data_parallel_routing=routing)
            rows.append(dict(serve(path, name, opts, work, warm, f"prefix, dp {dp}" + (f" {routing}" if routing else ""),
                                   a.seed), workload="prefix", dp=dp, routing=routing or "-"))
    return rows


def main(argv=None):
    a = parse(argv)
    for k, v in NVLS_OFF.items():                   # every process started from here inherits them
        os.environ.setdefault(k, v)
    import torch

    from benchmarks.bench_common import bench_device
    from benchmarks.bench_dp_report import markdown, plot
    from benchmarks.outputs import RESULTS, gpu_slug, save_results, scratch_dir
    from plumbing.plot import wrote
    device = bench_device(a.tiny)
    ngpu = torch.cuda.device_count() if device == "cuda" else 0
    if device == "cuda" and ngpu < a.dp:
        sys.exit(f"--dp {a.dp} needs {a.dp} GPUs and {ngpu} are visible (CUDA_VISIBLE_DEVICES)")
    path, name, lo, hi, vocab = checkpoint(a)
    rows = measure(a, device, path, name, lo, hi, vocab)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    meta = dict(device=gpu, gpus=ngpu, torch=torch.__version__, model=name, dp=a.dp, tiny=a.tiny,
                workload_random=f"{a.num_requests} requests, prompt and output lengths uniform in [{lo}, {hi}], random "
                                "ids, ignore_eos, greedy, all at once",
                workload_prefix=f"{a.groups} system prompts of {a.prefix_len} tokens x {a.per_group} questions of "
                                "32-96 tokens, 64-256 output tokens" + (" (12 at most: --tiny)" if a.tiny else "") +
                                ", shuffled, all at once; prefix caching on",
                env={k: os.environ[k] for k in NVLS_OFF})
    md = markdown(meta, rows, GOAL, None if not a.tiny else "goals: not judged (--tiny smoke-tests the script on "
                  "the tiny model; its numbers are not a measurement of data parallelism)")
    print("\n" + md)
    if a.out:
        stem = os.path.join(a.out, "bench_dp")
    elif device == "cuda" and not a.tiny:
        stem = str(RESULTS / "bench_dp" / f"{ngpu}x{gpu_slug(gpu)}")
    else:
        stem = os.path.join(scratch_dir("bench_dp"), "bench_dp")
    print(wrote(*save_results(stem, dict(meta=meta, rows=rows), md, lambda plt, p: plot(plt, p, meta, rows))))


if __name__ == "__main__":
    parse(sys.argv[1:])                             # a bad flag stops here, before torch loads
    from plumbing.cli import run_main
    run_main(main)
