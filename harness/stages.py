"""The stage registry: every stage built so far, in lesson order, as one runnable entry each.

A stage entry is a name, an engine factory and a generate function:

    make_engine(model, n_tokens) -> engine      # .prefill(ids) / .decode(tok) -> logits [V]
    make_engine(model, n_tokens, path)          # a stage whose other processes load the checkpoint
    generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation (logits kept)

``Stage.engine(model, n_tokens, path)`` calls either. The oracle it is judged against is oracle.py's.

``scripts/check_chain.py`` runs every entry against the oracle (:func:`hf_generate`) and
``scripts/compare.py`` uses any entry's engine as a side. A new stage is one more call at the
end of this file, e.g. ``register("l5_scheduler", make_engine, generate)``; the order of
registration is the order of the table, and check_chain, compare and the tests pick it up.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from l1_dense.dense_kv import DenseEngine
from plumbing.errors import UserError
from l1_dense.generate import Generation, greedy_generate
from l2_gather.engine import GatherEngine
from l3_paged.engine import PagedEngine
from l4_sampler.generate import sample_generate
from l4_sampler.params import SamplingParams

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Stage:
    name: str
    make_engine: Callable          # (model, n_tokens) -> engine
    generate: Callable             # (engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation
    layerwise: bool = True         # engine.prefill/.decode run one sequence: compare.py can hook its layers
    needs_path: bool = False       # make_engine takes the checkpoint's folder too (stage 12's workers load it)

    def engine(self, model, n_tokens: int, path=None):
        if not self.needs_path:
            return self.make_engine(model, n_tokens)
        if path is None:
            raise UserError(f"the {self.name} row loads the checkpoint in other processes: give its folder (path=...)")
        return self.make_engine(model, n_tokens, path)


class Skipped(UserError):
    """A row this machine cannot run (stage 12's needs two GPUs where there is one): check_chain
    lists it as skipped, with the reason, and judges the other rows."""


STAGES: dict[str, Stage] = {}


def register(name: str, make_engine: Callable, generate: Callable | None = None, layerwise: bool = True,
             needs_path: bool = False) -> Stage:
    """Add a stage (``generate`` defaults to lesson 1's greedy loop)."""
    if name in STAGES:
        raise ValueError(f"stage {name!r} is already registered")
    STAGES[name] = Stage(name, make_engine, generate or _greedy, layerwise, needs_path)
    return STAGES[name]


def _greedy(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    return greedy_generate(engine, prompt_ids, max_new_tokens, eos_ids, keep_logits=True)


def _blocks(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK_SIZE) + 1


def _sample_t0(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    # Stage 4 samples on stage 3's engine; at temperature 0 it must be the same argmax.
    return sample_generate(engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
                           eos_ids, max_model_len, keep_logits=True)


register("l1_dense", lambda model, n: DenseEngine(model, n))
register("l2_gather", lambda model, n: GatherEngine(model, _blocks(n), BLOCK_SIZE))
register("l3_paged[torch]", lambda model, n: PagedEngine(model, _blocks(n), BLOCK_SIZE, impl="torch", check=True))
register("l3_paged[triton]", lambda model, n: PagedEngine(model, _blocks(n), BLOCK_SIZE, impl="triton", check=True))
register("l4_sampler[t=0]", STAGES["l3_paged[triton]"].make_engine, _sample_t0)


def _demo_engine(model, n_tokens, build_engine, num_blocks, given=None, **kw):
    """A scheduler stage's engine with its smoke script's small budget and pool (grown only if
    this request alone would not fit), so the prompt is chunked and the pool runs dry. ``given``:
    what the engine's model slot gets instead of the loaded ``model`` (a Checkpoint to load)."""
    from l5_scheduler.config import make_config

    from . import l5_demo as demo
    blocks = max(num_blocks, -(-max(n_tokens, 96) // demo.BLOCK_SIZE))
    p = next(model.parameters())
    cfg = make_config(model.cfg, str(p.device), p.dtype, block_size=demo.BLOCK_SIZE,
                      num_gpu_blocks_override=blocks, max_num_batched_tokens=demo.BUDGET)
    return build_engine(given or model, None, cfg, impl="triton", check=True, keep_logits=True, **kw)


def _run_usual(engine, rid) -> Generation:
    while engine.has_unfinished_requests():
        engine.step()
    req = engine.requests[rid]
    return Generation(list(req.output_ids), req.finish_reason, req.logits)


def _l5_engine(model, n_tokens):
    """Stage 5 with the smoke script's mixed workload (harness/l5_demo.py)."""
    from l5_scheduler import build_engine

    from . import l5_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS)


def _l5_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    """The prompt served together with the demo's other requests; its own tokens and logits."""
    from . import l5_demo as demo
    extras = demo.extra_prompts(None, engine.model.cfg.vocab_size)
    rid, _ = demo.add_demo_requests(engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
                                    extras)
    return _run_usual(engine, rid)


register("l5_scheduler", _l5_engine, _l5_generate, layerwise=False)


def _l6_engine(model, n_tokens):
    """Stage 6 (prefix caching on) with its smoke script's sharing workload (harness/l6_demo.py)."""
    from l6_prefix_cache import build_engine

    from . import l6_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True)


def _l6_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    """The prompt after a request that contains it, so its first blocks come from the cache."""
    from . import l6_demo as demo
    rid, _ = demo.add_demo_requests(engine, prompt_ids, SamplingParams(temperature=0.0, max_tokens=max_new_tokens))
    gen = _run_usual(engine, rid)
    if not any(r == rid and n > 0 for s in engine.stats for r, n in s.hits):
        raise AssertionError("the l6 row's prompt found nothing in the prefix cache: the row would not test sharing")
    return gen


register("l6_prefix_cache", _l6_engine, _l6_generate, layerwise=False)


def _l7_engine(model, n_tokens):
    """Stage 7 with every fast path on: fused kernels, split-KV, and CUDA graphs on a GPU."""
    from l7_fast import build_engine

    from . import l6_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True)


def _l7_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    """Stage 6's workload; on a GPU, decode steps must really have replayed CUDA graphs."""
    from l7_fast import FusedOps, GraphRunner
    gen = _l6_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len)
    r = engine.runner
    if isinstance(r, GraphRunner) and not any(m.startswith("graph") for m in r.mode_log):
        raise AssertionError("the l7 row replayed no CUDA graph: it would not test graph replay")
    if next(engine.model.parameters()).device.type == "cuda" and not isinstance(r, GraphRunner):
        raise AssertionError("the l7 row runs on a GPU without CUDA graphs")
    if not isinstance(r.ops, FusedOps):
        raise AssertionError("the l7 row runs without the fused ops")
    return gen


register("l7_fast", _l7_engine, _l7_generate, layerwise=False)


def select(names: str | None) -> list[Stage]:
    """``"a,b"`` -> those stages in registry order; None -> all. Unknown or no names: UserError."""
    if names is None:
        return list(STAGES.values())
    asked = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in asked if n not in STAGES]
    if unknown:
        raise UserError(f"unknown stage(s) {', '.join(map(repr, unknown))}: choose from {', '.join(STAGES)} "
                        "(quote names with brackets in the shell).")
    if not asked:
        raise UserError(f"--stages names no stage: choose from {', '.join(STAGES)}.")
    return [s for s in STAGES.values() if s.name in asked]


def run_stages(model, prompt_ids, max_new_tokens, only=None, path=None) -> dict[str, Generation]:
    """Run each stage (all, or the names in ``only``) on the same prompt; logits are kept."""
    n = len(prompt_ids) + max_new_tokens
    eos = model.cfg.eos_token_ids
    stages = select(",".join(only)) if only is not None else list(STAGES.values())
    return {s.name: s.generate(s.engine(model, n, path), prompt_ids, max_new_tokens, eos,
                               model.cfg.max_position_embeddings) for s in stages}


def _l8_engine(model, n_tokens):
    """Stage 8: stage 7 given the window-aware KV manager and cache (stage 6's sharing workload)."""
    from l8_sliding_window import build_engine

    from . import l6_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True)


