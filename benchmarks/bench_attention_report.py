"""bench_attention.py's report: the markdown tables and the plot."""
from __future__ import annotations

from plumbing.plot import pyplot


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def markdown(meta, dec, pre, mixed):
    bw = meta["copy_GBps"]
    lines = [f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; "
             f"{meta['shape']}; measured copy bandwidth {bw:.0f} GB/s (read + write).", "",
             "Decode (one new token per sequence). GB/s = (K/V read + q read + out written) / time. "
             "SDPA and flex read a dense [B, H_kv, ctx, D] copy of the same K/V; flex compiles per "
             "shape, so it runs at the longest context only (n/a elsewhere).", "",
             "| batch | context | triton µs | triton GB/s | % of copy BW | SDPA µs | SDPA % copy | "
             "flex µs | ref (Path A) µs | triton vs SDPA |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in dec:
        gbps = r["bytes"] / r["triton_ms"] / 1e6
        sd = r["sdpa_ms"]
        lines.append(
            f"| {r['B']} | {r['ctx']} | {r['triton_ms'] * 1e3:.1f} | {gbps:.0f} | {100 * gbps / bw:.0f}% | "
            f"{fmt(sd and sd * 1e3, '.1f')} | {fmt(sd and 100 * r['bytes'] / sd / 1e6 / bw, '.0f')}% | "
            f"{fmt(r['flex_ms'] and r['flex_ms'] * 1e3, '.1f')} | {fmt(r['ref_ms'] and r['ref_ms'] * 1e3, '.0f')} | "
            f"{fmt(sd and sd / r['triton_ms'], '.2f')}x |")
    lines += ["", "Prefill (one causal sequence). FLOPs = 4 * H_q * D * T(T+1)/2.", "",
              "| tokens | triton ms | triton TFLOP/s | SDPA ms | SDPA TFLOP/s | triton / SDPA speed | "
              "flex ms | flex TFLOP/s | ref ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in pre:
        tf = lambda ms: fmt(ms and r["flops"] / ms / 1e9, ".0f")  # noqa: E731
        lines.append(f"| {r['T']} | {r['triton_ms']:.3f} | {tf(r['triton_ms'])} | {fmt(r['sdpa_ms'], '.3f')} | "
                     f"{tf(r['sdpa_ms'])} | {fmt(r['sdpa_ms'] and r['sdpa_ms'] / r['triton_ms'], '.2f')}x | "
                     f"{fmt(r['flex_ms'], '.3f')} | {tf(r['flex_ms'])} | {fmt(r['ref_ms'], '.1f')} |")
    if mixed:
        m = mixed
        lines += ["", f"Mixed batch, one launch: a {m['chunk']}-token prefill chunk on {m['ctx'] - m['chunk']} "
                  f"cached tokens + {m['B'] - 1} decodes at context {m['ctx']}: {m['triton_ms'] * 1e3:.1f} µs "
                  f"(the {m['B'] - 1} decodes alone: {m['decode_only_ms'] * 1e3:.1f} µs)."]
    if meta.get("quick"):
        lines += ["", "Targets: not judged (--quick smoke-tests the script on tiny shapes; it measures nothing)."]
        dec, pre = [], []
    else:
        lines += ["", "Targets:"]
    for r in dec:
        if (r["B"], r["ctx"]) == (64, 4096):
            frac = r["bytes"] / r["triton_ms"] / 1e6 / bw
            lines.append(f"- decode 64 x 4096 >= 70% of copy bandwidth: {100 * frac:.0f}% -> "
                         f"{'HIT' if frac >= 0.7 else 'MISSED'}")
    for r in pre:
        if r["T"] == 4096 and r["sdpa_ms"]:
            ratio = r["sdpa_ms"] / r["triton_ms"]
            lines.append(f"- prefill 4096 causal >= 0.7x SDPA: {ratio:.2f}x -> {'HIT' if ratio >= 0.7 else 'MISSED'}")
    lines += ["", f"Host cost of one call (layout checks + launch, back-to-back, no sync): "
              f"{meta['host_us_per_call']:.1f} µs. do_bench hides it; at small batch it is the real floor."]
    return "\n".join(lines)


def plot(path, meta, dec, pre):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    labels = [f"{r['B']}x{r['ctx']}" for r in dec]
    x = range(len(dec))
    for i, (key, name) in enumerate((("triton_ms", "triton (paged)"), ("sdpa_ms", "SDPA (dense)"),
                                     ("flex_ms", "flex (dense)"))):
        vals = [100 * r["bytes"] / r[key] / 1e6 / meta["copy_GBps"] if r[key] else 0 for r in dec]
        a.bar([j + (i - 1) * 0.27 for j in x], vals, 0.27, label=name)
    a.axhline(70, color="k", ls="--", lw=1, label="target 70%")
    a.set_xticks(list(x), labels, rotation=45)
    a.set_ylabel("% of measured copy bandwidth")
    a.set_title("decode (batch x context)")
    a.legend()
    for i, (key, name) in enumerate((("triton_ms", "triton"), ("sdpa_ms", "SDPA"), ("flex_ms", "flex"))):
        b.bar([j + (i - 1) * 0.27 for j in range(len(pre))],
              [r["flops"] / r[key] / 1e9 if r[key] else 0 for r in pre], 0.27, label=name)
    b.set_xticks(range(len(pre)), [str(r["T"]) for r in pre])
    b.set_ylabel("TFLOP/s")
    b.set_title("causal prefill (tokens)")
    b.legend()
    fig.suptitle(f"paged attention, {meta['shape']}, {meta['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
