"""The sampler's and the stop check's cheap branches decide exactly what the plain code decides,
alone and inside the engine (lessons/l7_fast/5_host_branches.md; the scheduler's and KV manager's:
tests/test_l7_host.py).

The sampler takes one argmax when every row is plain greedy; a StopChecker is asked only about a
token that could end its request. harness/plain_parts.py has the same parts without the branches.

1. The stop pre-check is sound: whenever a StopChecker finishes a request, the pre-check let it ask.
2. The sampler's all-greedy branch gives the pipeline's ids.
3. The engine with the real parts and with the plain ones: the same tokens, finish and stop
   reasons, logprobs and per-step stats; and the branches really ran.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from l4_sampler.params import SamplingParams
from l4_sampler.sampler import RowState, Sampler
from l4_sampler.stops import StopChecker
from harness.plain_parts import PlainKVCacheManager, PlainSampler, PlainScheduler, plain_stops


# ---- the stop pre-check --------------------------------------------------------------------------
EOS_IDS = (7, 8)
STOP_CASES = dict(max_tokens=st.integers(1, 12), min_tokens=st.integers(0, 12), ignore_eos=st.booleans(),
                  stop_ids=st.lists(st.integers(0, 9), max_size=3), prompt_len=st.integers(1, 20),
                  tokens=st.lists(st.integers(0, 9), min_size=12, max_size=12))


def _precheck_misses(max_tokens, min_tokens, ignore_eos, stop_ids, prompt_len, tokens, patch=None):
    """The first token a StopChecker finishes on that the pre-check would not have asked about, else None."""
    params = SamplingParams(max_tokens=max_tokens, min_tokens=min(min_tokens, max_tokens), ignore_eos=ignore_eos,
                            stop_token_ids=stop_ids)
    max_model_len = prompt_len + 8                           # the context limit binds sometimes
    checker = StopChecker(params, prompt_len, max_model_len, EOS_IDS)
    if patch:
        patch(checker)
    out = []
    for tok in tokens:
        out.append(tok)
        asked = tok in checker.stop_ids or prompt_len + len(out) >= checker.stop_len
        fin = checker.update(out)
        if fin is not None:
            return None if asked else (tok, list(out), fin.label)
    return None


@pytest.mark.fuzz
@given(**STOP_CASES)
def test_l7_stop_precheck_asks_about_every_finishing_token(**case):
    assert _precheck_misses(**case) is None


def _forgets_context(checker):                                # planted: the pre-check without the context limit
    checker.stop_len = checker.prompt_len + checker.params.max_tokens


# What the search below found (make test-deep), already shrunk.
PINNED_STOP = dict(max_tokens=9, min_tokens=0, ignore_eos=False, stop_ids=[], prompt_len=1, tokens=[0] * 12)


def test_l7_stop_precheck_pinned_case_catches_a_precheck_that_forgets_the_context():
    assert _precheck_misses(**PINNED_STOP) is None
    assert "context full" in _precheck_misses(**PINNED_STOP, patch=_forgets_context)[2]


@pytest.mark.deep
def test_l7_stop_precheck_search_finds_a_precheck_that_forgets_the_context():
    from hypothesis import find, settings
    case = find(st.fixed_dictionaries(STOP_CASES), lambda c: _precheck_misses(**c, patch=_forgets_context) is not None,
                settings=settings(max_examples=2000, derandomize=True, database=None))
    assert "context full" in _precheck_misses(**case, patch=_forgets_context)[2]


def test_l7_stop_precheck_facts():
    c = StopChecker(SamplingParams(max_tokens=10, stop_token_ids=[5]), 3, 8, EOS_IDS)
    assert c.stop_ids == {5, 7, 8} and c.stop_len == 8                  # the context: 3 + 5
    c = StopChecker(SamplingParams(ignore_eos=True, max_tokens=4), 1, 100, EOS_IDS)
    assert c.stop_ids == set() and c.stop_len == 5                      # max_tokens: 1 + 4
    c = StopChecker(SamplingParams(stop=["ab"]), 1, 100, EOS_IDS, decode=lambda ids: "")
    assert c.stop_len == 0                                    # stop strings: asked every step


# ---- the sampler's all-greedy branch -------------------------------------------------------------
@pytest.mark.fuzz
@given(st.lists(st.lists(st.integers(-3, 3), min_size=9, max_size=9), min_size=1, max_size=5))
def test_l7_all_greedy_branch_gives_the_pipelines_ids(rows):
    logits = torch.tensor(rows, dtype=torch.float32)          # small integers: ties everywhere
    params = SamplingParams(temperature=0)
    fast = Sampler()(logits, [RowState(params, [1], []) for _ in rows])
    plain = PlainSampler()(logits, [RowState(params, [1], []) for _ in rows])
    assert fast.token_ids_list == plain.token_ids_list


def test_l7_all_greedy_branch_only_for_rows_it_cannot_change(monkeypatch):
    """min_tokens masks EOS before the argmax: such a row is not plain. A branch that forgets it
    (planted) samples EOS where the pipeline does not."""
    logits = torch.tensor([[0.0, 1.0, 5.0]])                  # EOS (2) is the argmax
    row = lambda: RowState(SamplingParams(temperature=0, min_tokens=2, max_tokens=4), [1], [], (2,))  # noqa: E731
    assert row().plain_greedy is False and Sampler()(logits, [row()]).token_ids_list == [1]
    real = RowState.__post_init__

    def forgets_min_tokens(self):
        real(self)
        self.plain_greedy = self.params.greedy and not self.params.has_penalties and self.params.logprobs is None
    monkeypatch.setattr(RowState, "__post_init__", forgets_min_tokens)
    assert Sampler()(logits, [row()]).token_ids_list == [2]


# ---- the engine ----------------------------------------------------------------------------------
SYSTEM = [(7 * j + (j * j) % 11) % 240 + 5 for j in range(40)]


def _own(n, salt):
    return [(salt * 41 + 13 * j) % 240 + 5 for j in range(n)]


def _engines(model, tok, cfg):
    """(real, plain): stage 7's builder, and the engine loop given the plain parts by hand."""
    from l1_dense.model import TorchOps
    from l5_scheduler.engine import LLMEngine
    from l7_fast import build_engine
    from l7_fast.cache import FastKVCache
    from l7_fast.runner import FastRunner
    real = build_engine(model, tok, cfg, impl="torch", fused_ops=False, check=True, async_scheduling=False)  # stats per step
    sched = PlainScheduler(PlainKVCacheManager(cfg.num_blocks, cfg.block_size), cfg.max_num_batched_tokens,
                           cfg.max_num_seqs)
    p = next(model.parameters())
    cache = FastKVCache(model.cfg, cfg.num_blocks, cfg.block_size, p.device, p.dtype, impl="torch")
    plain = LLMEngine(model, tok, cfg, scheduler=sched, sampler=PlainSampler(),
                      runner=FastRunner(model, cfg, TorchOps(), cache=cache, check=True))
    return real, plain


