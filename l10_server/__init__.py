"""Stage 10: an OpenAI-compatible server over the engine of stages 5-9.

    detok.py       each step's new token ids -> text a stream may send (no half character, no
                   text a stop string will remove)
    engine_core.py the one engine loop, in its own process; one message a step to the server
    async_llm.py   the server's handle on it: submit, abort, the reader thread, engine death
    submission.py  one request's prompts: updates merged while the writer is behind, detokenized
    protocol.py    the request bodies as pydantic models: every field checked, /docs' schemas
    params.py      a checked body -> prompts + SamplingParams
    errors.py      every refusal as OpenAI's error JSON (400 naming the field, 404, 405, 415)
    responses.py   updates -> OpenAI's objects and SSE chunks
    api.py         the FastAPI routes; serve.py: uvicorn; __main__.py: ``python -m l10_server``
"""
from .detok import IncrementalDetokenizer

__all__ = ["IncrementalDetokenizer"]
