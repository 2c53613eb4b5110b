"""bench_tp.py's floors, table, goal verdicts and files (JSON, markdown, PNG)."""
from __future__ import annotations

import glob
import os

from benchmarks.outputs import save_results
from plumbing.plot import wrote

GOALS = dict(stream=1.6, e2e=1.8)           # issue 40: tp 2 against tp 1 (as shipped: CUDA graphs)


def floors(meta: dict, rows: dict, ar, path: str) -> None:
    """Each row's single-stream floor: the weights read once over its ranks at the measured copy
    bandwidth, plus its all-reduces for one token (tp > 1) at NCCL's time measured here, eager or
    replayed from a CUDA graph as the row runs; and the fraction of it reached."""
    from l1_dense.config import ModelConfig
    cfg = ModelConfig.from_dir(path)
    weights = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*.safetensors")))
    meta.update(weight_bytes=weights, all_reduces_per_step=2 * cfg.num_layers + 1)
    for r in rows.values():
        if not meta["copy_GBps"] or "ms_per_token" not in r:
            continue
        key = "eager_us" if r.get("eager", True) else "graph_us" if r.get("nccl_only") else "ours_graph_us"
        one = ar[0].get(key) if ar else None
        comm = meta["all_reduces_per_step"] * one * 1e-3 if r["tp"] > 1 and one else 0.0
        r["floor_ms"] = weights / (r["tp"] * meta["copy_GBps"] * 1e9) * 1e3 + comm
        r["floor_comm_ms"] = comm
        r["of_floor"] = r["floor_ms"] / r["ms_per_token"]


def verdicts(meta: dict, rows: dict) -> list[str]:
    base = rows.get("tp 1 (graphs)")
    tp = next((r for r in rows.values() if r["tp"] > 1 and not r.get("eager", True)), None)   # graphs, as shipped
    if meta["quick"] or not base or not tp or "ms_per_token" not in tp:
        return []
    s, e = base["ms_per_token"] / tp["ms_per_token"], tp["e2e_tok_s"] / base["e2e_tok_s"]
    meta.update(stream_speedup=s, e2e_speedup=e)
    say = lambda ok: "met" if ok else "NOT met"                                     # noqa: E731
    return [f"goal: single stream tp {meta['tp']} >= {GOALS['stream']}x tp 1: {s:.2f}x, {say(s >= GOALS['stream'])}",
            f"goal: e2e tp {meta['tp']} >= {GOALS['e2e']}x tp 1: {e:.2f}x, {say(e >= GOALS['e2e'])}"]


def table(meta: dict, rows: dict, tokens, ar) -> str:
    lines = [f"bench_tp: {meta['device']} x {meta['gpus']}, {meta['preset']} ({meta['dtype']}, random weights, "
             f"{meta['weight_bytes'] / 1e9:.1f} GB), NCCL {meta['nccl']}, torch {meta['torch']}, copy bandwidth "
             f"{(meta['copy_GBps'] or 0):.0f} GB/s",
             "", "| row | start-up s | KV blocks | single stream ms/token | floor ms | of floor | e2e tok/s | "
             "CPU to send a forward / announce a replay, us |", "|---|---|---|---|---|---|---|---|"]
    for k, r in rows.items():
        f = lambda key, fmt: format(r[key], fmt) if r.get(key) is not None else "-"   # noqa: E731
        lines.append(f"| {k} | {f('start_s', '.1f')} | {r.get('num_blocks', '-')} | {f('ms_per_token', '.2f')} | "
                     f"{f('floor_ms', '.2f')} | {f('of_floor', '.0%')} | {f('e2e_tok_s', ',.0f')} | "
                     f"{f('send_cpu_us', '.0f')} / {f('replay_cpu_us', '.0f')} |")
    lines.append(f"e2e: {meta['requests']} requests, prompts and outputs uniform in {meta['lengths']}; single stream: "
                 f"{meta['stream_tokens']} tokens after a 64-token prompt")
    lines += verdicts(meta, rows)
    if tokens:
        same = sum(t["first_diff_step"] is None for t in tokens)
        lines += ["", f"greedy {meta['dtype']}, tp {meta['tp']} against tp 1 (both eager): {same} of {len(tokens)} prompts equal "
                      f"for all {tokens[0]['steps']} steps",
                  "| prompt | first differing step | max logit diff there | before it | tp 1's top-2 margin there |",
                  "|---|---|---|---|---|"]
        lines += [f"| {i} | {t['first_diff_step'] if t['first_diff_step'] is not None else 'none'} | "
                  f"{t['max_logit_diff']:.3f} | {t['max_logit_diff_before']:.3f} | {t['tp1_margin']:.3f} |"
                  for i, t in enumerate(tokens)]
    if ar:
        lines += ["", f"all-reduce, bf16, {meta['tp']} GPUs, one process each (µs per all-reduce; ours: allreduce.py)",
                  "| bytes | decode batch | NCCL eager | NCCL in a CUDA graph | ours eager | ours in a CUDA graph |",
                  "|---|---|---|---|---|---|"]
        hidden = ar[0]["bytes"] // 2
        us = lambda r, k: format(r[k], ".1f") if k in r else "-"                    # noqa: E731
        lines += [f"| {r['bytes']:,} | {r['bytes'] // (2 * hidden)} | {us(r, 'eager_us')} | "
                  f"{us(r, 'graph_us') if 'graph_us' in r else r.get('graph_error', '-')} | {us(r, 'ours_eager_us')} | "
                  f"{us(r, 'ours_graph_us')} |" for r in ar]
    return "\n".join(lines)


def plot(res: dict, path: str, plt) -> None:
    rows, ar = res["rows"], res["allreduce"]
    fig, axes = plt.subplots(1, 3 if ar else 2, figsize=(15 if ar else 10, 4))
    names = list(rows)
    axes[0].bar(names, [rows[k].get("ms_per_token", 0) for k in names], color="C0", label="measured")
    axes[0].plot(names, [rows[k].get("floor_ms", 0) for k in names], "k_", ms=30, mew=2, label="floor")
    axes[0].set(ylabel="ms / token", title=f"single stream, {res['meta']['preset']}")
    axes[0].legend(fontsize=8)
    axes[1].bar(names, [rows[k].get("e2e_tok_s", 0) for k in names], color="C1")
    axes[1].set(ylabel="output tok/s", title=f"e2e, {res['meta']['requests']} requests")
    if ar:
        b = [r["bytes"] for r in ar]
        axes[2].plot(b, [r["eager_us"] for r in ar], "o-", label="NCCL eager")
        for k, label in (("graph_us", "NCCL in a CUDA graph"), ("ours_graph_us", "ours in a CUDA graph")):
            axes[2].plot([r["bytes"] for r in ar if k in r], [r[k] for r in ar if k in r], "s-", label=label)
        axes[2].set(xscale="log", xlabel="bytes", ylabel="µs", title="all-reduce")
        axes[2].legend(fontsize=8)
    fig.suptitle(f"{res['meta']['device']} x {res['meta']['gpus']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def save(stem: str, res: dict) -> None:
    text = table(res["meta"], res["rows"], res["tokens"], res["allreduce"])
    print(wrote(*save_results(stem, res, text, lambda plt, p: plot(res, p, plt))))
