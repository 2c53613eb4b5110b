"""Stage 1: the model skeleton (written once, imported by every later stage) and a dense KV cache."""
import plumbing.runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET before any kernel is defined)
