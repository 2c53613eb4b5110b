"""Stage 10's server measured the way ``vllm bench serve`` measures one, against the same engine
run offline (``LLM.generate``) by this script just before, on the same kind of workload.

    python -m benchmarks.bench_serve                  # GPU: random Qwen3-0.6B, ~3 minutes
    python -m benchmarks.bench_serve --quick          # CPU smoke test of the script (tiny model)

Workloads: nano-vllm's (256 requests, prompt and output lengths uniform in [100, 1024], random ids,
ignore_eos, greedy), sent at each of ``--rates`` (Poisson arrivals; "inf" = all at once), and
single requests of 128 prompt tokens and 128 output tokens, one after another. The offline LLM
is freed before the server starts: the server's engine core (its own process) loads the same
checkpoint with the same options. The load generator is a third process
(benchmarks/bench_serve_client.py). Each served run gets prompts of its own seed, so no run is
helped by another's prefix-cache hits. Metrics per run: TTFT, TPOT, ITL and e2e
latency (mean, p50, p99), request and output-token throughput. The offline figure is the same
workload through ``llm.generate``; its roofline (bench_e2e's) bounds both.

The random checkpoint ships no tokenizer and a server sends text, so the script writes one: a
byte-level BPE with Qwen3's vocabulary size (256 bytes + made-up words " w256" ...), so every
step detokenizes as it would with a real model. A GPU run writes
benchmarks/results/bench_serve/<gpu>.{json,md,png}; --quick writes under out/.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.outputs import out_help


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=out_help("bench_serve"))
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--rates", default="4,16,inf", help="request rates (req/s) for Poisson arrivals; inf = all at once")
    ap.add_argument("--single", type=int, default=20, help="single 128-in/128-out requests, one after another")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--http", default="raw",
                    help="the load generator's HTTP client(s), comma-separated: raw (plain asyncio, the default) or "
                         "httpx; with both, every rate runs once with each (fresh prompts each run)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the served runs (default: Python's, 0.005 s): how often a thread "
                         "that wants the GIL gets it from one that holds it")
    ap.add_argument("--quick", action="store_true", help="tiny model, 8 short requests: smoke-test the script (CPU ok)")
    a = ap.parse_args(argv)
    try:
        a.rate_list = [r if r == "inf" else float(r) for r in a.rates.split(",")]
    except ValueError:
        ap.error(f"--rates must be numbers or inf, comma-separated: got {a.rates!r}")
    if any(r != "inf" and r <= 0 for r in a.rate_list):
        ap.error("--rates must be positive")
    a.http_list = a.http.split(",")
    if not a.http_list or any(h not in ("raw", "httpx") for h in a.http_list) or len(set(a.http_list)) < len(a.http_list):
        ap.error(f"--http takes raw, httpx or raw,httpx: got {a.http!r}")
    return a


if __name__ == "__main__":
    parse(sys.argv[1:])          # a bad flag stops here, before torch and triton load

import torch  # noqa: E402

import plumbing.runtime  # noqa: E402,F401  (before triton: picks GPU or interpreter; stage packages import lazily)
from benchmarks.bench_common import bench_device, ceilings, free, sync, workload  # noqa: E402
from benchmarks.bench_e2e_report import roofline  # noqa: E402
from benchmarks.bench_serve_report import markdown, plot, summarize  # noqa: E402
from benchmarks.outputs import output_stem, scratch_dir  # noqa: E402
from harness.random_checkpoint import build_checkpoint  # noqa: E402
from l4_sampler import SamplingParams  # noqa: E402
from plumbing.cli import run_main  # noqa: E402
from plumbing.plot import wrote  # noqa: E402
from plumbing.tiny import tiny_checkpoint  # noqa: E402


def write_tokenizer(path: str, vocab_size: int) -> None:
    """A byte-level BPE tokenizer covering ``vocab_size`` ids (decode-only words past the 256 bytes)."""
    from plumbing.tiny import _bytes_to_unicode
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    vocab.update({f"\u0120w{i}": i for i in range(256, vocab_size)})      # U+0120 = the byte-level space
    level = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": level, "post_processor": None, "decoder": level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}, f)


def offline(llm, work) -> tuple[dict, list]:
    eng = llm.llm_engine
    eng.keep_stats, eng.stats = True, []
    params = [SamplingParams(temperature=0, ignore_eos=True, max_tokens=m) for _, m in work]
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in work], params, use_tqdm=False)
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    dt = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    stats, eng.stats = eng.stats, []
    return dict(seconds=dt, output_tokens=tokens, tok_per_s=tokens / dt, requests_per_s=len(work) / dt,
                steps=len(stats), step_ms=1e3 * dt / max(len(stats), 1)), stats


def offline_single(llm, a, n_in: int, n_out: int) -> dict:
    """One request at a time through ``llm.generate``: TTFT = a 1-token generate, TPOT = the extra time
    of an n_out-token one per extra token (p50 over prompts of another seed than the served ones)."""
    V, ttft, tpot = llm.model.cfg.vocab_size, [], []
    for p, _ in workload(a.single, n_in, n_in, V, a.seed + 3):
        times = []
        for n in (1, n_out):
            sync()
            t = time.perf_counter()
            llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=n, ignore_eos=True), use_tqdm=False)
            sync()
            times.append(time.perf_counter() - t)
            p = p[1:] + p[:1]                             # another prompt: no prefix-cache hit
        ttft.append(times[0])
        tpot.append((times[1] - times[0]) / (n_out - 1))
    return dict(ttft_ms_p50=1e3 * sorted(ttft)[len(ttft) // 2], tpot_ms_p50=1e3 * sorted(tpot)[len(tpot) // 2])


def engine_counters(url) -> dict:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{url}/metrics", timeout=30).text
    m = {s.name.removeprefix("tll:"): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    out = {k: m[f"engine_{k}_total"] for k in ("steps", "step_seconds", "send_seconds", "take_seconds", "busy_periods")}
    return out | {k: m[f"engine_{k}_seconds"] for k in ("busy_since", "last_step_end", "last_add")}


def client_run(url, name, requests, rate, seed, sequential=False, http="raw") -> dict:
    """One run of the load generator; adds what the engine core did meanwhile (from /metrics)."""
    before = engine_counters(url)
    r = _client_run(url, name, requests, rate, seed, sequential, http)
    after = engine_counters(url)
    d = {k: after[k] - before[k] for k in after}
    r["engine"] = dict(steps=d["steps"], busy=d["step_seconds"] / r["duration_s"],
                       step_ms=1e3 * d["step_seconds"] / max(d["steps"], 1),
                       send_ms=1e3 * d["send_seconds"] / max(d["steps"], 1))
    if d["busy_periods"] == 1 and "start" in r:       # one stretch of steps: the run's timeline holds
        r["engine"]["timeline_ms"] = timeline(r, after, d)
    return r


def timeline(r: dict, core: dict, d: dict) -> dict:
    """Where a run's duration went, in ms, from the client's times and the engine core's (one
    monotonic clock): client's first send -> the core's first step (``start``); the stretch of
    steps, split into step() (``steps``), handing outputs over (``send``), taking requests in
    (``take``) and the rest (``between``); the core's last step -> the client's end (``tail``).
    Also when the last prompt reached the core and when the client had every response's headers."""
    t0, ms = r["start"], lambda x: 1e3 * x
    window = core["last_step_end"] - core["busy_since"]
    return dict(start=ms(core["busy_since"] - t0), steps=ms(d["step_seconds"]), send=ms(d["send_seconds"]),
                take=ms(d["take_seconds"]), between=ms(window - d["step_seconds"] - d["send_seconds"] - d["take_seconds"]),
                tail=ms(r["end"] - core["last_step_end"]), last_add=ms(core["last_add"] - t0),
                last_accepted=ms(max((q["accepted"] for q in r["requests"] if "accepted" in q), default=t0) - t0))


