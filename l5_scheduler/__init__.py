"""Stage 5: continuous batching. A scheduler picks, every step, which requests run and how many
tokens each gets (one token budget, chunked prefill, preemption by recompute); the runner puts
them through ONE forward pass with stage 3's metadata and stage 4's sampler. The engine loop is
written here once, and so is the assembler that gives it its parts (assemble.py): each later
stage adds options and parts (its stage.py), never another loop."""
from plumbing.lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {
    'l4_sampler.params': ('SamplingParams',),
    '.stage': ('LLM', 'build_engine', 'STAGES'),
    '.engine': ('LLMEngine',),
    '.kv_manager': ('BlockManager',),
    '.outputs': ('CompletionOutput', 'ModelRunnerOutput', 'RequestOutput', 'StepOutput'),
    '.request': ('Request', 'RequestStatus'),
    '.scheduler': ('Scheduler', 'SchedulerOutput'),
})
