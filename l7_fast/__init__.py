"""Stage 7: the engine made fast. Stage 6's engine given faster parts by the assembler
(stage.py): persistent pinned inputs (one copy per step, the block table updated by the
scheduler's diffs), fused Triton kernels through the skeleton's ops seam, split-KV decode for
small batches (flash-decoding), each decode step replayed as one CUDA graph, and async
scheduling (another order of a step's work). Each is an option, on by default.

    from l7_fast import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3
    llm = LLM(None, enforce_eager=True)               # no CUDA graphs (vLLM's name)
    llm = LLM(None, fused_ops=False, split_kv=False)  # the torch ops, stage 3's attention kernel
    llm.llm_engine.runner.graph_bytes                 # memory the captured graphs hold
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.cache': ('FastKVCache',),
    '.graphs': ('GraphRunner',),
    '.ops': ('FusedOps', 'merge_projections'),
    '.profile': ('Profiler',),
    '.runner': ('FastRunner', 'graph_buckets'),
    '.step': ('OverlappedStep',),
    '.step_inputs': ('FastMeta',),
})
