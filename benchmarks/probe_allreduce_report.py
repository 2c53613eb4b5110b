"""probe_allreduce.py's table (with the floor and the goal's verdict) and files (JSON, markdown, PNG)."""
from __future__ import annotations


GOAL_US, GOAL_BYTES = 6.0, 8192            # issue 40: ours in a CUDA graph at one decode token's 8 KB


def report(res: dict, world: int) -> str:
    rows, sig = res["rows"][1:], res["rows"][0]["ours_graph_us"]
    bw = res.get("p2p_GBps")
    lines = [f"probe_allreduce: {res['device']} x {world}, NCCL {res['nccl']}, torch {res['torch']}, bf16, "
             f"multicast off; P2P copy {bw or 0:.0f} GB/s; ours' signalling (1 element, graph) {sig:.1f} µs",
             "", "| bytes | batch at hidden 4096 | NCCL eager µs | NCCL graph µs | ours eager µs | ours graph µs | "
             "floor µs | of floor | NCCL graph / ours graph |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        r["floor_us"] = sig + (r["bytes"] * (world - 1) / (bw * 1e9) * 1e6 if bw else 0.0)
        lines.append(f"| {r['bytes']:,} | {r['bytes'] / 8192:g} | {r['nccl_eager_us']:.1f} | "
                     f"{r['nccl_graph_us']:.1f} | {r['ours_eager_us']:.1f} | {r['ours_graph_us']:.1f} | {r['floor_us']:.1f} | "
                     f"{r['floor_us'] / r['ours_graph_us']:.0%} | {r['nccl_graph_us'] / r['ours_graph_us']:.1f}x |")
    goal = next(r for r in rows if r["bytes"] == GOAL_BYTES)["ours_graph_us"]
    lines += [f"floor: the signalling cost + bytes x {world - 1} / P2P bandwidth; graphs of {res['graph_reps']} calls",
              f"goal: ours in a graph <= {GOAL_US} µs at {GOAL_BYTES} bytes: {goal:.1f} µs, "
              f"{'met' if goal <= GOAL_US else 'NOT met'}",
              f"a wait's poll: {res['spin_us']:.3f} µs (the default spin limit gives up after "
              f"{res['spin_us'] * res['spin_limit'] / 1e6:.0f} s)",
              f"checked: {res['checked']} all-reduces against NCCL, {len(res['mismatches'])} differ"]
    return "\n".join(lines)


def plot(plt, path: str, res: dict, world: int) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    b = [r["bytes"] for r in res["rows"][1:]]
    for key, style in (("nccl_eager_us", "o--"), ("nccl_graph_us", "o-"), ("ours_eager_us", "s--"),
                       ("ours_graph_us", "s-"), ("floor_us", "k:")):
        ax.plot(b, [r[key] for r in res["rows"][1:]], style, label=key[:-3].replace("_", " "))
    ax.axhline(GOAL_US, color="grey", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="bytes (bf16)", ylabel="µs per all-reduce",
           title=f"all-reduce, {res['device']} x {world}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def save(stem: str, res: dict, text: str, world: int) -> None:
    from benchmarks.outputs import save_results
    from plumbing.plot import wrote
    print(wrote(*save_results(stem, res, text, lambda plt, p: plot(plt, p, res, world))))
