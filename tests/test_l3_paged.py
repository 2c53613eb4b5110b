"""Stage 3 at the model level: the metadata, the view trick, mixed batches, tokens vs stage 2."""
import random

import pytest
import torch

from compare import main as compare_main
from l2_gather.allocator import BlockAllocator, Request
from l2_gather.engine import GatherEngine
from l3_paged.cache import PagedKVCache
from l3_paged.engine import PagedEngine
from l3_paged.metadata import build_meta

PROMPTS = [[84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108], [72, 101, 108, 108, 111, 44, 32, 109, 121],
           [1, 2, 3]]


def _req(blocks, cur_len, block_size=4):
    r = Request("r", blocks=list(blocks))
    r.slot_indices = [blocks[i // block_size] * block_size + i % block_size for i in range(len(blocks) * block_size)]
    r.cur_len = cur_len
    return r


def test_build_meta_single_prefill_and_decode_match_the_table():
    a = _req([7, 2], cur_len=0)
    m = build_meta([(a, 5)], 4, "cpu")                       # prefill of N=5, block_size 4
    assert m.cu_seqlens_q.tolist() == [0, 5] and m.seq_lens_kv.tolist() == [5]
    assert m.block_table.tolist() == [[7, 2]] and m.block_table.dtype == torch.int32
    assert m.slot_mapping.tolist() == [28, 29, 30, 31, 8] and m.positions.tolist() == [0, 1, 2, 3, 4]
    assert m.logits_indices.tolist() == [4] and m.max_seqlen_q == 5
    a.cur_len = 5
    m = build_meta([(a, 1)], 4, "cpu")                       # decode at step 1
    assert (m.cu_seqlens_q.tolist(), m.seq_lens_kv.tolist(), m.slot_mapping.tolist()) == ([0, 1], [6], [9])
    assert m.positions.tolist() == [5] and m.max_seqlen_q == 1


def test_build_meta_mixed_decode_and_chunk_pads_the_block_table():
    a = _req([7, 2], cur_len=5)                              # decode: 5 cached, 1 new
    b = _req([3, 5, 1], cur_len=4)                           # chunk of 5 on 4 cached -> 9 tokens, 3 blocks
    m = build_meta([(a, 1), (b, 5)], 4, "cpu")
    assert m.cu_seqlens_q.tolist() == [0, 1, 6]
    assert m.seq_lens_kv.tolist() == [6, 9]
    assert m.block_table.tolist() == [[7, 2, 0], [3, 5, 1]]   # right-padded with 0
    assert m.positions.tolist() == [5, 4, 5, 6, 7, 8]
    assert m.slot_mapping.tolist() == [9, 20, 21, 22, 23, 4]
    assert m.logits_indices.tolist() == [0, 5]


def test_set_kv_view_writes_row_block_offset(tiny):
    model, _ = tiny("qwen3")
    dev = next(model.parameters()).device
    cache = PagedKVCache(model.cfg, num_blocks=6, block_size=4, device=dev, dtype=torch.float32)
    k = torch.randn(2, model.cfg.num_kv_heads, model.cfg.head_dim, device=dev)
    cache.set_kv(0, torch.tensor([9, 22], device=dev), k, -k)
    assert torch.equal(cache.K[0][2, 1], k[0]) and torch.equal(cache.K[0][5, 2], k[1])   # 9 = 2*4+1, 22 = 5*4+2
    assert torch.equal(cache.V[0][5, 2], -k[1])
    assert int((cache.K[0] != 0).any(-1).any(-1).sum()) == 2   # nothing else was touched


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_one_mixed_batch_equals_three_single_sequence_runs(tiny, impl):
    """Decode for A, a fresh prefill for B and a prefill chunk on cached context for C, in ONE
    forward: each sequence's logits equal what it gets when run alone (fp32, atol 1e-4)."""
    model, _ = tiny("qwen3")
    dev = next(model.parameters()).device
    bs = 4
    alloc = BlockAllocator(64, bs)
    random.Random(3).shuffle(alloc._free)
    cache = PagedKVCache(model.cfg, 64, bs, dev, torch.float32, impl=impl, check=True)
    A, B, C = (Request(n) for n in "ABC")
    a_prompt, b_prompt, c_prompt = PROMPTS[0], PROMPTS[1], PROMPTS[0] + PROMPTS[2]

    def forward(batch, ids):
        for req, q in batch:
            alloc.reserve(req, req.cur_len + q)
        logits = model(torch.tensor(ids, device=dev), cache, build_meta(batch, bs, dev))
        for req, q in batch:
            req.cur_len += q
        return logits

    forward([(A, len(a_prompt))], a_prompt)                 # A: prompt cached
    forward([(C, 6)], c_prompt[:6])                         # C: first chunk cached
    a_next = 42
    mixed = forward([(A, 1), (B, len(b_prompt)), (C, len(c_prompt) - 6)], [a_next] + b_prompt + c_prompt[6:])

    def alone(tokens, split):                               # same sequences, one at a time, stage 3
        e = PagedEngine(model, 64, bs, impl=impl)
        e.prefill(tokens[:split])
        return e.step(tokens[split:]) if split < len(tokens) else e.step(tokens)
    want = [alone(a_prompt + [a_next], len(a_prompt)),
            PagedEngine(model, 64, bs, impl=impl).prefill(b_prompt),
            alone(c_prompt, 6)]
    for got, ref in zip(mixed, want):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("impl,block_size", [("triton", 1), ("triton", 12), ("torch", 16)])
def test_l3_paged_tokens_match_l2_gather_with_scattered_blocks(tiny, impl, block_size):
    model, _ = tiny("llama")
    n_new = 8
    want = []
    for p in PROMPTS:
        e = GatherEngine(model, 40, 16)
        logits, out = e.prefill(p), []
        for _ in range(n_new):
            out.append(int(logits.argmax()))
            logits = e.decode(out[-1])
        want.append(out)
    alloc = BlockAllocator(num_blocks=120 // block_size + 6, block_size=block_size)
    random.Random(1).shuffle(alloc._free)
    pool = PagedKVCache(model.cfg, alloc.num_blocks, block_size, next(model.parameters()).device,
                        torch.float32, impl=impl, check=True)
    engines = [PagedEngine(model, 0, block_size, impl=impl, allocator=alloc, pool=pool, req_id=i) for i in range(3)]
    logits = [e.prefill(p) for e, p in zip(engines, PROMPTS)]
    got = [[] for _ in PROMPTS]
    for _ in range(n_new):
        for i, e in enumerate(engines):
            got[i].append(int(logits[i].argmax()))
            logits[i] = e.decode(got[i][-1])
    assert got == want


def test_compare_finds_the_planted_transpose_at_layer_0_position_0(capsys):
    rc = compare_main(["--a", "l2_gather", "--b", "l3_paged[torch]", "--plant-bug", "transpose",
                       "--max-new-tokens", "4"])
    out = capsys.readouterr().out
    assert rc == 1 and "first divergence at layer 0, position 0: prefill" in out
    assert compare_main(["--a", "hf", "--b", "l3_paged[triton]", "--max-new-tokens", "4"]) == 0
