"""Find the first layer and position where two implementations diverge.

    python scripts/compare.py --a hf --b "l3_paged[triton]"
    python scripts/compare.py --a l2_gather --b "l3_paged[torch]" --plant-bug transpose

Sides: ``hf`` (transformers) or any stage of the chain (``harness/stages.py``; a stage side uses
that stage's engine, so ``l4_sampler[t=0]`` runs on stage 3's Triton engine). Both sides see the
same tokens: the prompt, then side A's own greedy continuation fed back one token at a time
(teacher forcing), so a difference can only come from the implementations. Forward hooks on
every decoder layer record its output ``[T, hidden]`` at every step; the table shows, per layer,
the max |diff| and the first position beyond tolerance. The first row that fails is where to
look: position < prompt length means prefill is already wrong.

``--plant-bug transpose`` plants, in side B (a stage, not hf), the bug from the lesson: an extra
``transpose(0, 1)`` on the attention output before it is flattened for ``o_proj``.
"""
from __future__ import annotations

import sys

from plumbing.cli import base_parser, note, run_main
from harness.smoke import load
from plumbing.errors import UserError

TOL = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 6e-2}  # atol = rtol, on hidden states


def _record(layers, store):
    def hook(i):
        def fn(_module, _inputs, output):
            if isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
                h = output[0] + output[1]       # ours: (residual, MLP output not yet added)
            else:
                h = output[0] if isinstance(output, tuple) else output   # HF: the layer's output
            store[i].append(h.reshape(-1, h.shape[-1]).float().cpu())   # [T, hidden]
        return fn
    return [layer.register_forward_hook(hook(i)) for i, layer in enumerate(layers)]


def plant_transpose(kv):
    attend = kv.attend

    def buggy(layer, q, k, v, meta):
        o = attend(layer, q, k, v, meta)                  # [T, H, D], token-major
        return o.transpose(0, 1).contiguous().view(o.shape)  # head-major bytes read as token-major
    kv.attend = buggy


def check_side(side: str, flag: str) -> None:
    from harness.stages import STAGES
    if side != "hf" and side not in STAGES:
        raise UserError(f"unknown {flag} {side!r}: choose hf or one of {', '.join(STAGES)}.")
    if side != "hf" and not STAGES[side].layerwise:
        raise UserError(f"{flag} {side!r} serves a whole batch: its layers see other requests' rows too, so they "
                        "cannot be lined up position by position. Compare l4_sampler[t=0] (the engine it batches), "
                        "and check its tokens with check_chain.py.")


def continuation(side, ld, path, n_new) -> list[int]:
    """Side A's own greedy continuation of the prompt: the tokens both sides are fed."""
    from harness.stages import STAGES
    from harness.oracle import hf_generate
    eos = ld.model.cfg.eos_token_ids
    if side == "hf":
        return hf_generate(path, ld.prompt_ids, n_new, ld.device, next(ld.model.parameters()).dtype).token_ids
    stage = STAGES[side]
    engine = stage.make_engine(ld.model, len(ld.prompt_ids) + n_new)
    return stage.generate(engine, ld.prompt_ids, n_new, eos, ld.model.cfg.max_position_embeddings).token_ids


def hidden_states(side, ld, path, tokens, n_prompt, plant=None):
    """Per layer, the outputs at positions 0 .. len(tokens) - 2: list of [len(tokens) - 1, hidden]."""
    import torch
    from harness.stages import STAGES
    from harness.oracle import hf_model
    if side == "hf":
        hf = hf_model(path, ld.device, next(ld.model.parameters()).dtype)
        layers = hf.model.layers
        store = {i: [] for i in range(len(layers))}
        handles = _record(layers, store)
        with torch.no_grad():
            hf(torch.tensor([tokens[:-1]], device=ld.device))
    else:
        engine = STAGES[side].make_engine(ld.model, len(tokens))
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
    p.add_argument("--plant-bug", choices=["transpose"], default=None, help="plant a known bug in side B (a stage)")
    p.add_argument("--tol", type=float, default=None, help="atol = rtol on hidden states (default by dtype; 0 = exact)")
    args = p.parse_args(argv)                # a bad flag stops here, before torch loads
    from l1_dense.checkpoint import resolve_model_dir
    from l1_dense.generate import check_prompt
    check_side(args.a, "--a")
    check_side(args.b, "--b")
    if args.plant_bug and args.b == "hf":
        raise UserError("--plant-bug plants the bug in side B's engine, and hf is the oracle, not an engine of "
                        "this project: pass a stage as --b, e.g. --b \"l3_paged[torch]\".")
    if args.json:
        note("--json is ignored by compare.py: it prints a table and a verdict.")
    if args.tol is not None and not args.tol >= 0:
        raise UserError(f"--tol must be a number >= 0 (0 = exact), got {args.tol}.")
    ld = load(args)
    check_prompt(ld.prompt_ids, args.max_new_tokens, ld.model.cfg)
    path = resolve_model_dir(args.model)
    n = len(ld.prompt_ids)
    tokens = ld.prompt_ids + continuation(args.a, ld, path, args.max_new_tokens)
    tol = TOL[ld.dtype_name] if args.tol is None else args.tol
    A = hidden_states(args.a, ld, path, tokens, n)
    B = hidden_states(args.b, ld, path, tokens, n, plant=args.plant_bug)
    if not A or A[0].shape[0] == 0:          # never print a verdict over nothing
        raise UserError("no layer outputs were recorded: nothing to compare.")

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
        print(f"verdict: no divergence beyond tolerance in any of the {len(A)} layers")
        return 0
    layer, pos = first
    where = "prefill (a prompt position)" if pos < n else f"decode step {pos - n + 1}"
    print(f"verdict: first divergence at layer {layer}, position {pos}: {where}")
    return 1


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
