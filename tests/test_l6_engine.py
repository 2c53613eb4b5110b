"""Stage 6 on the tiny checkpoints (float32): with prefix caching on, every request's tokens equal
its tokens with the cache off (= stage 5, which tests/test_l5_engine.py ties to stage 4 and to
Hugging Face), exactly, greedy and seeded, however the prompts share, and through the four named
regressions of the peers' bug trackers. Each test also asserts that the cache really hit, so none
of them can pass over a cache that did nothing."""
import pytest

from l4_sampler.params import SamplingParams
from l5_scheduler.config import make_config
from l5_scheduler.kv_manager import BlockManager
from l6_prefix_cache import LLM, build_engine
from l6_prefix_cache.hashing import longest_cached_prefix
from l6_prefix_cache.kv_manager import KVCacheManager
from l4_sampler.sampler import Sampler
from l5_scheduler.engine import LLMEngine
from l5_scheduler.runner import ModelRunner
from l5_scheduler.scheduler import Scheduler
from l6_smoke import main as l6_main

SYSTEM = [(7 * j + (j * j) % 11) % 240 + 5 for j in range(70)]     # a shared "system prompt", bytes


def _own(n, salt):
    return [(salt * 41 + 13 * j) % 240 + 5 for j in range(n)]


def _engine(model, caching=True, block_size=8, num_blocks=64, budget=64, seqs=None, impl="torch", kv_cls=None):
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=block_size,
                      num_gpu_blocks_override=num_blocks, max_num_batched_tokens=budget, max_num_seqs=seqs)
    kv = kv_cls(cfg.num_blocks, cfg.block_size) if kv_cls is not None else None
    return build_engine(model, None, cfg, enable_prefix_caching=caching, impl=impl, check=True,
                        parts={"kv_manager": kv} if kv is not None else None)


def _serve(e, batch, arrivals=None):
    """batch: [(prompt, params)]; arrivals: the step at which each is added (default all at 0)."""
    arrivals = arrivals or [0] * len(batch)
    ids, step = [None] * len(batch), 0
    while step <= max(arrivals) or e.has_unfinished_requests():
        for i, a in enumerate(arrivals):
            if a == step:
                ids[i] = e.add_request({"prompt_token_ids": batch[i][0]}, batch[i][1], request_id=f"q{i}")
        if e.has_unfinished_requests():
            e.step()
        step += 1
    return [e.requests[i].output_ids for i in ids]


def _hits(e) -> dict:
    out = {}
    for s in e.stats:
        for r, n in s.hits:
            out.setdefault(r, []).append(n)
    return out


def _same_with_and_without(model, batch, arrivals=None, **kw):
    """The cache on, the cache off (the same part, nothing hashed) and stage 5 (stage 2's allocator):
    the same tokens."""
    on, off = _engine(model, True, **kw), _engine(model, False, **kw)
    five = _engine(model, False, kv_cls=BlockManager, **kw)
    assert type(on.scheduler.kv) is type(off.scheduler.kv) is KVCacheManager and type(five.scheduler.kv) is BlockManager
    got, want, plain = _serve(on, batch, arrivals), _serve(off, batch, arrivals), _serve(five, batch, arrivals)
    assert got == want == plain
    assert not off.scheduler.kv.pool.cached and off.scheduler.kv.stats.hits == 0      # off: nothing named
    return on


GREEDY = SamplingParams(temperature=0, max_tokens=6)
SCENARIOS = {
    "shared system prompt": [(SYSTEM + _own(9, i), GREEDY) for i in range(4)],
    "identical prompts": [(SYSTEM[:40], GREEDY)] * 3,
    "prefixes of each other": [(SYSTEM[:n], GREEDY) for n in (64, 17, 40, 70, 8)],
}


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_l6_greedy_tokens_with_the_cache_equal_tokens_without_it(tiny, family, scenario):
    model, _ = tiny(family)
    batch = SCENARIOS[scenario]
    e = _same_with_and_without(model, batch, arrivals=[0] + [2] * (len(batch) - 1))
    assert sum(sum(v) for v in _hits(e).values()) > 0, "the cache never hit"


