"""Async scheduling (lesson 7): stage 7's overlapped step order against stage 5's plain one.

1. Property-based fuzz in the real engine loop with a fake model (tests/l7_async_fake.py): stage
   5's scheduler, stage 6's prefix cache and stage 4's sampler, on workloads that share prefixes,
   chunk, preempt, end by EOS and by length, and abort requests in flight. Planted bugs show that
   each invariant can fail. Tiers as in tests/test_l6_fuzz.py.
2. The tiny model through stage 7's engine (its runner copies the tokens in flight into its inputs
   on the device, ``fill_in_flight``), on the CPU: the same tokens, logprobs and finish reasons
   with async scheduling on and off, over a batch that chunks, preempts, stops on a token,
   samples with seeds and penalties, and asks for n = 2.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l5_fake import breaks, finds
from l7_async_fake import Workload, run
from l5_scheduler.request import RequestStatus
from l5_scheduler.scheduler import Scheduler
from l7_fast.step import OverlappedStep


@st.composite
def workloads(draw, max_requests=8):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    budget = draw(st.integers(1, 48))
    reqs = draw(st.lists(st.tuples(st.sampled_from([0, 0, 1]), st.integers(0, 60), st.integers(0, 20),
                                   st.integers(1, 40), st.integers(0, 15)), min_size=1, max_size=max_requests))
    aborts = draw(st.lists(st.tuples(st.integers(0, max_requests - 1), st.integers(0, 40)), max_size=2))
    return Workload(block_size, draw(st.integers(2, 64)), budget, draw(st.integers(1, min(budget, 6))), reqs,
                    aborts=aborts)


@pytest.mark.fuzz
@given(workloads())
def test_l7_async_fuzz_outputs_equal_solo_and_no_request_runs_past_its_end(w):
    run(w)   # every invariant at once


PINNED = Workload(4, 20, 16, 4, [(0, 40, 3, 30, 0), (0, 40, 5, 40, 0), (0, 30, 0, 16, 2), (1, 20, 3, 25, 4),
                                 (2, 9, 2, 35, 5)], aborts=[(0, 10)])


def test_l7_async_pinned_workload_really_stops_preempts_shares_and_aborts():
    s = run(PINNED)
    assert s["stops"] > 0 and s["preemptions"] > 0 and s["hits"] > 0 and s["aborted"] == 1, s


def test_l7_async_and_plain_order_give_the_same_outputs_on_the_pinned_workload():
    assert run(PINNED, step_cls=None)["stops"] == run(PINNED)["stops"]


# ---- every invariant can fail: planted bugs --------------------------------------------------
class IgnoresPending(OverlappedStep):   # counts a request's last token (by length) while it is being sampled
    @staticmethod
    def counts(req):
        return True


class StoppedStaysRunning(Scheduler):   # a stopped request still looks running: its next row is not dropped
    def finish(self, req, finish_reason, stop_reason=None):
        super().finish(req, finish_reason, stop_reason)
        req.status = RequestStatus.RUNNING


PLANTED = [
    ("a request is never scheduled past its last token (one wasted position after a stop)",
     dict(step_cls=IgnoresPending)),
    ("outputs equal the solo run, however chunked, preempted, prefix-hit or aborted beside",
     dict(scheduler_cls=StoppedStaysRunning)),
]


@pytest.mark.parametrize("invariant,plant", PLANTED, ids=["ignores-pending", "stopped-stays-running"])
def test_l7_async_each_planted_bug_breaks_its_invariant_on_the_pinned_workload(invariant, plant):
    assert breaks(invariant, lambda w: run(w, **plant), PINNED)


@pytest.mark.deep
@pytest.mark.fuzz
@pytest.mark.parametrize("invariant,plant", PLANTED, ids=["ignores-pending", "stopped-stays-running"])
def test_l7_async_search_finds_each_planted_bug_from_scratch(invariant, plant):
    assert finds(invariant, lambda w: run(w, **plant), workloads())


# ---- the tiny model through stage 7's engine ----------------------------------------------------
PROMPTS = [[(7 * j + 11 * i) % 240 + 5 for j in range(6 + 9 * i)] for i in range(6)]


def _serve(model, params, on: bool, fused: bool = False):
    """Every request's (tokens, finish reason, cumulative logprob), and the preemptions, in a pool
    small enough to preempt and a budget small enough to chunk."""
    from l5_scheduler.config import make_config
    from l7_fast import build_engine
    p = next(model.parameters())
    cfg = make_config(model.cfg, str(p.device), p.dtype, block_size=4, num_gpu_blocks_override=16,
                      max_num_batched_tokens=16)
    e = build_engine(model, None, cfg, impl="torch", async_scheduling=on, fused_ops=fused)
    assert isinstance(e.step_order, OverlappedStep) == on
    ids = [e.add_request({"prompt_token_ids": pr}, sp) for pr, sp in zip(PROMPTS, params)]
    while e.has_unfinished_requests():
        e.step()
    assert e.scheduler.kv.num_free == e.scheduler.kv.num_blocks      # every block back (free or cached)
    outs = [e.output(i) for i in ids]
    return [(c.token_ids, c.finish_reason, c.cumulative_logprob) for o in outs for c in o.outputs], \
        sum(o.num_preemptions for o in outs)


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.deep)], ids=["torch-ops", "fused-ops"])
def test_l7_async_scheduling_gives_the_plain_orders_tokens_on_the_tiny_model(tiny, fused):
    from l4_sampler.params import SamplingParams
    model, _ = tiny("qwen3")
    greedy = SamplingParams(temperature=0, max_tokens=10)
    stop_at = _serve(model, [greedy], False)[0][0][0][3]       # request 0's 4th token: a stop id that fires
    params = [SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_at]), greedy,
              SamplingParams(temperature=0, max_tokens=10, logprobs=2),
              SamplingParams(temperature=0.9, seed=3, max_tokens=8, presence_penalty=0.5),
              SamplingParams(temperature=1.0, seed=5, max_tokens=6, n=2),
              SamplingParams(temperature=0, max_tokens=1)]
    (plain, pre0), (overlapped, pre1) = _serve(model, params, False, fused), _serve(model, params, True, fused)
    assert [c[:2] for c in overlapped] == [c[:2] for c in plain]
    assert plain[0][1] == "stop" and len(plain[0][0]) == 4 and pre0 > 0 and pre1 > 0
    lps = [(a[2], b[2]) for a, b in zip(overlapped, plain) if a[2] is not None]
    assert lps and all(abs(a - b) < 1e-4 for a, b in lps)


def test_l7_async_scheduling_with_a_drafter_is_refused_and_off_by_default_there():
    from l11_spec_decode import LLM
    from plumbing.errors import UserError
    spec = dict(method="ngram", num_speculative_tokens=2, prompt_lookup_max=3)
    kw = dict(impl="torch", fused_ops=False, num_gpu_blocks_override=64)    # (a small pool: three fit a GPU too)
    with pytest.raises(UserError, match="async_scheduling=True cannot run with speculative_config"):
        LLM(None, async_scheduling=True, speculative_config=spec, **kw)
    assert not isinstance(LLM(None, speculative_config=spec, **kw).llm_engine.step_order, OverlappedStep)
    assert isinstance(LLM(None, **kw).llm_engine.step_order, OverlappedStep)  # stage 7's default, no drafter