register("l8_sliding_window", _l8_engine, _l6_generate, layerwise=False)


def _l9_engine(model, n_tokens, kv_cache_dtype="auto"):
    """Stage 9 with ``kv_cache_dtype="auto"``: stage 8's engine exactly (the fp8 line is separate)."""
    from l9_fp8_kv import build_engine

    from . import l6_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True,
                        kv_cache_dtype=kv_cache_dtype)


register("l9_fp8_kv", _l9_engine, _l6_generate, layerwise=False)
FP8_LINE = ("l9_fp8_kv[fp8]", lambda model, n: _l9_engine(model, n, "fp8"), _l6_generate)


def _l11_engine(model, n_tokens):
    """Stage 11: stage 9 given a speculator with n-gram drafts (k = 3, n-grams of 1-3 tokens)."""
    from l11_spec_decode import build_engine

    from . import l6_demo as demo
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True,
                        speculative_config=dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                                prompt_lookup_max=3))


def _l11_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    """Stage 6's workload; drafts must really have been verified, or the row tests nothing new."""
    gen = _l6_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len)
    if engine.step_order.speculator.verify_steps == 0:
        raise AssertionError("the l11 row verified no draft: it would not test speculative decoding")
    if next(engine.model.parameters()).device.type == "cuda" and not any(
            m.startswith("graph") and "x" in m for m in engine.runner.mode_log):
        raise AssertionError("the l11 row replayed no verify-step CUDA graph on a GPU")
    return gen


