"""bench_dp.py's report: the markdown table, the goal's verdict, the plot."""
from __future__ import annotations


def _p50(d) -> str:
    return f"{d['p50']:.1f}" if d and d.get("p50") is not None else "-"


def ratio(rows, workload: str, dp: int, routing: str = "least_loaded") -> float | None:
    """Output tok/s of dp replicas over one engine's, on one workload (None if either row is missing)."""
    one = next((r for r in rows if r["workload"] == workload and r["dp"] == 1), None)
    routing = "-" if dp == 1 else routing
    many = next((r for r in rows if r["workload"] == workload and r["dp"] == dp and r["routing"] == routing), None)
    return many["output_tok_per_s"] / one["output_tok_per_s"] if one and many else None


def markdown(meta: dict, rows: list, goal: float, not_judged: str | None) -> str:
    where = f"{meta['gpus']} x {meta['device']}" if meta["gpus"] else "CPU (each replica a process)"
    out = [f"Device: {where}; torch {meta['torch']}; model {meta['model']}; "
           f"{', '.join(f'{k}={v}' for k, v in meta['env'].items())}",
           f"Workloads: random: {meta['workload_random']}. prefix: {meta['workload_prefix']}.", "",
           "| workload | replicas | routing | output tok/s | x dp 1 | p50 TTFT ms | p50 TPOT ms | requests per replica "
           "| tokens per replica | prefix-cache hit rate per replica | start-up s |",
           "|---|---:|---|---:|---:|---:|---:|---|---|---|---:|"]
    for r in rows:
        x = ratio(rows, r["workload"], r["dp"], r["routing"]) if r["dp"] > 1 else 1.0
        eng = r["engines"].values()
        tokens = " / ".join(f"{d.get('generation_tokens', 0):.0f}" for d in eng)
        hits = " / ".join(f"{100 * d['hit_rate']:.0f}%" for d in eng)
        out.append(f"| {r['workload']} | {r['dp']} | {r['routing']} | {r['output_tok_per_s']:,.0f} | "
                   f"{'-' if x is None else f'{x:.2f}x'} | {_p50(r['ttft_ms'])} | {_p50(r['tpot_ms'])} | "
                   f"{' / '.join(map(str, r['routed']))} | {tokens} | {hits} | {r['start_s']:.1f} |")
    out += ["", *where_it_goes(rows), ""]
    if not_judged:
        out.append(not_judged)
        return "\n".join(out)
    x = ratio(rows, "random", meta["dp"])
    if x is not None:
        out.append(f"goal: dp {meta['dp']} >= {goal}x dp 1 on the random workload: {x:.2f}x, "
                   f"{'met' if x >= goal else 'NOT met'}")
    ll, px = ratio(rows, "prefix", meta["dp"]), ratio(rows, "prefix", meta["dp"], "prefix")
    if ll is not None and px is not None:
        out.append(f"prefix-aware routing on the shared-prefix workload: {px:.2f}x dp 1, against {ll:.2f}x for "
                   f"least-loaded ({'helps' if px > ll * 1.02 else 'hurts' if px < ll * 0.98 else 'no difference'}"
                   " beyond 2%)")
    return "\n".join(out)


def _slash(values, fmt) -> str:
    return " / ".join("-" if v is None else fmt(v) for v in values)


def where_it_goes(rows: list) -> list[str]:
    """Each row's replicas on the run's clock (bench_dp.replica): whether the engines or what
    is around them (the server, the client) set the duration, and how evenly the replicas were loaded."""
    out = ["Each replica's stretch of steps in the timed run (engine-core counters from /metrics, one clock):",
           "", "| workload | replicas | routing | client s | replica spans s | replica done before client s | "
           "engine tok/s per replica | handing over, % of span |", "|---|---:|---|---:|---|---|---|---|"]
    for r in rows:
        eng = list(r["engines"].values())
        out.append(f"| {r['workload']} | {r['dp']} | {r['routing']} | {r['duration_s']:.2f} | "
                   f"{_slash([e.get('span_s') for e in eng], lambda v: f'{v:.2f}')} | "
                   f"{_slash([e.get('done_before_end_s') for e in eng], lambda v: f'{v:.2f}')} | "
                   f"{_slash([e.get('tok_per_s') for e in eng], lambda v: f'{v:,.0f}')} | "
                   f"{_slash([e.get('send_share') for e in eng], lambda v: f'{100 * v:.1f}')} |")
    out.append("")
    for r in rows:
        one = next((x for x in rows if x["workload"] == r["workload"] and x["dp"] == 1), None)
        spans = [e.get("span_s") for e in r["engines"].values()]
        if r["dp"] == 1 or one is None or None in spans or None in [e.get("span_s") for e in one["engines"].values()]:
            continue
        base = max(e["span_s"] for e in one["engines"].values())
        out.append(f"- {r['workload']}, dp {r['dp']} {r['routing']}: the engines alone give "
                   f"{base / max(spans):.2f}x dp 1 (dp 1's span over the slowest replica's); the client saw "
                   f"{r['output_tok_per_s'] / one['output_tok_per_s']:.2f}x. The replicas' spans differ by "
                   f"{100 * (max(spans) / min(spans) - 1):.1f}%." + _steady(r, one))
    return out


def _steady(r: dict, one: dict) -> str:
    """The steady state's ratio (bench_dp.full_stretch: every replica's batch full) and the tail's share."""
    a, b = one.get("full"), r.get("full")
    if not a or not b or not a["tok_per_s"] or not b["tok_per_s"]:
        return (" No two samples found every replica's batch full (a run too short, or too few requests to "
                "fill them): no steady-state ratio.")
    return (f" While every batch was full ({b['peak']} running; {b['seconds']:.1f} s of {r['duration_s']:.1f}, "
            f"against dp 1's {a['seconds']:.1f} of {one['duration_s']:.1f}): {b['tok_per_s']:,.0f} tok/s against "
            f"{a['tok_per_s']:,.0f}, {b['tok_per_s'] / a['tok_per_s']:.2f}x; after it, batches draining: "
            f"{b['tail_s']:.1f} s against {a['tail_s']:.1f}.")


def plot(plt, path: str, meta: dict, rows: list) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['workload']}\ndp {r['dp']}" + (f"\n{r['routing']}" if r["dp"] > 1 else "") for r in rows]
    ax.bar(range(len(rows)), [r["output_tok_per_s"] for r in rows],
           color=["#888" if r["dp"] == 1 else "#1f77b4" if r["routing"] == "least_loaded" else "#ff7f0e" for r in rows])
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("output tok/s (rate inf)")
    where = f"{meta['gpus']} x {meta['device']}" if meta["gpus"] else "CPU"
    ax.set_title(f"data parallelism through the server: {where}, {meta['model']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
