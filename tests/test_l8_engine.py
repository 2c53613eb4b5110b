"""Stage 8 end to end: every request equals its solo transformers run, batched, chunked, preempted
and prefix-hit, on a Mistral (every layer windowed) and a hybrid Qwen2; the window frees blocks."""
import math

import pytest
import torch

from harness.oracle import hf_generate
from l8_sliding_window import LLM, SamplingParams
from plumbing.runtime import default_device
from plumbing.tiny import tiny_checkpoint

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
PROMPTS = [P, P[:7], P * 3, P[5:] + P]          # 24, 7, 72, 43 tokens: all but one pass the window
_HF = {}


def hf(family, prompt, n=20):
    key = (family, tuple(prompt), n)
    if key not in _HF:
        _HF[key] = hf_generate(tiny_checkpoint(family), prompt, n, default_device(), torch.float32).token_ids
    return _HF[key]


def run(llm, prompts, n=20):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=n, temperature=0),
                        use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("family", ["mistral", pytest.param("qwen2-hybrid", marks=pytest.mark.deep)])
def test_l8_batched_chunked_preempted_requests_equal_their_solo_hf_run(family):
    llm = LLM(f"tiny-{family}", dtype="float32", max_num_batched_tokens=32, num_gpu_blocks_override=9)
    assert run(llm, PROMPTS, n=12) == [hf(family, p, n=12) for p in PROMPTS]   # 3 of 4 prompts pass W = 20
    stats = llm.llm_engine.stats
    assert any(s.preempted for s in stats), "the pool was meant to be too small: no preemption happened"
    assert any(n < full for s in stats for _, _, n, full in s.chunks), "no prompt was chunked"
    kv = llm.llm_engine.scheduler.kv
    assert kv.blocks_freed > 0                                       # the hybrid's windowed groups free theirs too
    assert kv.num_free == kv.num_blocks                              # everything back at the end


@pytest.mark.deep
def test_l8_prefix_hit_with_a_window_equals_hf():
    llm = LLM("tiny-mistral", dtype="float32", num_gpu_blocks_override=64)   # not 90% of a shared GPU (pytest -n)
    first = run(llm, [P * 3])
    second = run(llm, [P * 3 + [7, 8]])                              # shares 4 full blocks with the first
    assert first == [hf("mistral", P * 3)] and second == [hf("mistral", P * 3 + [7, 8])]
    assert llm.llm_engine.scheduler.kv.stats.hits > 0


@pytest.mark.deep              # make test: the l8 fuzz checks the same bound on its workloads
@pytest.mark.parametrize("family", ["mistral", "qwen2-hybrid"])
def test_l8_a_windowed_group_holds_at_most_the_window_plus_one_block(family):
    """Checked before every forward pass, per KV cache group: the blocks the step may read are held; a
    windowed group holds no more than the bound, a full group its whole history."""
    llm = LLM(f"tiny-{family}", dtype="float32", max_num_batched_tokens=16, num_gpu_blocks_override=64)
    engine, kv = llm.llm_engine, llm.llm_engine.scheduler.kv
    bs, steps = kv.block_size, []
    execute = engine.runner.execute

    def checked(out):                                                # the engine's own step, observed
        for req, n in out.scheduled:
            for g, (h, W) in enumerate(zip(kv.handles(req.kv), kv.windows)):
                lowest = 0 if W is None else max(0, req.kv.cur_len - W + 1)
                assert kv.skipped(req.kv, g) <= lowest // bs
                for i in range(lowest // bs, -(-(req.kv.cur_len + n) // bs)):
                    assert kv.pool.blocks[h.blocks[i]].ref_cnt >= 1
                bound = len(h.blocks) if W is None else math.ceil((W + n - 1) / bs) + 1
                assert kv.held(req.kv, g) <= bound, (g, req.kv.cur_len, n, kv.held(req.kv, g), bound)
        steps.append(out)
        return execute(out)
    engine.runner.execute = checked
    n_new = 30
    assert run(llm, [P * 3], n=n_new) == [hf(family, P * 3, n=n_new)]
    windowed = sum(W is not None for W in kv.windows)
    W = min(W for W in kv.windows if W is not None)
    assert len(steps) > n_new and kv.blocks_freed >= windowed * ((72 + n_new - W) // bs - 1)


def test_l8_blocks_held_script_check_fails_when_a_group_breaks_its_bound():
    """scripts/l8_blocks_held.py's verdict: a windowed group over its bound, or a full group short of its
    history, is a violation; the counts the script measured are not."""
    from l8_blocks_held import check
    run = dict(model="m", block_size=16, bound=[None, 3], rows=[dict(seq_len=40, held=[3, 3])])
    assert check(run) == []
    run["rows"][0]["held"] = [3, 4]
    assert len(check(run)) == 1
    run["rows"][0]["held"] = [2, 3]
    assert len(check(run)) == 1


def test_l8_a_pool_too_small_for_one_request_is_refused_at_start(tiny):
    """Uneven groups (a full pair and a single windowed layer) leave part of each block unused: a pool
    that holds max_model_len in stage 7's blocks may not hold it here, and start-up says so."""
    import torch
    from l5_scheduler.config import EngineConfig
    from l8_sliding_window import build_engine
    from l8_sliding_window.cache import WindowedKVCache
    from l8_sliding_window.groups import KVGroup, pool_blocks, request_blocks
    from plumbing.errors import UserError
    groups = [KVGroup(None, (0, 1)), KVGroup(5, (2,))]
    assert pool_blocks(4, groups, 3) == 6 >= request_blocks(32, 16, 32, groups) == 2 + 2      # fits
    assert pool_blocks(2, groups, 3) == 3 < request_blocks(32, 16, 32, groups)                # does not
    model, _ = tiny("qwen2-hybrid")                                                         # three layers
    cache = WindowedKVCache(model.cfg, groups, 3, 16, "cpu", torch.float32, impl="torch")
    with pytest.raises(UserError, match="holds up to 4 blocks, the pool has 3. Raise num_gpu_blocks_override"):
        build_engine(model, None, EngineConfig(16, 3, 32, 4, 32), parts={"kv_cache": cache}, max_model_len=32)
    build_engine(model, None, EngineConfig(16, 3, 32, 4, 16), parts={"kv_cache": cache}, max_model_len=16)
