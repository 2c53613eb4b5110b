"""The option stage 13 adds (declared once, here; plumbing/options.py): batch-invariant kernels."""
from l12_tensor_parallel.options import ENGINE_OPTIONS as BEFORE
from plumbing.options import Option

OPTIONS = (
    Option("batch_invariant", False, "every request's logits the same bits whatever else is in its steps' batches, "
           "however its prompt is chunked (matmuls with one tile for every M, attention cut at fixed key "
           "positions: lesson 13; vLLM's VLLM_BATCH_INVARIANT)", "kernels", "ops"),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
