"""Find the first layer and position where two implementations diverge.

    python scripts/compare.py --a hf --b "l3_paged[triton]"
    python scripts/compare.py --a l2_gather --b "l3_paged[torch]" --plant-bug transpose

Both sides see the same tokens: the prompt, then side A's greedy continuation fed back one
token at a time (teacher forcing), so a difference can only come from the implementations.
Forward hooks on every decoder layer record its output ``[T, hidden]`` at every step; the
table shows, per layer, the max |diff| and the first position beyond tolerance. The first row
that fails is where to look: position < prompt length means prefill is already wrong.

``--plant-bug transpose`` plants, in side B, the bug from the lesson: an extra
``transpose(0, 1)`` on the attention output before it is flattened for ``o_proj``.
"""
from __future__ import annotations

import sys

import _path  # noqa: F401
import torch

from check_chain import stage_engines
from l1_dense.checkpoint import resolve_model_dir
from l1_dense.cli import base_parser, load, run_main
from l1_dense.errors import UserError
from l1_dense.generate import check_prompt, greedy_generate

TOL = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 6e-2}  # atol = rtol, on hidden states


def _record(layers, store):
    def hook(i):
        def fn(_module, _inputs, output):
            h = output[0] if isinstance(output, tuple) else output
            store[i].append(h.reshape(-1, h.shape[-1]).float().cpu())   # [T, hidden]
        return fn
    return [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]


def plant_transpose(kv):
    attend = kv.attend

    def buggy(layer, q, k, v, meta):
        o = attend(layer, q, k, v, meta)                  # [T, H, D], token-major
        return o.transpose(0, 1).contiguous().view(o.shape)  # head-major bytes read as token-major
    kv.attend = buggy


def hidden_states(side, ld, path, tokens, n_prompt, plant=None):
    """Per layer, the outputs for all positions: list of [len(tokens) - 1 or len(tokens), hidden]."""
    if side == "hf":
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging
        logging.disable_progress_bar()
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=next(ld.model.parameters()).dtype)
        hf = hf.to(ld.device).eval()
        layers = hf.model.layers
        store = {i: [] for i in range(len(layers))}
        handles = _record(layers, store)
        with torch.no_grad():
            hf(torch.tensor([tokens[:-1]], device=ld.device))
    else:
        engines = stage_engines(ld.model, len(tokens))
        if side not in engines:
            raise UserError(f"unknown side {side!r}: choose hf or one of {', '.join(engines)}")
        engine = engines[side]()
        if plant == "transpose":
            plant_transpose(engine.kv if hasattr(engine, "kv") else engine.pool)
        layers = ld.model.model.layers
        store = {i: [] for i in range(len(layers))}
        handles = _record(layers, store)
        engine.prefill(tokens[:n_prompt])
        for t in tokens[n_prompt:-1]:
            engine.decode(t)
    for h in handles:
        h.remove()
    return [torch.cat(store[i]) for i in range(len(store))]


def main(argv=None) -> int:
    p = base_parser("compare", __doc__)
    p.add_argument("--a", default="hf", help="reference side: hf or a stage name (default hf)")
    p.add_argument("--b", default="l3_paged[triton]", help="side under test (default l3_paged[triton])")
    p.add_argument("--plant-bug", choices=["transpose"], default=None, help="plant a known bug in side B")
    p.add_argument("--tol", type=float, default=None, help="atol = rtol on hidden states (default by dtype)")
    args = p.parse_args(argv)
    ld = load(args)
    check_prompt(ld.prompt_ids, args.max_new_tokens, ld.model.cfg)
    path = resolve_model_dir(args.model)
    n = len(ld.prompt_ids)
    cont = greedy_generate(stage_engines(ld.model, n + args.max_new_tokens)["l1_dense"](),
                           ld.prompt_ids, args.max_new_tokens, ld.model.cfg.eos_token_ids).token_ids
    tokens = ld.prompt_ids + cont
    tol = args.tol or TOL[ld.dtype_name]
    A = hidden_states(args.a, ld, path, tokens, n)
    B = hidden_states(args.b, ld, path, tokens, n, plant=args.plant_bug)

    print(f"A={args.a}  B={args.b}{' (planted bug: ' + args.plant_bug + ')' if args.plant_bug else ''}  "
          f"dtype={ld.dtype_name}  positions={len(tokens) - 1} (prompt {n})  tol={tol:g}")
    print("| layer | max abs diff | first bad position |")
    print("|------:|-------------:|-------------------:|")
    first = None
    for i, (a, b) in enumerate(zip(A, B)):
        diff = (a - b).abs()                                   # [positions, hidden]
        bad = (diff > tol + tol * a.abs()).any(-1).nonzero()
        pos = int(bad[0]) if len(bad) else None
        print(f"| {i:>5} | {float(diff.max()):>12.3e} | {'-' if pos is None else pos:>18} |")
        if pos is not None and first is None:
            first = (i, pos)
    if first is None:
        print("verdict: no divergence beyond tolerance in any layer")
        return 0
    layer, pos = first
    where = "prefill (a prompt position)" if pos < n else f"decode step {pos - n + 1}"
    print(f"verdict: first divergence at layer {layer}, position {pos}: {where}")
    return 1


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