def _serve(e, params, plain=False):
    ids = []
    for i, p in enumerate(params):
        req = e.make_request({"prompt_token_ids": SYSTEM[:24] + _own(3 + i % 4, i)}, p, request_id=f"q{i}")
        if plain:
            plain_stops(req)
        ids.append(e.add(req))
    while e.has_unfinished_requests():
        e.step()
    outs = [e.output(i).outputs[0] for i in ids]
    return [(o.token_ids, o.finish_reason, o.stop_reason, o.text,
             [(t, round(d[t].logprob, 5)) for t, d in zip(o.token_ids, o.logprobs)] if o.logprobs else None)
            for o in outs]


def _count_pipeline_and_stop_calls(monkeypatch) -> dict:
    """Counts, from now on, the sampler's full pipeline (its ``_check``) and ``StopChecker.update``."""
    import l4_sampler.sampler as sampler_mod
    calls = {"pipeline": 0, "update": 0}
    real_check, real_update = sampler_mod._check, StopChecker.update
    monkeypatch.setattr(sampler_mod, "_check", lambda *a: calls.__setitem__("pipeline", calls["pipeline"] + 1)
                        or real_check(*a))
    monkeypatch.setattr(StopChecker, "update", lambda self, ids: calls.__setitem__("update", calls["update"] + 1)
                        or real_update(self, ids))
    return calls


