"""Stage 7's host fast path (l7_fast/host.py) decides exactly what stages 5 and 6 decide.

1. Lockstep: stage 6's scheduler (and stage 5's) and the steady-decode one run the same random
   workloads side by side (shared prefixes, chunking, preemption, eviction); after every schedule
   and every advance the two must agree on everything observable: the pairs, sample and prefill
   flags, preemptions, admissions, prefix hits, every request's blocks and slots, the free count.
   Planted bugs in the fast path are found by the same driver.
2. Stage 5 and 6's fuzz invariants hold for the steady schedulers (tests/l5_fake.py, l6_fake.py).
3. The stop filter is sound: whenever a StopChecker would finish a request, the filter let it ask.
4. The engine: tokens, finish and stop reasons, and every step's stats are the same with the fast
   path on and off, through stop ids, stop strings, min_tokens, logprobs, sampling, preemption and
   prefix hits; the fast path really ran; the incremental table stays right (check=True).
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

import l5_fake
import l6_fake
from test_l5_fuzz import workloads as l5_workloads
from test_l6_fuzz import workloads as l6_workloads
from l4_sampler.params import SamplingParams
from l4_sampler.stops import StopChecker
from l5_fake import EOS, Violation, finds, next_token
from l5_scheduler.request import Request
from l5_scheduler.scheduler import Scheduler
from l6_prefix_cache.scheduler import PrefixCachingScheduler
from l7_fast.host import SteadyPrefixCachingScheduler, SteadyScheduler, attach_stop_facts

PAIRS = {"stage 6": (PrefixCachingScheduler, SteadyPrefixCachingScheduler), "stage 5": (Scheduler, SteadyScheduler)}
FAST_STEPS = {"stage 6": 0, "stage 5": 0}          # steps the one-pass path took (must be > 0)
LOCKSTEP_RUNS = {"stage 6": 0, "stage 5": 0}       # workloads the property test ran


def _view(sched, out):
    """Everything a step's caller can observe, by request id."""
    ids = lambda reqs: [r.request_id for r in reqs]   # noqa: E731
    reqs = {r.request_id: r for r in list(sched.running) + list(sched.waiting)}
    return dict(pairs=[(r.request_id, n) for r, n in out.scheduled], sample=list(out.sample),
                prefill=list(out.prefill), preempted=ids(out.preempted), admitted=ids(out.admitted),
                hits=dict(getattr(sched, "hits", {})), free=sched.alloc.num_free,
                cached=sorted(b.block_id for b in sched.alloc.pool.cached.values()) if hasattr(sched.alloc, "pool") else [],
                running=ids(sched.running), waiting=ids(sched.waiting),
                kv={rid: (r.kv.blocks[:], r.kv.cur_len) for rid, r in reqs.items()})


def _same_slots(ref, fast) -> str | None:
    """Stage 2 hands out slots token by token, the fast allocator a block at a time: the fast list
    must start with the reference one (and cover the blocks held)."""
    for r in list(ref.running) + list(ref.waiting):
        f = next(x for x in list(fast.running) + list(fast.waiting) if x.request_id == r.request_id)
        a, b = r.kv.slot_indices, f.kv.slot_indices
        if b[:len(a)] != a or len(b) != len(f.kv.blocks) * fast.alloc.block_size:
            return f"{r.request_id}: slots {a[:40]} vs {b[:40]}"
    return None


def lockstep(w, ref_cls, fast_cls, max_steps=20_000):
    """Run workload ``w`` (an l6_fake.Workload) on both schedulers; Violation on the first difference."""
    a = ref_cls(w.num_blocks, w.block_size, w.budget, w.max_num_seqs)
    b = fast_cls(w.num_blocks, w.block_size, w.budget, w.max_num_seqs)
    pending = sorted(((arr, i, d, s, o, m) for i, (d, s, o, m, arr) in enumerate(w.requests)), key=lambda x: x[:2])
    step = 0
    while pending or a.has_unfinished():
        while pending and pending[0][0] <= step:
            _, i, d, s, o, mt = pending.pop(0)
            prompt = l6_fake.prompt_of(i, d, s, o)
            if len(prompt) + mt > w.block_size * w.num_blocks:
                continue                                          # rejected at add by both
            for sched in (a, b):
                sched.add(Request(f"r{i}", prompt, SamplingParams(max_tokens=mt), arrival=i))
        if not a.has_unfinished():
            step += 1
            continue
        if step > max_steps:
            raise Violation("the fast scheduler decides as stage 6's", "no progress")
        outs = a.schedule(), b.schedule()
        for when in ("schedule", "advance"):
            if when == "advance":
                a.advance(outs[0])
                b.advance(outs[1])
            va, vb = _view(a, outs[0]), _view(b, outs[1])
            slots = _same_slots(a, b)
            if slots:
                raise Violation("the fast scheduler decides as stage 6's", f"step {step}, after {when}: {slots}")
            if va != vb:
                k = next(k for k in va if va[k] != vb[k])
                raise Violation("the fast scheduler decides as stage 6's",
                                f"step {step}, after {when}: {k} differ: {str(va[k])[:200]} != {str(vb[k])[:200]}")
        for sched, out in zip((a, b), outs):                     # the same fake tokens for both
            for (req, _), sample in zip(out.scheduled, out.sample):
                if sample:
                    req.output_ids.append(next_token(req.prompt_ids + req.output_ids))
                    if req.output_ids[-1] == EOS or len(req.output_ids) == req.params.max_tokens:
                        sched.finish(req, "stop")
        step += 1
    return b.steady_steps


