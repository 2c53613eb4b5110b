"""bench_serve.py's report: per-run latency statistics, the markdown table, the plot."""
from __future__ import annotations

import math

from plumbing.plot import pyplot


def pct(xs, q):
    """The q-th percentile (nearest rank) of xs, or None when empty."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def stats_ms(xs) -> dict:
    xs = [x * 1e3 for x in xs if x is not None]
    return dict(mean=sum(xs) / len(xs) if xs else None, p50=pct(xs, 50), p99=pct(xs, 99))


def summarize(r: dict, label: str) -> dict:
    reqs = r["requests"]
    ok = [q for q in reqs if q.get("ok")]
    tokens = sum(q["tokens"] for q in ok)
    dur = r["duration_s"]
    out = dict(label=label, rate=r["rate"], requests=len(reqs), completed=len(ok), duration_s=dur,
               output_tok_per_s=tokens / dur, requests_per_s=len(ok) / dur,
               ttft_ms=stats_ms([q["ttft"] for q in ok]), tpot_ms=stats_ms([q["tpot"] for q in ok]),
               itl_ms=stats_ms([x for q in ok for x in q["itl"]]), e2e_ms=stats_ms([q["e2e"] for q in ok]),
               errors=[q.get("error") for q in reqs if not q.get("ok")][:3], engine=r.get("engine"))
    f = lambda d: f"{d['p50']:.1f}" if d["p50"] is not None else "-"
    out["line"] = (f"{label:>14}: {len(ok)}/{len(reqs)} ok in {dur:.2f} s, {out['output_tok_per_s']:.0f} tok/s; "
                   f"p50 TTFT {f(out['ttft_ms'])} ms, TPOT {f(out['tpot_ms'])} ms, ITL {f(out['itl_ms'])} ms")
    e = out["engine"]
    if e:
        out["line"] += (f"; engine core: {e['steps']:.0f} steps, busy {100 * e['busy']:.0f}%, "
                        f"{e['step_ms']:.2f} ms a step + {e['send_ms']:.2f} ms handing over")
        t = e.get("timeline_ms")
        if t:
            out["line"] += (f"\n                timeline (ms): first send -> first step {t['start']:.0f}, then steps {t['steps']:.0f}"
                            f" + handing over {t['send']:.0f} + taking requests in {t['take']:.0f} + between {t['between']:.0f}"
                            f", last step -> client done {t['tail']:.0f}; last prompt in the core at {t['last_add']:.0f},"
                            f" every response's headers at {t['last_accepted']:.0f}")
    return out


def markdown(res: dict) -> str:
    m, off = res["meta"], res["offline"]
    rows = [f"Device: {m['device']}; torch {m['torch']}; model {m['model']} ({m['dtype']}); start-up {m['start_s']:.1f} s; "
            f"GIL switch interval {1e3 * m.get('switch_interval_s', 0.005):g} ms; load generator's HTTP client: "
            f"{', '.join(m.get('http_clients', ['httpx']))}",
            f"Workload: {m['workload']}. Engine: {m['engine']}.", ""]
    floor = off.get("roofline")
    if floor:
        rows.append(f"Offline `llm.generate` (same workload, just before): {off['tok_per_s']:.0f} output "
                    f"tok/s in {off['seconds']:.2f} s, {off.get('steps', 0)} steps of {off.get('step_ms', 0):.2f} ms; "
                    f"its roofline floor {floor['floor_memory_s']:.2f} s "
                    f"({100 * floor['floor_memory_s'] / off['seconds']:.0f}% of the floor reached).")
    else:
        rows.append(f"Offline `llm.generate`: {off['tok_per_s']:.0f} output tok/s in {off['seconds']:.2f} s (no roofline on a CPU).")
    one = off.get("single")
    if one:
        rows.append(f"Offline single requests (`llm.generate`, one at a time): TTFT p50 {one['ttft_ms_p50']:.1f} ms, "
                    f"TPOT p50 {one['tpot_ms_p50']:.2f} ms.")
    rows += ["", "| run | ok | duration (s) | out tok/s | vs offline | req/s | TTFT p50 / p99 (ms) | "
                 "TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | e2e p50 (ms) | engine busy | ms/step (+ hand-over) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    g = lambda d, k: f"{d[k]:.1f}" if d[k] is not None else "-"
    for r in res["runs"]:
        rows.append(f"| {r['label']} | {r['completed']}/{r['requests']} | {r['duration_s']:.2f} | {r['output_tok_per_s']:.0f} | "
                    f"{100 * r['output_tok_per_s'] / off['tok_per_s']:.0f}% | {r['requests_per_s']:.2f} | "
                    f"{g(r['ttft_ms'], 'p50')} / {g(r['ttft_ms'], 'p99')} | {g(r['tpot_ms'], 'p50')} / {g(r['tpot_ms'], 'p99')} | "
                    f"{g(r['itl_ms'], 'p50')} / {g(r['itl_ms'], 'p99')} | {g(r['e2e_ms'], 'p50')} | "
                    + (f"{100 * e['busy']:.0f}% | {e['step_ms']:.2f} (+{e['send_ms']:.2f}) |" if (e := r.get("engine"))
                       else "- | - |"))
    return "\n".join(rows)


def plot(path: str, res: dict) -> None:
    plt = pyplot()
    if plt is None:
        return
    every = [r for r in res["runs"] if r["label"].startswith("rate")]
    runs = [r for r in every if "(" not in r["label"]] or every  # the latency curve: the first client's runs
    xs = [r["requests_per_s"] for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        ax1.plot(xs, [r[key]["p50"] for r in runs], "o-", label=f"{name} p50")
    ax1.set_xlabel("achieved request rate (req/s)")
    ax1.set_ylabel("ms")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title("latency against request rate")
    ax2.bar([r["label"] for r in every] + ["offline"], [r["output_tok_per_s"] for r in every] + [res["offline"]["tok_per_s"]])
    ax2.set_ylabel("output tok/s")
    ax2.set_title("throughput: server runs and offline generate")
    fig.suptitle(f"{res['meta']['model']} on {res['meta']['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