def test_l6_seeded_sampling_with_the_cache_equals_without_it(tiny):
    model, _ = tiny("qwen3")
    batch = [(SYSTEM + _own(5, i), SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=10 + i, max_tokens=8))
             for i in range(4)]
    e = _same_with_and_without(model, batch, arrivals=[0, 2, 2, 3])
    assert sum(len(v) for v in _hits(e).values() if v[0]) >= 3


def test_l6_full_prompt_hit_still_computes_the_last_block(tiny):
    """nano-vllm #144: a prompt whose every block was cached got a zero-token prefill. The hit is
    capped one block short, so the last block is computed and its logits exist."""
    model, _ = tiny("qwen3")
    prompt = SYSTEM[:48]                                          # exactly 6 blocks of 8
    e = _same_with_and_without(model, [(prompt, GREEDY), (prompt, GREEDY)], arrivals=[0, 3])
    assert _hits(e)["q1"] == [40]                                 # 5 of 6 blocks; the 6th recomputed
    chunks = [c for s in e.stats for c in s.chunks if c[0] == "q1"]
    assert chunks == [("q1", 40, 8, 48)]


def test_l6_preemption_then_prefix_hit(tiny):
    """nano-vllm #211 and #233: preemption plus a prefix hit raised IndexError. A preempted request's
    blocks stay cached; readmitted, it finds its own blocks and recomputes only the rest."""
    model, _ = tiny("qwen3")
    batch = [(SYSTEM[:30], SamplingParams(temperature=0, max_tokens=30)),
             (_own(40, 1), SamplingParams(temperature=0, max_tokens=24))]
    e = _same_with_and_without(model, batch, num_blocks=12, budget=32)
    pre = [r for s in e.stats for r in s.preempted]
    assert pre, "nothing was preempted"
    readmit = _hits(e)[pre[0]]
    assert len(readmit) >= 2 and readmit[1] > 0, f"the readmission found nothing cached: {readmit}"
    assert e.scheduler.kv.stats.readmit_hits > 0


def test_l6_chunked_prefill_hitting_mid_prompt(tiny):
    """A hit that ends mid-prompt, then chunks whose boundaries fall inside blocks (budget 12, block 8)."""
    model, _ = tiny("qwen3")
    batch = [(SYSTEM[:24] + _own(30, 1), GREEDY), (SYSTEM[:24] + _own(36, 2), GREEDY)]
    e = _same_with_and_without(model, batch, arrivals=[0, 6], budget=12)
    assert _hits(e)["q1"] == [24]
    starts = [c[1] for s in e.stats for c in s.chunks if c[0] == "q1"]
    assert starts[0] == 24 and len(starts) >= 3 and any(st % 8 for st in starts), starts


class LookupAtAdd(Scheduler):
    """A plausible bug: look the prefix up once, when the request arrives, and use that at admission."""
    def add(self, req):
        super().add(req)
        bs = self.kv.block_size
        req._found = longest_cached_prefix(self.kv.block_hashes(req, (req.num_tokens - 1) // bs), self.kv.pool.cached,
                                           req.num_tokens, bs)


class AdmitWhatWasFound(KVCacheManager):
    def admit(self, req, budget):
        import l6_prefix_cache.kv_manager as m
        real, m.longest_cached_prefix = m.longest_cached_prefix, lambda *a: req._found
        try:
            return super().admit(req, budget)
        finally:
            m.longest_cached_prefix = real


def _lookup_at_add_engine(model, num_blocks, budget, seqs):
    """The parts by hand: the engine loop given the buggy scheduler and its KV manager."""
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=8,
                      num_gpu_blocks_override=num_blocks, max_num_batched_tokens=budget, max_num_seqs=seqs)
    sched = LookupAtAdd(AdmitWhatWasFound(cfg.num_blocks, cfg.block_size), budget, cfg.max_num_seqs)
    return LLMEngine(model, None, cfg, scheduler=sched, runner=ModelRunner(model, cfg, impl="torch"), sampler=Sampler())


