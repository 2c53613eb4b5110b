"""bench_e2e.py's report: the roofline summed over a run's steps, the markdown table, the plot."""
from __future__ import annotations

from plumbing.plot import pyplot


def step_floor(s, cfg, bw_gbps, peak_tflops):
    """One step's floor: (memory-only seconds, memory-or-compute seconds, bytes, FLOPs)."""
    elt = 2
    per_layer = (cfg.hidden_size * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim      # q, k, v
                 + cfg.num_heads * cfg.head_dim * cfg.hidden_size                              # o
                 + 3 * cfg.hidden_size * cfg.intermediate_size)                                # gate, up, down
    body = cfg.num_layers * per_layer
    head = cfg.vocab_size * cfg.hidden_size
    kv_tok = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elt
    T = s.prefill_tokens + s.decode_tokens
    nbytes = (body + (head if s.sampled else 0) + T * cfg.hidden_size) * elt + (s.kv_tokens + T) * kv_tok
    pre_kv = sum(start * n + n * (n + 1) // 2 for _, start, n, _ in s.chunks)              # visible (q, k) pairs
    dec_kv = s.kv_tokens - sum(start + n for _, start, n, _ in s.chunks)
    flops = 2 * T * body + 2 * s.sampled * head + 4 * cfg.num_heads * cfg.head_dim * (pre_kv + dec_kv) * cfg.num_layers
    t_mem = nbytes / (bw_gbps * 1e9)
    return t_mem, max(t_mem, flops / (peak_tflops * 1e12)), nbytes, flops


def overlapped(engine) -> bool:
    """Does the engine run stage 7's async order (``phases``: its step records lag one step)?"""
    from l7_fast.step import OverlappedStep
    return isinstance(engine.step_order, OverlappedStep)


def roofline(stats, cfg, bw_gbps, peak_tflops, overlapped=None):
    """Sum over steps of the bytes (and FLOPs) the step cannot avoid, as a time floor; with
    ``overlapped`` (the engine's step order) also the time and floor of each kind of step."""
    f = [step_floor(s, cfg, bw_gbps, peak_tflops) for s in stats]
    out = dict(floor_memory_s=sum(x[0] for x in f), floor_memory_compute_s=sum(x[1] for x in f),
               bytes=sum(x[2] for x in f), flops=sum(x[3] for x in f))
    if overlapped is not None:
        out["phases"] = phases(stats, cfg, bw_gbps, peak_tflops, overlapped)
    return out


PHASES = (("steps with a prefill chunk", lambda s: s.prefill_tokens > 0),
          ("decode, >= 128 running", lambda s: s.decode_tokens >= 128),
          ("decode, 32-127 running", lambda s: 32 <= s.decode_tokens < 128),
          ("decode, 8-31 running", lambda s: 8 <= s.decode_tokens < 32),
          ("decode, 1-7 running", lambda s: 0 < s.decode_tokens < 8))


def phases(stats, cfg, bw_gbps, peak_tflops, overlapped: bool) -> list[dict]:
    """Where the run's time went, by kind of step: the host's clock between consecutive step
    records (in the async order a record is made after the wait for the step before it, so the
    interval ending at record k+1 is step k's). Each kind's seconds against its floor."""
    out = {name: dict(phase=name, steps=0, seconds=0.0, floor_s=0.0) for name, _ in PHASES}
    for k in range(1, len(stats)):
        s = stats[k - 1] if overlapped else stats[k]
        name = next(n for n, test in PHASES if test(s)) if s.prefill_tokens + s.decode_tokens else None
        if name is not None:
            row = out[name]
            row["steps"] += 1
            row["seconds"] += stats[k].t - stats[k - 1].t
            row["floor_s"] += step_floor(s, cfg, bw_gbps, peak_tflops)[1]
    return [dict(r, pct_of_floor=100 * r["floor_s"] / r["seconds"] if r["seconds"] else None) for r in out.values()]


def phase_lines(rows) -> list[str]:
    out = ["| steps | count | seconds (host clock) | floor (s, mem + compute) | % of floor |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        pct = f"{r['pct_of_floor']:.0f}%" if r["pct_of_floor"] is not None else "-"
        out.append(f"| {r['phase']} | {r['steps']} | {r['seconds']:.2f} | {r['floor_s']:.2f} | {pct} |")
    return out


def start_lines(st, rows, gpu=True) -> list[str]:
    """Start-up and the Triton cache: what a first process on a fresh machine pays, and where."""
    if not st:
        return []
    c = st["triton_cache"]
    state = "unused (the CPU's interpreter compiles nothing)" if not gpu else "empty (a cold start)" \
        if c["entries_before_start"] == 0 else f"holding {c['entries_before_start']} entries (warm)"
    w = st.get("warmup")
    compiled = ", ".join(f"{r['variant']}: {r['new_cache_entries']}" for r in rows if "new_cache_entries" in r)
    return [f"Start-up: `LLM(...)` took {st['seconds']:.1f} s with the Triton cache ({c['dir']}) {state}"
            + (f"; it ran {w['shapes']} step shapes in {w['seconds']:.1f} s and wrote {w['new_cache_entries']} "
               "cache entries" if w else "")
            + ("; the script's warm-up was skipped (--no-warmup): the timed run is the first generate"
               if st.get("bench_warmup_s") is None else
               f"; the script's warm-up (16 other prompts) took {st['bench_warmup_s']:.1f} s")
            + f". Cache entries written after start-up, up to the end of each timed run: {compiled or 'n/a'}.", ""]


def markdown(meta, rows):
    w = meta.get("wall")
    wall_lines = [] if not w else [
        f"Wall: stage 4's loop, one request ({w['prompt_len']}-token prompt, {w['new_tokens']} new tokens): "
        f"{w['stage4_ms_per_token']:.1f} ms per token ({w['stage4_tok_per_s']:.0f} tok/s)"
        + ("" if w["stage4_gpu_busy"] is None else f", GPU busy {100 * w['stage4_gpu_busy']:.0f}% of the time")
        + f"; stage 5 with {w['batch']} such requests at once: {w['stage5_tok_per_s']:.0f} tok/s.", ""]
    lines = wall_lines + [f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}, transformers "
             f"{meta['transformers']}; model {meta['model']} ({meta['dtype']}); {meta['workload']}. "
             + (f"Measured here: copy bandwidth {meta['copy_GBps']:.0f} GB/s, bf16 matmul {meta['matmul_TFLOPs']:.0f} TFLOP/s."
                if meta["copy_GBps"] else "CPU: no roofline (interpreter timings are not performance)."), "",
             *start_lines(meta.get("start"), rows, gpu=bool(meta["copy_GBps"])),
             "| variant | engine | output tokens | seconds | output tok/s | steps | preemptions | memory floor (s) | "
             "% of memory roofline | mem+compute floor (s) | % of roofline |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rf = r.get("roofline")
        sec = (lambda k: f"{rf[k]:.2f}") if rf else (lambda k: "—")
        pct = (lambda k: f"{100 * rf[k] / r['seconds']:.0f}%") if rf else (lambda k: "—")
        lines.append(f"| {r['variant']} | {r['engine']} | {r['output_tokens']} | {r['seconds']:.1f} | {r['tok_per_s']:.0f} | "
                     f"{r.get('steps', '—')} | {r.get('preemptions', '—')} | {sec('floor_memory_s')} | "
                     f"{pct('floor_memory_s')} | {sec('floor_memory_compute_s')} | {pct('floor_memory_compute_s')} |")
    for r in rows:
        if (r.get("roofline") or {}).get("phases"):
            lines += ["", f"Where the time went, {r['engine']}, {r['variant']} (the host's clock between step records):",
                      *phase_lines(r["roofline"]["phases"])]
    return "\n".join(lines)


def plot(path, meta, rows, stats):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    steps = range(len(stats))
    a.plot(steps, [s.decode_tokens for s in stats], label="decode tokens (= running decodes)", lw=1)
    a.plot(steps, [s.prefill_tokens for s in stats], label="prefill tokens", lw=1)
    a.plot(steps, [s.running for s in stats], label="running requests", lw=1, ls="--")
    a.set_yscale("symlog")
    a.set_xlabel("step")
    a.set_ylabel("per step (symlog)")
    a.set_title("our schedule, variable-length workload")
    a.legend()
    short = {"ours": "ours", "HF continuous batching": "HF CB", "HF generate_batch": "HF\ngenerate_batch"}
    labels = [f"{short.get(r['engine'], r['engine'])}\n{r['variant']}" for r in rows]
    b.bar(range(len(rows)), [r["tok_per_s"] for r in rows], color=["C0" if r["engine"].startswith("ours") else "C1" for r in rows])
    b.set_xticks(range(len(rows)), labels, fontsize=8)
    b.set_ylabel("output tokens / s")
    b.set_title("throughput")
    fig.suptitle(f"{meta['model']}, {meta['workload']}, {meta['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
