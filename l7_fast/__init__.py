"""Stage 7: the engine made fast. Stage 6's engine given a faster runner: persistent pinned inputs
(one copy per step, the block table updated by the scheduler's diffs), fused Triton kernels
through the skeleton's ops seam, split-KV decode for small batches (flash-decoding), and each
decode step replayed as one CUDA graph. Each idea is a part (``build_engine``)."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .graphs import GraphRunner
from .llm import LLM, build_engine
from .ops import FusedOps, merge_projections
from .profile import Profiler
from .runner import FastRunner, graph_buckets

__all__ = ["LLM", "build_engine", "SamplingParams", "FusedOps", "FastRunner", "GraphRunner", "Profiler",
           "graph_buckets", "merge_projections"]
