"""Stage 7: the engine made fast. Groundwork so far: fused Triton kernels for the hot path and a
split-KV (flash-decoding) paged attention for small-batch, long-context decode."""
import l1_dense  # noqa: F401  (must come first: picks GPU or Triton interpreter before any kernel is defined)
