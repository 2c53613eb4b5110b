"""``LLM`` with stage 7's fast runner: CUDA graphs for decode steps, fused kernels, split-KV.

    from l7_fast import LLM, SamplingParams
    llm = LLM(None)                                   # the built-in tiny Qwen3
    llm = LLM(None, enforce_eager=True)               # no CUDA graphs (vLLM's name)
    llm = LLM(None, host_fast_path=False)             # stage 5's per-request host loops
    llm.llm_engine.runner.graph_bytes                 # memory the captured graphs hold

On a CPU there is no CUDA graph: every step runs eagerly, through the Triton interpreter.
"""
from __future__ import annotations

from l6_prefix_cache.llm import LLM as Stage6LLM

from .engine import LLMEngine


class LLM(Stage6LLM):
    def __init__(self, model: str | None = None, *, enforce_eager: bool = False, fused_ops: bool = True,
                 split_kv: bool = True, host_fast_path: bool = True, **kw):
        self.fast = dict(enforce_eager=enforce_eager, fused_ops=fused_ops, split_kv=split_kv,
                         host_fast_path=host_fast_path)
        super().__init__(model, **kw)

    def make_engine(self, config, **kw) -> LLMEngine:
        return LLMEngine(self.model, self.tokenizer, config, enable_prefix_caching=self.enable_prefix_caching,
                         **self.fast, **kw)
