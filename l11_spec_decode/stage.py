"""Stage 11's contribution to the assembler: one option and two parts, a step order and its graphs.

    slot           part                                              options it reads
    step           SpeculativeStep (step.py): the Speculator         speculative_config, seed
                   (speculator.py) with its drafter (n-gram, a
                   draft model, or a replay: drafters.py,
                   draft_model.py), and the verify graphs
    verify_graphs  on a GPU with CUDA graphs, VerifyGraphs           speculative_config
                   (graphs.py): uniform verify steps replayed

Without ``speculative_config`` the maker returns None and the step order is stage 7's (or 5's).
With it, async scheduling is off: a guess needs the token before it on the host, so an explicit
``async_scheduling=True`` is refused rather than ignored.
"""
from __future__ import annotations

from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l9_fp8_kv.stage import STAGES as BEFORE
from plumbing.errors import UserError

from .draft_model import DraftModelDrafter
from .drafters import NgramDrafter, ReplayDrafter
from .graphs import VerifyGraphs
from .options import OPTIONS
from .speculator import Speculator
from .step import SpeculativeStep


def make_drafter(spec, model, config, impl: str):
    if spec.method == "ngram":
        return NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        return DraftModelDrafter(spec.model, model, config, impl=impl)
    return ReplayDrafter(spec.reference, spec.acceptance_rate, model.cfg.vocab_size)


def step(a):
    """SpeculativeStep: a drafter's guesses verified in one pass (speculative_config, seed)."""
    spec = a.args.speculative_config                  # a SpecConfig (config.py), or None
    if spec is None:
        return None
    if a.args.given.get("async_scheduling") is True:
        raise UserError("async_scheduling=True cannot run with speculative_config: a guess needs the token before "
                        "it on the host. Leave async_scheduling out (speculation turns it off) or set it False.")
    speculator = Speculator(make_drafter(spec, a.model, a.config, a.args.impl), spec.num_speculative_tokens,
                            a.config.max_model_len, spec.disable_by_batch_size, seed=a.args.seed)
    return SpeculativeStep(speculator, a.part("eager_runner"), a.part("verify_graphs", lambda _: None))


def verify_graphs(a):
    """VerifyGraphs: uniform verify steps replayed, where stage 7 captured its graphs (None elsewhere:
    the step verifies eagerly)."""
    spec = a.args.speculative_config
    if spec is None or not getattr(a.part("runner"), "graphs", None):
        return None
    return VerifyGraphs(a.part("eager_runner"), spec.num_speculative_tokens + 1, spec.disable_by_batch_size)


STAGES = BEFORE + (Stage("l11_spec_decode", OPTIONS, dict(step=step, verify_graphs=verify_graphs)),)
LLM, build_engine = entry_points(STAGES)
