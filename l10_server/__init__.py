"""Stage 10 (in progress): serving the engine over HTTP. So far: the incremental detokenizer that
turns each step's new token ids into text deltas a stream can send."""
from .detok import IncrementalDetokenizer

__all__ = ["IncrementalDetokenizer"]