@pytest.mark.parametrize("stage", list(PAIRS))
@given(w=l6_workloads())
def test_l7_steady_scheduler_decides_exactly_as_the_stage_it_speeds_up(stage, w):
    FAST_STEPS[stage] += lockstep(w, *PAIRS[stage])
    LOCKSTEP_RUNS[stage] += 1


SMALL = l6_fake.Workload(2, 12, 8, 3, [(0, 10, 3, 10, 0), (0, 10, 5, 8, 0), (0, 10, 0, 6, 2), (0, 12, 0, 5, 3)])
CHUNKED = l6_fake.Workload(4, 16, 4, 4, [(1, 0, 4, 12, 0), (2, 0, 12, 6, 3), (0, 8, 2, 12, 1)])


def test_l7_lockstep_workloads_really_take_the_fast_path_and_preempt():
    assert lockstep(SMALL, *PAIRS["stage 6"]) > 0 and lockstep(CHUNKED, *PAIRS["stage 6"]) > 0
    s = l6_fake.run(SMALL, SteadyPrefixCachingScheduler)
    assert s["preemptions"] > 0 and s["hits"] > 0


# ---- planted bugs in the fast path: the lockstep driver must find each -------------------------
class SkipsFullBlocks(SteadyPrefixCachingScheduler):      # forgets that a full block needs a new one
    def _schedule_running(self, out, budget):
        reserve, self.alloc.reserve = self.alloc.reserve, (lambda kv, n: None) if self.steady else self.alloc.reserve
        try:
            return super()._schedule_running(out, budget)
        finally:
            self.alloc.reserve = reserve


class NoFreeCheck(SteadyPrefixCachingScheduler):         # takes the one pass even when it must preempt
    def _schedule_running(self, out, budget):
        if self.steady and len(self.running) <= budget:
            free = type(self.alloc).num_free
            type(self.alloc).num_free = property(lambda s: 10**9)
            try:
                return super()._schedule_running(out, budget)
            except Exception:
                raise Violation("the fast scheduler decides as stage 6's", "crashed") from None
            finally:
                type(self.alloc).num_free = free
        return super()._schedule_running(out, budget)


class StaysSteady(SteadyPrefixCachingScheduler):         # never leaves the fast path once on it
    def advance(self, out):
        was = self.steady
        super().advance(out)
        self.steady = self.steady or was


class ForgetsFilledBlocks(SteadyPrefixCachingScheduler):  # a decode that fills a block never caches it
    def _blocks_filled(self, reqs):
        pass


# Steady decodes that outgrow the pool: the one pass must hand over to stage 5's loop to preempt.
SHORT = l6_fake.Workload(2, 7, 16, 3, [(0, 0, 2, 8, 0), (1, 0, 2, 8, 0), (2, 0, 2, 8, 0)])


@pytest.mark.parametrize("bug,w", [(StaysSteady, CHUNKED), (SkipsFullBlocks, CHUNKED), (ForgetsFilledBlocks, CHUNKED),
                                   (NoFreeCheck, SHORT)], ids=lambda x: getattr(x, "__name__", ""))
def test_l7_lockstep_passes_the_real_fast_path_where_a_bug_fails(bug, w):
    """Ordinary workloads (a chunked prompt admitted beside steady decodes; steady decodes that
    must preempt): the real fast path passes them, each planted bug fails."""
    assert lockstep(w, *PAIRS["stage 6"]) > 0
    with pytest.raises(Violation):
        lockstep(w, PrefixCachingScheduler, bug)
    if w is SHORT:
        assert l6_fake.run(w, SteadyPrefixCachingScheduler)["preemptions"] > 0


