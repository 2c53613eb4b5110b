"""The GPU half of decode_limits.py: the shapes, the timings, the table and the plot (the read
kernel comes in as an argument: this module imports nothing from decode_limits.py)."""
from __future__ import annotations

import torch

import plumbing.runtime  # noqa: F401  (before triton: picks GPU or interpreter)
import triton

import benchmarks.attention_peers as ba
from benchmarks.kernel_bench import Bench
from benchmarks.timing import graph_ms, try_graph_ms
from l3_paged.kernel_config import pick_config
from l3_paged.paged_batch import make_paged_batch
from l7_fast.attention_split import _num_sms, paged_attention_split, pick_num_splits, split_config
from l7_fast.pdl import pdl_supported
from l9_fp8_kv import paged_attention_fp8_split
from l9_fp8_kv.attention import quantize_batch
from l9_fp8_kv.attention_split import fp8_num_splits, fp8_split_config
from plumbing.plot import pyplot

H_Q, H_KV, D, BS = 32, 8, 128, 16                  # issue 18's decode shapes (Qwen3-8B's attention)
SHAPES = ((1, 4096), (1, 32768), (8, 8192), (32, 4096), (64, 4096), (256, 1024))
FP8_SHAPES = ((64, 4096), (8, 8192), (1, 32768))   # issue 19's (and bench_fp8's third)

NAMES = ("attention", "attention_one_block", "attention_one_block_head_major", "sdpa", "read_paged",
         "read_head_major", "read_dense")


def _block_n(B, ctx, splits, dtype):
    """The key tile the attention kernel takes for this decode (the engine's pickers)."""
    g_pad = triton.next_power_of_2(H_Q // H_KV)
    if splits > 1:
        return split_config(B, g_pad, 128, dtype, triton.cdiv(ctx, splits)).block_n
    return pick_config(1, B, B, g_pad, 128, dtype).block_n


def _attention_times(args, ctx, pdl, one):
    """The engine's decode attention on the paged cache, then on the same K/V held as one block per
    sequence (``one``: token-major contiguous, and head-major with SDPA's strides): same kernel, tiles."""
    q, k, v, cu, lens, table = args
    run = lambda kc, vc, t: graph_ms(lambda: paged_attention_split(  # noqa: E731
        q, kc, vc, cu, lens, t, max_seqlen_q=1, max_seqlen_kv=ctx, pdl=pdl, check=False))
    (ktm, vtm), (khm, vhm), ids = one
    return dict(attention=run(k, v, table), attention_one_block=run(ktm, vtm, ids),
                attention_one_block_head_major=run(khm, vhm, ids))


def run(read) -> dict:
    bench, dev = Bench(), torch.device("cuda", torch.cuda.current_device())
    sms, pdl = _num_sms(dev), pdl_supported(dev)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               copy_GBps=bench.copy_gbps, heads=dict(H_q=H_Q, H_kv=H_KV, D=D, block=BS), pdl=pdl, rows=[], fp8=[])
    attn_ms = {}
    for B, ctx in SHAPES:
        args = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BS, torch.bfloat16, "cuda", spare_blocks=0)
        _, k, v, _, lens, table = args
        splits = pick_num_splits(B, H_KV, ctx, sms)
        bn = _block_n(B, ctx, splits, torch.bfloat16)
        kd, vd = ba.dense_kv(args, ctx)                                   # [B, H_kv, ctx, D]
        km, vm = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        ids = torch.arange(B, device="cuda", dtype=torch.int32)[:, None]
        khm, vhm = kd.permute(0, 2, 1, 3), vd.permute(0, 2, 1, 3)         # [B, ctx, H_kv, D] views of SDPA's layout
        one = ((khm.contiguous(), vhm.contiguous()), (khm, vhm), ids)
        qd = args[0].view(B, H_Q, 1, D)
        nbytes = 2 * B * ctx * H_KV * D * 2
        t = _attention_times(args, ctx, pdl, one)
        t.update(sdpa=try_graph_ms(lambda: ba.sdpa(qd, kd, vd, False)),
                 read_paged=graph_ms(lambda: read(k, v, table, lens, splits, bn)),
                 read_head_major=graph_ms(lambda: read(km, vm, table, lens, splits, bn, head_major=True)),
                 read_dense=graph_ms(lambda: read(kd, vd, ids, lens, splits, bn, head_major=True)))
        attn_ms[(B, ctx)] = t["attention"]
        row = dict(B=B, ctx=ctx, splits=splits, block_n=bn, bytes=nbytes, us={n: ms * 1e3 for n, ms in t.items()},
                   pct_copy={n: bench.pct(nbytes, ms) for n, ms in t.items()})
        res["rows"].append(row)
        print(f"  {B} x {ctx}: " + ", ".join(f"{n} {ms * 1e3:.1f} us ({bench.pct(nbytes, ms):.0f}%)"
                                             for n, ms in t.items()), flush=True)
        del args, k, v, kd, vd, km, vm, one, khm, vhm
        torch.cuda.empty_cache()
    for B, ctx in FP8_SHAPES:
        base = make_paged_batch([1] * B, [ctx] * B, H_Q, H_KV, D, BS, torch.bfloat16, "cuda", spare_blocks=0)
        fa = quantize_batch(base, per_token=False)
        _, kc, vc, _, _, _, lens, table = fa
        ns8 = fp8_num_splits(B, H_KV, ctx, sms)
        bn8 = fp8_split_config(B, 4, 128, torch.bfloat16).block_n if ns8 > 1 else 128
        t8 = graph_ms(lambda: paged_attention_fp8_split(*fa, max_seqlen_q=1, num_splits=ns8))
        r8 = graph_ms(lambda: read(kc, vc, table, lens, ns8, bn8))
        nbytes = 2 * B * ctx * H_KV * D
        bf = attn_ms[(B, ctx)]
        row = dict(B=B, ctx=ctx, splits=ns8, block_n=bn8, bytes=nbytes, fp8_us=t8 * 1e3, read_us=r8 * 1e3,
                   bf16_us=bf * 1e3, speedup=bf / t8, bound=bf / r8, fp8_pct=bench.pct(nbytes, t8),
                   read_pct=bench.pct(nbytes, r8))
        res["fp8"].append(row)
        print(f"  e4m3 {B} x {ctx}: attention {t8 * 1e3:.1f} us ({bf / t8:.2f}x bf16), "
              f"read floor {r8 * 1e3:.1f} us (bf16 / floor {bf / r8:.2f}x)", flush=True)
        del base, fa
        torch.cuda.empty_cache()
    return res


