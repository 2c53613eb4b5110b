"""The stage 7 ledger's report: the markdown table and the plot (benchmarks/bench_l7.py writes both)."""
from __future__ import annotations


HOST_PARTS = ("schedule_ms", "execute_ms", "advance_ms", "sample_ms")


def host_parts(h: dict) -> str:
    return ", ".join(f"{k[:-3]} {h[k]:.3f}" for k in HOST_PARTS if k in h)


def markdown(meta, rows) -> str:
    b = meta["batch"]
    head = (f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; model {meta['model']} "
            f"({meta['dtype']}). Single stream: {meta['prompt_len']}-token prompt, {meta['new']} new tokens; batch {b}: "
            f"{meta['batch_new']} new tokens each. "
            + (f"Copy bandwidth measured here {meta['copy_GBps']:.0f} GB/s; decode floor {meta['floor_single_ms']:.3f} ms "
               f"(batch 1), {meta['floor_batch_ms']:.3f} ms (batch {b})." if meta["copy_GBps"] else "CPU: no roofline.")
            + (f" Peer: transformers `generate`, single stream, {meta['hf_single_ms']:.2f} ms/token." if meta["hf_single_ms"] else ""))
    lines = [head, "", f"| row | ms/token (1 stream) | % roofline | ms/step (batch {b}) | tok/s (batch {b}) | % roofline | "
             f"kernels/step b1 | launch calls b1 | GPU busy b1 | kernels/step b{b} | launch calls b{b} | GPU busy b{b} | "
             f"steady ms/step b1 | steady ms/step b{b} | host ms/step b{b} | graph MiB | tokens = stage 6 |",
             "|---|" + "---:|" * 15 + "---|"]
    for r in rows:
        p1, pb = r.get("profile_1"), r.get("profile_b")
        f = (lambda p, k, fmt: format(p[k], fmt) if p else "—")
        pct = (lambda k: f"{r[k]:.0f}%" if k in r else "—")
        host = pb["host"]["host_ms"] if pb and pb.get("host") else "—"
        graph = f"{pb['graph_bytes'] / 2**20:.0f}" if pb and pb.get("graph_bytes") else "—"
        lines.append(f"| {r['row']} | {r['single_ms']:.2f} | {pct('single_roofline_pct')} | {r['batch_ms']:.2f} | "
                     f"{r['batch_tok_s']:.0f} | {pct('batch_roofline_pct')} | {f(p1, 'kernels', '.0f')} | "
                     f"{f(p1, 'launch_calls', '.0f')} | {f(p1, 'busy_pct', '.0f')}% | {f(pb, 'kernels', '.0f')} | "
                     f"{f(pb, 'launch_calls', '.0f')} | {f(pb, 'busy_pct', '.0f')}% | {f(p1, 'ms_per_step', '.2f')} | "
                     f"{f(pb, 'ms_per_step', '.2f')} | {host} | {graph} | {r['same_tokens_as_row0']} |")
    if meta.get("host256"):
        n = meta["host_batch"]
        lines += ["", f"At {n} running requests (prompts of {meta['prompt_len']}..{meta['prompt_len'] + 15} tokens), "
                  "steady decode steps:", "",
                  "| row | ms/step | host ms/step (median) | schedule | execute | advance | sample | GPU busy |",
                  "|---|" + "---:|" * 7]
        for label, h in meta["host256"].items():
            p = h["host"]
            lines.append(f"| {label} | {h['ms_per_step']:.2f} | {p['host_ms']:.3f} | "
                         + " | ".join(f"{p.get(k, 0):.3f}" for k in HOST_PARTS)
                         + (f" | {h['busy_pct']:.0f}% |" if "busy_pct" in h else " | — |"))
    return "\n".join(lines)


def plot(plt, path, meta, rows):
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(rows))
    labels = [r["row"].replace("+ ", "+\n") for r in rows]
    a.bar(x, [r["single_ms"] for r in rows], color="C0")
    if meta.get("hf_single_ms"):
        a.axhline(meta["hf_single_ms"], color="C1", ls="--", label="HF generate")
    if meta.get("floor_single_ms"):
        a.axhline(meta["floor_single_ms"], color="k", ls=":", label="roofline floor")
    a.set_yscale("log")
    a.set_xticks(x, labels, fontsize=8)
    a.set_ylabel("ms per token (log)")
    a.set_title(f"single stream, {meta['prompt_len']}-token prompt")
    a.legend(fontsize=8)
    b.bar(x, [r["batch_tok_s"] for r in rows], color="C2")
    b.set_xticks(x, labels, fontsize=8)
    b.set_ylabel("output tokens / s")
    b.set_title(f"batch {meta['batch']} decode")
    fig.suptitle(f"{meta['model']}, {meta['dtype']}, {meta['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