def test_l7_cheap_branches_change_nothing_a_step_computes(tiny, monkeypatch):
    """The same requests through the real parts and the plain ones: identical tokens, finish and stop
    reasons, logprobs and per-step stats (every field), on a workload with every kind of row (stop
    ids, stop strings, min_tokens, logprobs, seeded sampling) that preempts and hits the prefix
    cache; and the real engine took its branches (argmax-only batches, StopCheckers skipped)."""
    from l1_dense.checkpoint import load_tokenizer
    from l5_scheduler.config import make_config
    model, path = tiny("qwen3")
    tok = load_tokenizer(path)
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=11,
                      max_num_batched_tokens=24, max_num_seqs=6)
    free = SamplingParams(temperature=0, max_tokens=10)
    plain0 = _serve(_engines(model, tok, cfg)[0], [free] * 8)   # the same batch: until a stop fires, the same tokens
    out0, text1 = plain0[0][0], plain0[1][3]
    k = next(i for i in range(2, len(out0)) if out0[i] not in out0[:i])               # a token new at k
    stop = next(text1[i:i + 2] for i in range(3, len(text1) - 2)
                if text1[i:i + 2].isprintable() and text1[i:i + 2].strip())
    params = [SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[out0[k]]),   # stops at k + 1
              SamplingParams(temperature=0, max_tokens=10, stop=[stop]),                 # stop string
              SamplingParams(temperature=0, max_tokens=10, min_tokens=6, stop_token_ids=[plain0[2][0][2]]),
              SamplingParams(temperature=0, max_tokens=7, logprobs=2),
              SamplingParams(temperature=0.9, seed=5, max_tokens=9),
              free, free, free]
    calls = _count_pipeline_and_stop_calls(monkeypatch)
    real, plain = _engines(model, tok, cfg)
    got = _serve(real, params)
    real_calls = dict(calls)
    want = _serve(plain, params, plain=True)
    assert got == want
    when = lambda s: {k: v for k, v in vars(s).items() if k != "t"}      # noqa: E731  (t: the host's clock)
    assert [when(s) for s in real.stats] == [when(s) for s in plain.stats]
    sampled = sum(s.sampled for s in real.stats)
    real_batches = sum(1 for s in real.stats if s.sampled)
    assert real_calls["pipeline"] < real_batches, "some batch must have taken the all-greedy branch"
    assert real_calls["update"] < sampled, "some StopChecker must have been skipped"
    assert got[0][1:3] == ("stop", out0[k]) and got[0][0] == out0[:k + 1]
    assert got[1][1:3] == ("stop", stop)
    assert sum(len(s.preempted) for s in real.stats) > 0, "the workload must preempt"
    assert real.scheduler.kv.stats.hits > 0, "the workload must hit the prefix cache"


def test_l7_plain_greedy_batch_never_enters_the_pipeline(tiny, monkeypatch):
    """A batch of plain greedy rows takes the sampler's argmax branch, and the StopChecker runs only on
    the tokens that can stop a request (here: the last, at max_tokens)."""
    from l5_scheduler.config import make_config
    from l7_fast import build_engine
    model, _ = tiny("qwen3")
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=40,
                      max_num_batched_tokens=64, max_num_seqs=4)
    calls = _count_pipeline_and_stop_calls(monkeypatch)
    e = build_engine(model, None, cfg, impl="torch", fused_ops=False)
    for i in range(4):
        e.add_request({"prompt_token_ids": _own(9, i)}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=6))
    while e.has_unfinished_requests():
        e.step()
    assert calls == {"pipeline": 0, "update": 4}              # one update per request: its 6th token
    assert all(len(r.output_ids) == 6 for r in e.requests.values())
