"""Stage 3: paged KV cache read by one attention kernel launch per layer for the whole batch."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
