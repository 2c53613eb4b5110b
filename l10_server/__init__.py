"""Stage 10: an OpenAI-compatible server over the engine of stages 5-9.

    detok.py       each step's new token ids -> text a stream may send (no half character, no
                   text a stop string will remove)
    async_llm.py   the engine loop on its own thread; per-request queues for the event loop
    protocol.py    request bodies -> prompts + SamplingParams, every field checked (400s)
    responses.py   updates -> OpenAI's objects and SSE chunks
    api.py         the FastAPI routes; serve.py: uvicorn; __main__.py: ``python -m l10_server``
"""
from .detok import IncrementalDetokenizer

__all__ = ["IncrementalDetokenizer"]