# ---- stage 5 and 6's invariants on the steady schedulers ---------------------------------------
@given(w=l5_workloads())
def test_l7_steady_scheduler_keeps_stage5_invariants(w):
    l5_fake.run(w, SteadyScheduler)


@given(w=l6_workloads())
def test_l7_steady_scheduler_keeps_stage6_cache_invariants(w):
    l6_fake.run(w, SteadyPrefixCachingScheduler)


def test_l7_lockstep_fast_path_was_exercised():
    """Runs after the property tests in this file (pytest keeps file order): both pairs took the
    one-pass path on some steps, so the equality above is not vacuous."""
    if not all(LOCKSTEP_RUNS.values()):
        pytest.skip("run with the lockstep property tests (same file) to count their fast steps")
    assert all(n > 0 for n in FAST_STEPS.values()), (FAST_STEPS, LOCKSTEP_RUNS)


# ---- the stop filter ---------------------------------------------------------------------------
EOS_IDS = (7, 8)


STOP_CASES = dict(max_tokens=st.integers(1, 12), min_tokens=st.integers(0, 12), ignore_eos=st.booleans(),
                  stop_ids=st.lists(st.integers(0, 9), max_size=3), prompt_len=st.integers(1, 20),
                  tokens=st.lists(st.integers(0, 9), min_size=12, max_size=12))


def _filter_misses(facts, max_tokens, min_tokens, ignore_eos, stop_ids, prompt_len, tokens):
    """The first token a StopChecker finishes on that the filter would not let through, else None."""
    params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens), ignore_eos=ignore_eos,
                            stop_token_ids=stop_ids)
    max_model_len = prompt_len + 8                           # the context limit binds sometimes
    req = Request("r", [1] * prompt_len, params, arrival=0)
    facts(req, EOS_IDS, max_model_len)
    checker = StopChecker(params, prompt_len, max_model_len, EOS_IDS)
    for tok in tokens:
        req.output_ids.append(tok)
        let_through = tok in req.stop_ids or len(req.output_ids) >= req.stop_len
        fin = checker.update(req.output_ids)
        if fin is not None:
            return None if let_through else (tok, list(req.output_ids), fin.label)
    return None


@given(**STOP_CASES)
def test_l7_stop_filter_lets_every_finishing_token_through(**case):
    """A StopChecker finishes a request only on a token the filter lets through:
    ``tok in stop_ids or len(output) >= stop_len``; skipping it otherwise changes nothing."""
    assert _filter_misses(attach_stop_facts, **case) is None


def test_l7_stop_filter_property_finds_a_filter_that_forgets_the_context():
    from hypothesis import find, settings

    def forgets_context(req, eos, max_model_len):
        attach_stop_facts(req, eos, max_model_len)
        req.stop_len = req.params.max_tokens
    case = find(st.fixed_dictionaries(STOP_CASES), lambda c: _filter_misses(forgets_context, **c) is not None,
                settings=settings(max_examples=2000, derandomize=True, database=None))
    assert "context full" in _filter_misses(forgets_context, **case)[2]


def test_l7_stop_facts():
    r = Request("r", [1, 2, 3], SamplingParams(max_tokens=10, stop_token_ids=[5]), arrival=0)
    attach_stop_facts(r, EOS_IDS, 8)
    assert r.stop_ids == {5, 7, 8} and r.stop_len == 5 and r.plain_greedy is False     # temperature 1.0
    g = Request("g", [1], SamplingParams(temperature=0, ignore_eos=True, max_tokens=4), arrival=0)
    attach_stop_facts(g, EOS_IDS, 100)
    assert g.stop_ids == set() and g.stop_len == 4 and g.plain_greedy is True
    s = Request("s", [1], SamplingParams(temperature=0, stop=["ab"]), arrival=0)
    attach_stop_facts(s, EOS_IDS, 100)
    assert s.stop_len == 0                                    # stop strings: asked every step
    for kw in (dict(min_tokens=2), dict(logprobs=1), dict(repetition_penalty=1.1)):
        p = Request("p", [1], SamplingParams(temperature=0, **kw), arrival=0)
        attach_stop_facts(p, EOS_IDS, 100)
        assert p.plain_greedy is False, kw


# ---- the engine ----------------------------------------------------------------------------------
SYSTEM = [(7 * j + (j * j) % 11) % 240 + 5 for j in range(40)]


def _own(n, salt):
    return [(salt * 41 + 13 * j) % 240 + 5 for j in range(n)]


