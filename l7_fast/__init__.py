"""Stage 7: the engine made fast. Stage 6's engine with a runner that keeps its inputs in
persistent pinned buffers (one copy per step), runs fused Triton kernels through the skeleton's
ops seam, splits the keys of small-batch decode over many programs (flash-decoding), and replays
each decode step as one CUDA graph."""
import l1_dense  # noqa: F401  (sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .engine import LLMEngine
from .llm import LLM
from .ops import FusedOps, merge_projections
from .runner import FastRunner, graph_buckets

__all__ = ["LLM", "LLMEngine", "SamplingParams", "FusedOps", "FastRunner", "graph_buckets", "merge_projections"]
