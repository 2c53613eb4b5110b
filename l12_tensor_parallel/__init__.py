"""Stage 12: tensor parallelism. One model over several ranks (processes; GPUs on cuda), each
holding a slice of every layer; the engine core runs once, in rank 0.

    from l12_tensor_parallel import LLM, SamplingParams
    llm = LLM(None, tensor_parallel_size=2)            # gloo on a CPU, NCCL on GPUs
    llm.generate(["Hello"], SamplingParams(max_tokens=8))
    llm.llm_engine.model.tensor_parallel.close()       # or at exit
"""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.group': ('RankFailed', 'TensorParallel'),
})