register("l11_spec_decode", _l11_engine, _l11_generate, layerwise=False)


def _l12_engine(model, n_tokens, path):
    """Stage 12: stage 11's engine over two ranks (gloo on a CPU, NCCL on two GPUs), the sharing
    workload; the other rank loads its slices from ``path``."""
    from pathlib import Path

    import torch

    from l5_scheduler.assemble import Checkpoint
    from l12_tensor_parallel import build_engine

    from . import l6_demo as demo
    p = next(model.parameters())
    if p.device.type == "cuda" and torch.cuda.device_count() < 2:
        raise Skipped("needs two GPUs (tensor_parallel_size 2), this machine shows one")
    given = Checkpoint(Path(path), str(p.device), p.dtype)
    return _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, given=given, enable_prefix_caching=True,
                        tensor_parallel_size=2)


def _l12_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len) -> Generation:
    """Stage 6's workload through both ranks; the workers stop after it."""
    group = engine.model.tensor_parallel
    try:
        gen = _l6_generate(engine, prompt_ids, max_new_tokens, eos_ids, max_model_len)
        if group.sent.steps + group.sent.replays == 0:
            raise AssertionError("the l12 row sent no step to the other rank: it would not test tensor parallelism")
    finally:
        group.close()
    return gen


register("l12_tensor_parallel", _l12_engine, _l12_generate, layerwise=False, needs_path=True)


def _l13_engine(model, n_tokens):
    """Stage 13: batch_invariant=True (its matmul and attention), the sharing workload."""
    from l13_batch_invariant import build_engine

    from . import l6_demo as demo
    engine = _demo_engine(model, n_tokens, build_engine, demo.NUM_BLOCKS, enable_prefix_caching=True,
                          batch_invariant=True)
    if engine.chosen.get("ops") != "l13_batch_invariant" or engine.chosen.get("kv_cache") != "l13_batch_invariant":
        raise AssertionError("the l13 row runs without its invariant ops and attention: it would not test stage 13")
    return engine


register("l13_batch_invariant", _l13_engine, _l6_generate, layerwise=False)

