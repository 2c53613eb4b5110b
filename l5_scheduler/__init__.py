"""Stage 5: continuous batching. A scheduler picks, every step, which requests run and how many
tokens each gets (one token budget, chunked prefill, preemption by recompute); the runner puts
them through ONE forward pass with stage 3's metadata and stage 4's sampler."""
import l1_dense  # noqa: F401  (sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .engine import LLMEngine
from .llm import LLM
from .outputs import CompletionOutput, RequestOutput, StepOutput
from .request import Request, RequestStatus
from .scheduler import Scheduler, SchedulerOutput

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "StepOutput",
           "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]
