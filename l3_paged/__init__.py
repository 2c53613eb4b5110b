"""Stage 3: paged KV cache read by one attention kernel launch per layer for the whole batch."""
import l1_dense  # noqa: F401  (must come first: picks GPU or Triton interpreter before any kernel is defined)