def test_l7_host_fast_path_changes_nothing_a_step_computes(tiny, monkeypatch):
    """The same requests through the l7 engine with the host fast path on and off: identical tokens,
    finish and stop reasons, logprobs and per-step stats (every field), on a workload with every
    kind of row; and the fast paths really ran (one-pass steps, argmax-only batches)."""
    from l1_dense.checkpoint import load_tokenizer
    from l5_scheduler.config import make_config
    from l7_fast.engine import LLMEngine
    greedy_calls = []
    real_argmax = LLMEngine._argmax_ids
    monkeypatch.setattr(LLMEngine, "_argmax_ids", lambda self, *a: greedy_calls.append(1) or real_argmax(self, *a))
    model, path = tiny("qwen3")
    tok = load_tokenizer(path)
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=11,
                      max_num_batched_tokens=24, max_num_seqs=6)

    def serve(fast, params):
        e = LLMEngine(model, tok, cfg, impl="torch", fused_ops=False, check=True, host_fast_path=fast)
        ids = [e.add_request({"prompt_token_ids": SYSTEM[:24] + _own(3 + i % 4, i)}, p, request_id=f"q{i}")
               for i, p in enumerate(params)]
        while e.has_unfinished_requests():
            e.step()
        outs = [e.output(i).outputs[0] for i in ids]
        return e, [(o.token_ids, o.finish_reason, o.stop_reason, o.text,
                    [(lp.token_id, round(lp.logprob, 5)) for lp in o.logprobs] if o.logprobs else None) for o in outs]

    free = SamplingParams(temperature=0, max_tokens=10)
    _, plain = serve(True, [free] * 8)            # the same batch: until a stop fires, the same tokens
    out0, text1 = plain[0][0], plain[1][3]
    k = next(i for i in range(2, len(out0)) if out0[i] not in out0[:i])               # a token new at k
    stop = next(text1[i:i + 2] for i in range(3, len(text1) - 2)
                if text1[i:i + 2].isprintable() and text1[i:i + 2].strip())
    params = [SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[out0[k]]),   # stops at k + 1
              SamplingParams(temperature=0, max_tokens=10, stop=[stop]),                 # stop string
              SamplingParams(temperature=0, max_tokens=10, min_tokens=6, stop_token_ids=[plain[2][0][2]]),
              SamplingParams(temperature=0, max_tokens=7, logprobs=2),
              SamplingParams(temperature=0.9, seed=5, max_tokens=9),
              free, free, free]
    greedy_calls.clear()
    on, got = serve(True, params)
    fast_batches = len(greedy_calls)
    off, want = serve(False, params)
    assert got == want
    assert [vars(s) for s in on.stats] == [vars(s) for s in off.stats]
    assert fast_batches > 0 and len(greedy_calls) == fast_batches   # argmax-only batches, with the path on only
    assert got[0][1:3] == ("stop", out0[k]) and got[0][0] == out0[:k + 1]
    assert got[1][1:3] == ("stop", stop)
    assert on.scheduler.steady_steps > 0 and off.scheduler.__class__.__name__ == "PrefixCachingScheduler"
    assert sum(len(s.preempted) for s in on.stats) > 0, "the workload must preempt"
    assert on.scheduler.stats.hits > 0, "the workload must hit the prefix cache"


def test_l7_host_fast_path_plain_greedy_batch_samples_with_one_argmax(tiny, monkeypatch):
    """A batch of plain greedy rows never enters stage 4's sampler, and the StopChecker runs only on
    the tokens that can stop a request (here: the last, at max_tokens)."""
    from l4_sampler.sampler import Sampler
    from l5_scheduler.config import make_config
    from l7_fast.engine import LLMEngine
    model, _ = tiny("qwen3")
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=40,
                      max_num_batched_tokens=64, max_num_seqs=4)
    calls = {"sampler": 0, "update": 0}
    real_call, real_update = Sampler.__call__, StopChecker.update

    def counted_call(self, *a, **k):
        calls["sampler"] += 1
        return real_call(self, *a, **k)

    def counted_update(self, *a, **k):
        calls["update"] += 1
        return real_update(self, *a, **k)
    monkeypatch.setattr(Sampler, "__call__", counted_call)
    monkeypatch.setattr(StopChecker, "update", counted_update)
    e = LLMEngine(model, None, cfg, impl="torch", fused_ops=False)
    for i in range(4):
        e.add_request({"prompt_token_ids": _own(9, i)}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=6))
    while e.has_unfinished_requests():
        e.step()
    assert calls == {"sampler": 0, "update": 4}               # one update per request: its 6th token
    assert all(len(r.output_ids) == 6 for r in e.requests.values())