def test_l6_eviction_of_a_block_another_waiting_request_found(tiny):
    """B arrives while A's prefix is cached (its lookup would hit), but waits: max_num_seqs is 1. The
    request running meanwhile evicts and rewrites those blocks. B must look up again when admitted.
    With the lookup kept from arrival (LookupAtAdd), B reads the rewritten blocks: wrong tokens."""
    model, _ = tiny("qwen3")
    params = SamplingParams(temperature=0, max_tokens=4)
    batch = [(SYSTEM[:40], params), (_own(60, 3), SamplingParams(temperature=0, max_tokens=20)), (SYSTEM[:48], params)]
    kw = dict(num_blocks=12, budget=64, seqs=1)
    arrivals = [0, 6, 7]
    e = _same_with_and_without(model, batch, arrivals, **kw)
    assert e.scheduler.kv.pool.evictions > 0
    bad = _lookup_at_add_engine(model, **kw)
    assert _serve(bad, batch, arrivals) != _serve(_engine(model, False, **kw), batch, arrivals), \
        "the scenario never evicted what B's early lookup found: the test would not catch the bug"


def test_l6_cached_prompt_resubmitted_after_partial_eviction(tiny):
    """A's blocks are freed tail first, so a later request that needs some blocks evicts A's tail and
    leaves its head: A resubmitted finds a shorter prefix, and its tokens are unchanged."""
    model, _ = tiny("qwen3")
    a = (SYSTEM[:64], GREEDY)
    batch = [a, (_own(50, 5), GREEDY), a]
    e = _same_with_and_without(model, batch, arrivals=[0, 10, 20], num_blocks=12)
    hit = _hits(e)["q2"][0]
    assert 0 < hit < 56, f"A's resubmission hit {hit} tokens: not a partial eviction"


def test_l6_llm_api_and_caching_off_is_stage5(tiny):
    from l5_scheduler import LLM as LLM5
    prompts = [{"prompt_token_ids": SYSTEM[:30] + _own(4, i)} for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=5)
    kw = dict(device="cpu", dtype="float32", block_size=8, max_num_batched_tokens=32, impl="torch")
    on = LLM(None, **kw)
    off = LLM(None, enable_prefix_caching=False, **kw)
    five = LLM5(None, **kw)
    got = [[o.outputs[0].token_ids for o in m.generate(prompts, params, use_tqdm=False)] for m in (on, off, five)]
    assert got[0] == got[1] == got[2]
    assert type(five.llm_engine.scheduler.kv) is BlockManager and not off.llm_engine.scheduler.kv.pool.cached
    assert on.llm_engine.scheduler.kv.stats.hits > 0


def test_l6_smoke_usual_prompt_hits_and_matches_stage5(capsys):
    """The smoke scripts' own workload, through the torch attention: the Triton kernel's l6 tokens
    are the chain's (tests/test_chain.py), and here it would cost 30 s of interpreter."""
    import json
    from l5_smoke import main as l5_main
    l6_main(["--json", "--impl", "torch"])
    six = json.loads(capsys.readouterr().out)
    l5_main(["--json", "--impl", "torch"])
    five = json.loads(capsys.readouterr().out)
    assert six["token_ids"] == five["token_ids"]
    assert six["usual_hit_tokens"] > 0 and six["prefill_tokens_computed"] < six["prompt_tokens"]


def test_l6_stop_strings_and_stop_ids_finish_the_same_with_the_cache(tiny):
    """Finish conditions read the output, not the cache: a stop string (picked from the uncached
    run's own text, so it really fires) and a stop token id end every request at the same token."""
    prompts = [{"prompt_token_ids": SYSTEM[:30] + _own(4, i)} for i in range(3)]
    kw = dict(device="cpu", dtype="float32", block_size=8, max_num_batched_tokens=32, impl="torch")
    off = LLM(None, enable_prefix_caching=False, **kw)
    free = off.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    text = free[0].outputs[0].text
    stop = next(text[i:i + 2] for i in range(3, len(text) - 2) if text[i:i + 2].isprintable() and text[i:i + 2].strip())
    params = [SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
              SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[free[1].outputs[0].token_ids[4]]),
              SamplingParams(temperature=0, max_tokens=12)]
    on = LLM(None, **kw)
    got = [[(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            for o in m.generate(prompts, params, use_tqdm=False)] for m in (on, off)]
    assert got[0] == got[1]
    assert [g[2] for g in got[0]] == ["stop", "stop", "length"] and got[0][0][3] == stop
    assert on.llm_engine.scheduler.kv.stats.hits > 0
