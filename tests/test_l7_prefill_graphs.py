"""Stage 7's prefill graphs (graphs.py): one request's short prefill replays a graph of T tokens.

CPU: which steps qualify (one request, n > 1 tokens, sampling after the last, no guesses); the
buckets; and what a replay reads, ``prepare(out, pad_tokens=T)`` (the request's tokens, then one
padding sequence), run eagerly: the request's logits row equals the unpadded step's, and the
padding writes only the PAD block. GPU: an engine with prefill graphs replays them and emits the
eager engine's tokens, through a prefix-cache hit and a prompt's last chunk.
"""
import pytest
import torch

from l4_sampler.params import SamplingParams
from l5_scheduler.config import make_config
from l7_fast import build_engine
from l7_fast.graphs import prefill_buckets
from l7_fast.runner import one_prefill

PROMPT = [(11 * j + 5) % 240 + 5 for j in range(21)]
OTHER = [(7 * j + 3) % 240 + 5 for j in range(9)]


def _config(model, budget=64, seqs=4, max_len=None, blocks=40):
    p = next(model.parameters())
    return make_config(model.cfg, str(p.device), p.dtype, block_size=8, num_gpu_blocks_override=blocks,
                       max_num_batched_tokens=budget, max_num_seqs=seqs, max_model_len=max_len)


def test_prefill_buckets_stay_within_the_budget_the_context_and_a_second_sequence(tiny):
    model, _ = tiny("qwen3")
    assert prefill_buckets(_config(model, budget=64)) == [16, 32, 64]
    assert prefill_buckets(_config(model, budget=2048, blocks=128)) == [16, 32, 64, 128, 256, 512]
    assert prefill_buckets(_config(model, budget=2048)) == [16, 32, 64, 128, 256]   # the pool: 320 tokens
    assert prefill_buckets(_config(model, budget=100, max_len=40)) == [16, 32]
    assert prefill_buckets(_config(model, seqs=1)) == []              # no room for the padding sequence


def test_which_steps_replay_a_prefill_graph(tiny):
    model, _ = tiny("qwen3")
    e = build_engine(model, None, _config(model), impl="torch", fused_ops=False)
    e.add_request({"prompt_token_ids": PROMPT}, SamplingParams(temperature=0, max_tokens=3), request_id="a")
    out = e.scheduler.schedule()
    assert one_prefill(out) == 21                                      # alone, samples after token 21
    out.sample[0] = False
    assert one_prefill(out) is None                                    # a chunk that does not sample
    out.sample[0] = 2
    assert one_prefill(out) is None                                    # two logits rows: not a prefill graph's one
    out.sample[0] = True


def _spy_padded(e, found):
    """Wrap the eager runner: at each qualifying step, also run the padded inputs a replay reads."""
    r = e.runner
    real = r.execute

    def spy(out):
        before = [k.clone() for k in r.cache.K]
        res = real(out)
        n = one_prefill(out)
        if n is not None:
            T = next(T for T in prefill_buckets(r.config) if T > n)
            after = [k.clone() for k in r.cache.K]
            lay, _ = r.prepare(out, pad_tokens=T)
            logits, _ = r.forward(lay, T, r.config.max_model_len, 1)
            real_blocks = set(out.scheduled[0][0].kv.blocks)
            for k0, k1, k2 in zip(before, after, r.cache.K):
                moved = set((k1 != k2).flatten(1).any(1).nonzero().flatten().tolist())   # by the padded run
                assert moved <= {r.cache.pad_block}, moved                 # real K/V rewritten with equal bits
                assert set((k0 != k1).flatten(1).any(1).nonzero().flatten().tolist()) <= real_blocks
            found.append((n, T, float((logits[:1] - res.logits).abs().max())))
        return res
    r.execute = spy


def test_padded_prefill_inputs_give_the_eager_steps_logits(tiny):
    """On the CPU, where no graph exists, the padded inputs run eagerly; the GPU test replays."""
    model, _ = tiny("qwen3")
    e = build_engine(model, None, _config(model, budget=16), impl="triton", fused_ops=False)   # Triton attention
    found = []
    _spy_padded(e, found)
    for i, prompt in enumerate([PROMPT, OTHER, PROMPT + [3, 4]]):      # chunked, alone, a prefix hit + 7 new
        e.add_request({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=2), request_id=f"p{i}")
        while e.has_unfinished_requests():
            e.step()
    assert sorted(n for n, _, _ in found) == [5, 7, 9], found         # 21 = 16 + a last chunk of 5; 23 = 16 hit + 7
    assert all(T == 16 for _, T, _ in found) and max(d for _, _, d in found) < 1e-4, found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_graphs_replay_and_equal_the_eager_engine(tiny, dtype):
    from l1_dense.checkpoint import load_model
    _, path = tiny("qwen3")
    model = load_model(path, "cuda", dtype)
    work = [PROMPT, OTHER, PROMPT + [3, 4], PROMPT * 4]                # alone (x2), a hit, a long prompt's last chunk
    runs = {}
    for graphs in (False, True):
        e = build_engine(model, None, _config(model), prefill_graphs=graphs)
        out = []
        for i, p in enumerate(work):
            rid = e.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, ignore_eos=True, max_tokens=6),
                                request_id=f"p{i}")
            while e.has_unfinished_requests():
                e.step()
            out.append(e.requests[rid].output_ids)
        runs[graphs] = (out, e.runner.mode_log)
    assert runs[True][0] == runs[False][0]
    modes = runs[True][1]
    assert {"graph prefill 32", "graph prefill 16"} <= set(modes), sorted(set(modes))
    assert not any("prefill" in m for m in runs[False][1])