def table(r) -> str:
    h = r["heads"]
    head = (f"{r['device']}, torch {r['torch']}, triton {r['triton']}; H_q {h['H_q']}, H_kv {h['H_kv']}, "
            f"D {h['D']}, block {h['block']}, bf16; copy {r['copy_GBps']:.0f} GB/s; PDL {r['pdl']}; "
            "µs from CUDA graphs, L2 flushed (% of copy bandwidth)\n\n"
            "| B x ctx | splits | key tile | attention (engine) | same, K/V one block a sequence | same, one block "
            "head-major | SDPA (dense) | read: paged | read: paged head-major | read: dense |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for x in r["rows"]:
        cells = [f"{x['us'][n]:.1f} ({x['pct_copy'][n]:.0f}%)" for n in NAMES]
        lines.append(f"| {x['B']} x {x['ctx']} | {x['splits']} | {x['block_n']} | " + " | ".join(cells) + " |")
    lines += ["", "| e4m3 cache, B x ctx | splits | e4m3 attention | its speed-up over bf16 | e4m3 read floor "
              "| bf16 attention / e4m3 read floor |", "|---|---:|---:|---:|---:|---:|"]
    for x in r["fp8"]:
        lines.append(f"| {x['B']} x {x['ctx']} | {x['splits']} | {x['fp8_us']:.1f} ({x['fp8_pct']:.0f}%) | "
                     f"{x['speedup']:.2f}x | {x['read_us']:.1f} ({x['read_pct']:.0f}%) | {x['bound']:.2f}x |")
    return "\n".join(lines)


def plot(r, path) -> None:
    plt = pyplot()
    if plt is None:
        return
    names = NAMES
    fig, ax = plt.subplots(figsize=(11, 4))
    w = 0.12
    for i, n in enumerate(names):
        ax.bar([j + i * w for j in range(len(r["rows"]))], [x["pct_copy"][n] for x in r["rows"]], w, label=n)
    ax.set_xticks([j + 3 * w for j in range(len(r["rows"]))], [f"{x['B']}x{x['ctx']}" for x in r["rows"]])
    ax.set_ylabel("% of copy bandwidth")
    ax.set_title(f"decode attention and the read floor of each layout, {r['device']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
