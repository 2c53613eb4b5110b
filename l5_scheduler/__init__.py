"""Stage 5: continuous batching. A scheduler picks, every step, which requests run and how many
tokens each gets (one token budget, chunked prefill, preemption by recompute); the runner puts
them through ONE forward pass with stage 3's metadata and stage 4's sampler. The engine loop is
written here once; later stages give it other parts (``build_engine``)."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
from l4_sampler.params import SamplingParams

from .engine import LLMEngine
from .kv_manager import BlockManager
from .llm import LLM, build_engine
from .outputs import CompletionOutput, RequestOutput, StepOutput
from .request import Request, RequestStatus
from .scheduler import Scheduler, SchedulerOutput

__all__ = ["LLM", "LLMEngine", "build_engine", "BlockManager", "SamplingParams", "RequestOutput", "CompletionOutput", "StepOutput",
           "Request", "RequestStatus", "Scheduler", "SchedulerOutput"]
