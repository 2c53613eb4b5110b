"""bench_spec.py's tables, goal lines, JSON, markdown and plot."""
from __future__ import annotations

import json

from benchmarks.bench_common import NOT_JUDGED
from plumbing.plot import wrote


def tables(res: dict) -> list[str]:
    bw = f"{res['copy_gbps']:.0f} GB/s" if res["copy_gbps"] else "not measured (CPU)"
    lines = [f"device {res['device']}, {res['dtype']}, torch {res['torch']}; prompt {res['prompt_len']} tokens, "
             f"{res['new_tokens']} new, greedy; copy bandwidth {bw}", "",
             "| k | alpha | baseline ms/token | spec ms/token | speed-up | formula | off by | tokens/step (E) "
             "| tokens = alpha-0 run | = baseline |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in res["alpha"]:
        lines.append(f"| {r['k']} | {r['alpha']:.1f} | {r['base_ms']:.3f} | {r['spec_ms']:.3f} | {r['speedup']:.2f}x | "
                     f"{r['formula']:.2f}x | {100 * r['within']:.0f}% | {r['tokens_per_step']:.2f} "
                     f"({r['expected_tokens']:.2f}) | {'yes' if r['same_tokens'] else 'NO'} | "
                     f"{'yes' if r['same_as_baseline'] else 'no'} |")
    if res["batch"]:
        lines += ["", "| batch | baseline ms/token | speed-up, speculation forced (k 4, alpha 0.8) | with the pay-off rule |",
                  "|---:|---:|---:|---:|"]
        lines += [f"| {r['batch']} | {r['base_ms_per_step']:.3f} | {r['forced_speedup']:.2f}x | {r['rule_speedup']:.2f}x |"
                  for r in res["batch"]]
    g = res["ngram"]
    lines += ["", f"n-gram (k 4, lookup 1-4) on a copy-heavy prompt: {g['speedup']:.2f}x, acceptance "
                  f"{g['acceptance'] if g['acceptance'] is None else round(g['acceptance'], 3)} over {g['guesses']} guesses "
                  f"({g['fillers']} fillers), tokens {'=' if g['same_tokens'] else '!='} baseline"]
    if res.get("floor_ms_per_token_b1"):
        best = min(r["spec_ms"] for r in res["alpha"])
        base = res["alpha"][0]["base_ms"]
        f = res["floor_ms_per_token_b1"]
        lines.append(f"roofline (batch 1: weights + K/V once per step / copy bandwidth) {f:.3f} ms/step: baseline at "
                     f"{100 * f / base:.0f}%, speculation's best {best:.3f} ms/token = {100 * f / best:.0f}% of one step's floor")
    return lines


def goals(res: dict) -> list[str]:
    if res.get("quick"):
        return [NOT_JUDGED]
    top = [r for r in res["alpha"] if r["k"] == 4 and r["alpha"] == 1.0]
    out = []
    if top:
        out.append(f"goal batch 1, k 4, alpha 1 >= 2.5x: {top[0]['speedup']:.2f}x "
                   f"{'MET' if top[0]['speedup'] >= 2.5 else 'NOT MET'}")
    worst = max(r["within"] for r in res["alpha"])
    out.append(f"goal within 10% of the formula: worst {100 * worst:.0f}% {'MET' if worst <= 0.10 else 'NOT MET'}")
    if res["batch"]:
        b = res["batch"][-1]
        out.append(f"goal batch {b['batch']} >= 0.95x (pay-off rule): {b['rule_speedup']:.2f}x "
                   f"{'MET' if b['rule_speedup'] >= 0.95 else 'NOT MET'}")
    return out


def plot(res: dict, path: str, plt) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k in sorted({r["k"] for r in res["alpha"]}):
        rows = [r for r in res["alpha"] if r["k"] == k]
        line, = a.plot([r["alpha"] for r in rows], [r["speedup"] for r in rows], "o-", label=f"k={k} measured")
        a.plot([r["alpha"] for r in rows], [r["formula"] for r in rows], "x--", color=line.get_color(), label=f"k={k} formula")
    a.axhline(1, color="gray", lw=0.5)
    a.set(xlabel="acceptance rate alpha", ylabel="speed-up over no speculation (batch 1)", title=res["device"])
    a.legend(fontsize=8)
    if res["batch"]:
        bs = [r["batch"] for r in res["batch"]]
        b.plot(bs, [r["forced_speedup"] for r in res["batch"]], "o-", label="forced on (k 4, alpha 0.8)")
        b.plot(bs, [r["rule_speedup"] for r in res["batch"]], "s-", label="with the pay-off rule")
        b.axhline(1, color="gray", lw=0.5)
        b.set(xscale="log", xlabel="batch", ylabel="speed-up", title="when speculation pays")
        b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(res: dict, stem: str, plt) -> int:
    lines = tables(res) + [""] + goals(res) + [f"total {res['seconds']:.0f} s (engine start-ups included)"]
    print("\n".join(lines))
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    if plt is not None:
        plot(res, stem + ".png", plt)
    print(wrote(stem + ".json", stem + ".md", stem + ".png"))
    return 0
