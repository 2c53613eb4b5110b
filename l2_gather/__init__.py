"""Stage 2: a block allocator, a token-flat KV pool and host-side gather attention."""
import l1_dense  # noqa: F401  (sets TRITON_INTERPRET on CPU-only machines before any kernel exists)
