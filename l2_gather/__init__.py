"""Stage 2: a block allocator, a token-flat KV pool and host-side gather attention."""
import plumbing.runtime  # noqa: F401  (first: sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