def _client_run(url, name, requests, rate, seed, sequential=False, http="raw") -> dict:
    with tempfile.TemporaryDirectory() as d:
        spec, out = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec, "w") as f:
            json.dump(dict(requests=requests, rate=rate, seed=seed, model=name, sequential=sequential, http=http), f)
        subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "bench_serve_client.py"),
                        "--url", url, "--spec", spec, "--out", out], check=True, timeout=3600)
        with open(out) as f:
            return json.load(f)


def setup(a, device):
    from l9_fp8_kv import LLM
    from l10_server.serve import impl_options
    kw = impl_options(device)                     # as the server's --impl auto
    if a.quick:
        path, name = str(tiny_checkpoint("qwen3")), "tiny-qwen3"
        a.num_requests, a.single, lo, hi, single_len = 8, 3, 4, 24, 8
    else:
        path, name = build_checkpoint(os.path.join(scratch_dir("bench_serve"), "qwen3-0.6b-random")), "qwen3-0.6b-random"
        lo, hi, single_len = 100, 1024, 128
        with open(os.path.join(path, "config.json")) as f:
            write_tokenizer(path, json.load(f)["vocab_size"])
    t = time.perf_counter()
    llm = LLM(path, device=device, seed=a.seed, **kw)
    start_s = time.perf_counter() - t
    V = llm.model.cfg.vocab_size
    work = workload(a.num_requests, lo, hi, V, a.seed)
    single = [(p, single_len) for p, _ in workload(a.single, single_len, single_len, V, a.seed + 2)]
    warm = workload(16, lo, hi, V, a.seed + 1)                # disjoint from the measured prompts
    llm.generate([{"prompt_token_ids": p} for p, _ in warm], SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    print(f"start-up {start_s:.1f} s; workload {len(work)} requests, lengths [{lo}, {hi}]; single {len(single)} x "
          f"{single_len}/{single_len}")
    a.lengths, a.path, a.llm_kw = (lo, hi), path, dict(kw, device=device, seed=a.seed)
    return llm, name, work, single, start_s


def main(argv=None):
    a = parse(argv)
    t_start = time.perf_counter()
    device = bench_device(a.quick)
    stem = output_stem("bench_serve", a.out, a.quick, device)
    llm, name, work, single, start_s = setup(a, device)
    bw, tf = ceilings(device)
    off, stats = offline(llm, work)
    floor = roofline(stats, llm.model.cfg, bw, tf) if bw else None
    path, kw = a.path, a.llm_kw
    print(f"offline llm.generate: {off['output_tokens']} tokens in {off['seconds']:.2f} s = {off['tok_per_s']:.0f} tok/s")
    single_off = offline_single(llm, a, len(single[0][0]), single[0][1])
    print(f"offline single requests: TTFT p50 {single_off['ttft_ms_p50']:.1f} ms, TPOT p50 {single_off['tpot_ms_p50']:.2f} ms")
    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    cfg_model, engine_cfg, dtype = llm.model.cfg, str(llm.llm_engine.config), str(next(llm.model.parameters()).dtype)
    del llm                                           # the served engine core loads its own: free the GPU
    free()
    from l10_server.serve import make_server, running_in_thread
    server = make_server(path, kw, name, max_pending=100_000)       # the engine core: another process
    runs = []
    with running_in_thread(server) as url:
        runs_spec = [(rate, http) for rate in a.rate_list for http in a.http_list]
        for j, (rate, http) in enumerate(runs_spec):  # fresh prompts each run: no prefix-cache hits across runs
            r = client_run(url, name, workload(len(work), *a.lengths, cfg_model.vocab_size, a.seed + 10 + j),
                           rate, a.seed, http=http)
            runs.append(summarize(r, f"rate {rate}" + ("" if http == "raw" else f" ({http})")))
            print(runs[-1]["line"])
        r = client_run(url, name, single, "inf", a.seed, sequential=True, http=a.http_list[0])
        runs.append(summarize(r, f"single {len(single[0][0])}/{single[0][1]}"))
        print(runs[-1]["line"])
    meta = dict(device=torch.cuda.get_device_name() if device == "cuda" else "CPU", torch=torch.__version__,
                model=name, dtype=dtype.replace("torch.", ""),
                workload=f"{len(work)} requests, prompt and output lengths uniform in [{a.lengths[0]}, {a.lengths[1]}], "
                         f"random ids, ignore_eos, greedy; single: {len(single)} requests of {len(single[0][0])} in / "
                         f"{single[0][1]} out, one at a time",
                start_s=start_s, switch_interval_s=sys.getswitchinterval(), copy_GBps=bw, matmul_TFLOPs=tf, engine=engine_cfg,
                server="engine core in its own process (l10_server/engine_core.py)",
                http_clients=a.http_list)
    result = dict(meta=meta, offline=dict(off, roofline=floor, single=single_off), runs=runs)
    md = markdown(result)
    print("\n" + md)
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(md + "\n")
    plot(stem + ".png", result)
    print(wrote(stem + ".json", stem + ".md", stem + ".png") + f"; total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    run_main(main)
