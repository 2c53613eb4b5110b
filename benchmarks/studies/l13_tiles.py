"""Which of matmul.py's launch parameters change a row's bits, and which only its speed (GPU, bf16).

    python -m benchmarks.studies.l13_tiles            # one GPU, ~2 minutes

(a) bits: the kernel's output under every (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) below,
    K_CHUNK fixed, against the interpreter's tile (REFERENCE), at the 0.6B and 8B shapes, M = 1, 7,
    64, 256, 300. A tile that gives other bits for any row may not be chosen by M.
(b) bits: K_CHUNK 256 / 512 against 1024 (expected to differ: the chunks are the sum's shape).
(c) time (CUDA graph, L2 flushed) of each tile at M = 1, 64, 256, 2048, fold and split launches.
"""
from __future__ import annotations

import importlib
import itertools
import json

import torch

from benchmarks.timing import graph_ms

mm = importlib.import_module("l13_batch_invariant.matmul")   # (the package exports the function by that name)
REFERENCE, Tile = mm.REFERENCE, mm.Tile

SHAPES = (("0.6B qkv", 4096, 1024), ("0.6B o_proj", 1024, 2048), ("0.6B gate_up", 6144, 1024),
          ("0.6B down", 1024, 3072), ("8B qkv", 6144, 4096), ("8B down", 4096, 12288))
TILES = [(bm, bn, bk, w, s) for bm, bn, bk, w, s in itertools.product((16, 64, 128), (32, 64, 128, 256), (64, 128),
                                                                      (4, 8), (3, 4))
         if not (bm == 128 and bn == 256 and bk == 128) and not (bm == 16 and w == 8)]


def run(x, w, tile, k_chunk=None, split=False):
    """matmul.py's sum with this tile and launch forced (tile: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages))."""
    return mm.matmul(x, w, tile=Tile(*tile), split=split, k_chunk=k_chunk or mm.K_CHUNK)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="l13_tiles.json", help="where the JSON goes (default l13_tiles.json)")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    res = dict(device=torch.cuda.get_device_name(), bits=[], chunk_bits=[], times=[])
    for name, N, K in SHAPES:
        w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
        x = torch.randn(2048, K, device="cuda").bfloat16()
        ref_tile = tuple(REFERENCE)
        ref = run(x[:300], w, ref_tile)
        same, other = [], []
        for tile in TILES:
            try:
                ok = all(torch.equal(run(x[:m], w, tile, split=s), ref[:m]) for m in (1, 7, 64, 256, 300)
                         for s in (False, True))
            except Exception as e:                        # out of shared memory: not a candidate
                ok = f"error {type(e).__name__}"
            (same if ok is True else other).append((tile, ok))
        res["bits"].append(dict(shape=name, same=[t for t, _ in same], other=[(t, str(o)) for t, o in other]))
        print(f"(a) {name}: {len(same)} of {len(TILES)} tiles give the reference tile's bits; other bits: "
              f"{[t for t, o in other if o is False]}; errors: {[t for t, o in other if o is not False]}", flush=True)
        for kc in (256, 512):
            eq = torch.equal(run(x[:300], w, ref_tile, k_chunk=kc), ref)
            res["chunk_bits"].append(dict(shape=name, k_chunk=kc, same_as_1024=eq))
        print(f"(b) {name}: K_CHUNK 256 / 512 equal to 1024: "
              f"{[r['same_as_1024'] for r in res['chunk_bits'][-2:]]}", flush=True)
        good = [t for t, _ in same]
        for M in (1, 64, 256, 2048):
            xm = x[:M]
            best = []
            small = M <= 64                    # decode: narrow tiles, K split finer; prefill: wide tiles, fold
            for tile in good:
                bm, bn, bk, nw, ns = tile
                if (small and (bm > 64 or bn > 128 or nw > 4)) or (not small and bm < 64):
                    continue
                for kc, split in ((1024, False), (1024, True), (512, True), (256, True)) if small else ((1024, False),):
                    if split and K <= kc:
                        continue
                    try:
                        t = graph_ms(lambda: run(xm, w, tile, kc, split), reps=5, trials=3) * 1e3
                    except Exception:
                        continue
                    best.append((t, tile, kc, split))
            best.sort()
            base = graph_ms(lambda: mm.matmul(xm, w), reps=5, trials=3) * 1e3          # the host's pick
            cub = graph_ms(lambda: torch.nn.functional.linear(xm, w), reps=5, trials=3) * 1e3
            res["times"].append(dict(shape=name, M=M, picked_us=base, cublas_us=cub,
                                     best=[dict(us=t, tile=tl_, k_chunk=kc, split=sp) for t, tl_, kc, sp in best[:5]]))
            print(f"(c) {name} M={M}: the host's pick {base:.1f} us, cuBLAS {cub:.1f} us, best: "
                  + "; ".join(f"{t:.1f} us {tl_} kc {kc}{' split' if sp else ''}" for t, tl_, kc, sp in best[:4]),
                  flush=True)
    json.dump(res, open(a.out, "w"), indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
