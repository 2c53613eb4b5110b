"""Stage 13's parts in the engine (l13_batch_invariant/ops.py, cache.py), given to stage 12's
assembler as parts: a request's logits alone equal, bit for bit, its logits inside a batch with
other requests and a chunked prefill. CPU, float32, every kernel through the interpreter: slow,
so the deep tier (make test-deep)."""
import pytest
import torch

from l4_sampler.params import SamplingParams
from l5_scheduler.config import make_config
from l12_tensor_parallel import build_engine
from l13_batch_invariant.cache import InvariantKVCache
from l13_batch_invariant.ops import InvariantOps

PROMPT = [(5 * j + 3) % 240 + 5 for j in range(21)]
OTHERS = [[(11 * j + s) % 240 + 5 for j in range(9 + 4 * s)] for s in range(3)]


def _logits(model, prompts, budget, invariant=True):
    p = next(model.parameters())
    cfg = make_config(model.cfg, str(p.device), p.dtype, block_size=8, num_gpu_blocks_override=40,
                      max_num_batched_tokens=budget)
    parts = dict(ops=InvariantOps(model), kv_cache=InvariantKVCache(model.cfg, cfg.num_blocks, 8, p.device, p.dtype)) \
        if invariant else None
    e = build_engine(model, None, cfg, impl="triton", keep_logits=True, parts=parts, enable_prefix_caching=False)
    ids = [e.add_request({"prompt_token_ids": q}, SamplingParams(temperature=0, max_tokens=4), request_id=f"r{i}")
           for i, q in enumerate(prompts)]
    while e.has_unfinished_requests():
        e.step()
    return e.requests[ids[0]]


@pytest.mark.deep
@pytest.mark.parametrize("invariant", [True, False], ids=["l13-parts", "stage-7-parts-differ"])
def test_l13_a_requests_logits_alone_equal_its_logits_in_a_batch_with_chunks(tiny, invariant):
    """With stage 7's parts (F.linear, its split count) the same check must see a difference."""
    # InvariantOps gives the model its own lm_head module: the negative run takes another tiny model
    model, _ = tiny("qwen3" if invariant else "llama")
    alone = _logits(model, [PROMPT], 64, invariant)
    batched = _logits(model, [PROMPT] + OTHERS, 16, invariant)      # chunked prefill, three neighbours
    assert len(alone.logits) == len(batched.logits) == 4
    same = all(torch.equal(a[0], b[0]) for a, b in zip(alone.logits, batched.logits))
    assert same == invariant


@pytest.mark.deep
@pytest.mark.parametrize("invariant", [True, False], ids=["batch_invariant", "stage-12-parts"])
def test_l13_scenarios_on_the_cpu(invariant):
    """l13_batch_invariant/scenarios.py's pairs through the interpreter, float32, tiny Qwen3: with the option none
    differs; without it the batch, preemption and speculation pairs do (OpenBLAS and the split count
    pick by the batch even in float32), so the scenarios can tell the two apart."""
    from l13_batch_invariant import scenarios as sc
    from l13_batch_invariant import LLM
    r = sc.Runner(lambda **o: LLM("tiny-qwen3", device="cpu", impl="triton", keep_logits=True,
                                  batch_invariant=invariant, **dict(dict(num_gpu_blocks_override=200,
                                                                         max_model_len=512), **o)))
    bad = sc.differing(sc.scenarios(r, 256, batches=(2, 4), ks=(2,)))
    assert (bad == []) if invariant else set(bad) >= {"batch 2", "batch 4"}, bad
