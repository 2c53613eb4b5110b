"""Stage 13 (groundwork): batch invariance. With ``batch_invariant=True`` a request's logits at every
step are the same bits whatever else is in the batch, however its prompt was chunked, whether it was
preempted and recomputed, hit the prefix cache, or was verified by speculation (GPU, bf16).

Where a row's bits depend on the batch today (file:line at main 84921d7), and the rule each needs:

  matmuls (every linear layer, and the lm_head)
    l7_fast/ops.py:123-125   FusedOps.matmul: stage 7's GEMV for M <= GEMV_MAX_M (gemv.py:58, 2 rows),
                             cuBLAS (F.linear) above: two kernels summing K in two orders, picked by M.
                             gemv.py:150 gemv_block_m also picks its tile from M.
    l7_fast/ops.py:125       F.linear itself: cuBLAS picks algorithm, tile and split-K from M (measured
                             by benchmarks/bench_batch_invariant.py; on this CPU, OpenBLAS also changes
                             rows with M: 3 of 4 M differ in tests' sizes). TorchOps (l1_dense/model.py:
                             101-117) and the lm_head (l1_dense/model.py:217, ``self.lm_head(h)``, the
                             same F.linear on the S sampled rows) likewise.
    rule: matmul.py. One tile (64 rows) for every M, K cut at fixed K_CHUNKs summed in order; the host
          may run the chunks in one program (fold) or one each (split) + an ordered sum: same bits.
  attention
    l3_paged/kernel_config.py:21 pick_config: BLOCK_N (64 or 128 keys) and the tile from the step's
                             shape (decode / mixed / prefill / >= 2048 tokens): the online softmax's
                             rescaling points move with the batch.
    l7_fast/attention_split.py:152 pick_num_splits: the split COUNT from the batch size and SM count;
                             the chunk (line 61, kv_len / count) moves every cut point; the merge
                             (line 111) sums over a padded vector of splits (tl.sum: order by padding).
    l7_fast/cache.py:40      decode steps take the split kernel, every other step stage 3's: a decode
                             query and the same query in a verification or a chunk reduce differently.
    l8_sliding_window/attention.py:177, l9_fp8_kv/attention.py:193 and both attention_split.py: the same
                             two choices for windowed and e4m3 caches (not handled here yet).
    rule: attention.py. Keys cut at multiples of SPLIT_KEYS (positions, not a count), each split from a
          fresh state with one tile shape, folded in key order (explicit fma); a decode split launch
          folds the stored splits in the same order: decode, verify, chunk and prefill agree.
  already per row (no change needed)
    RMSNorm: l7_fast/fused_norm.py:92 one program per row, warps from N only. But TorchOps' RMSNorm
             (l1_dense/model.py:56, torch's mean) is a torch reduction whose split over threads
             depends on the number of rows on CUDA: invariant mode uses the fused kernel.
    RoPE + K/V write (fused_rope.py:187), SiLU * up (fused_act.py:47), embedding: elementwise.
    Sampler (l4_sampler/sampler.py): log_softmax / argmax / stable sort per row; greedy is invariant.
             Random sampling of UNSEEDED rows draws from one shared generator (sampler.py:251), so a
             row's noise depends on its neighbours: only seeded requests are reproducible per request.
  not handled yet: tensor parallelism (ParallelLMHead's F.linear, NCCL all-reduce order), the e4m3 and
  windowed caches' kernels, CUDA graphs of the split launch's partials (sized from max_model_len).

Parts (ops.py, cache.py), chosen by the assembler when ``batch_invariant=True`` (stage.py):

    from l13_batch_invariant import LLM, SamplingParams
    llm = LLM(None, batch_invariant=True, impl="triton")
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.matmul': ('matmul',),
    '.attention': ('paged_attention_invariant',),
})
