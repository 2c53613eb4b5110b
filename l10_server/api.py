"""The HTTP front: FastAPI routes over one ``AsyncLLM``.

    POST /v1/completions        prompt(s) -> text, streamed (SSE) or whole
    POST /v1/chat/completions   messages -> the tokenizer's chat template -> the same
    GET  /v1/models             the one model served
    GET  /health                200, or 503 once the engine has died
    GET  /version               {"version": ...} (vLLM's)
    GET  /docs, /openapi.json   the request bodies' schemas (protocol.py's models)
    GET  /metrics               Prometheus text, vLLM's names (metrics.py): running, waiting, KV cache,
                                prefix-cache hits, tokens, latency histograms

Errors are OpenAI's JSON (errors.py): 400 for a bad field (named in ``param``), 404 for an
unknown model or route (405: a wrong method), 415 for a body that is not JSON, 429 when more than ``--max-pending`` sequences are in flight (the server refuses
rather than queueing without bound; the client retries), 500 for a request that met a bug (that
request alone: the others go on), 503 once the engine core has died (every client in flight is
answered at once, and the server exits: serve.py). A stream that fails after its headers went out
gets the error as its last event, then ``[DONE]``.

A client that goes away is aborted: a stream's generator is cancelled by the server, and a whole
(non-streamed) request races its work against the connection's ``http.disconnect``.
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from l5_scheduler.llm import render_chat
from plumbing.errors import UserError

from .async_llm import AsyncLLM, EngineDead, QueueFull
from .engine_core import RequestFailed
from .metrics import CONTENT_TYPE
from .errors import ApiError, error_response, install
from .params import from_user_error, parse_chat, parse_completion
from .protocol import ERRORS, ChatCompletionRequest, CompletionRequest
from .responses import DONE, Formatter, merge


VERSION = importlib.metadata.version("triton-llm-lessons")


def build_app(async_llm: AsyncLLM, model_name: str, max_model_len: int, on_start=None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        async_llm.start()
        if on_start is not None:
            on_start()
        yield
        async_llm.shutdown()

    app = FastAPI(title="triton-llm-lessons", version=VERSION, lifespan=lifespan)
    install(app)                                      # every refusal as OpenAI's error JSON

    @app.exception_handler(Exception)
    async def bug(request, e: Exception):             # a bug a request met: that request's 500, as OpenAI's JSON
        return error_response(failed(e))

    @app.get("/health")
    async def health():
        if async_llm.dead is not None:
            return error_response(ApiError(503, f"engine dead: {async_llm.dead}", type="server_error"))
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "triton-llm-lessons", "max_model_len": max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        return Response(async_llm.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/version")
    async def version():
        return {"version": VERSION}

    @app.post("/v1/completions", responses=ERRORS)
    async def completions(body: CompletionRequest, request: Request):
        parsed = parse_completion(body)
        return await _serve(request, async_llm, parsed, model_name, chat=False)

    @app.post("/v1/chat/completions", responses=ERRORS)
    async def chat(body: ChatCompletionRequest, request: Request):
        parsed = parse_chat(body)
        try:
            parsed.prompts = [render_chat(async_llm.front_tokenizer, parsed.extra["messages"])]
        except UserError as e:
            raise ApiError(400, str(e), "messages") from None
        return await _serve(request, async_llm, parsed, model_name, chat=True)

    return app


def failed(e: BaseException) -> ApiError:
    """Whatever one request raised, as its answer: 503 if the engine core died, 500 otherwise (logged)."""
    if isinstance(e, (EngineDead, RequestFailed)):   # (the engine core logged its own traceback)
        return ApiError(503 if isinstance(e, EngineDead) else 500, str(e), type="server_error")
    logging.getLogger("uvicorn.error").error("a request failed", exc_info=e)
    return ApiError(500, f"the server could not finish this request: {type(e).__name__}: {str(e)[:200]}",
                    type="server_error")


async def _serve(request: Request, llm: AsyncLLM, parsed, model_name: str, chat: bool):
    if parsed.model is not None and parsed.model != model_name:
        raise ApiError(404, f"the model {parsed.model!r} does not exist: this server serves {model_name!r} "
                            "(GET /v1/models)", "model", code="model_not_found")
    fmt = Formatter(chat, model_name, parsed.params.n, llm.front_tokenizer, parsed.include_usage,
                    parsed.return_token_ids, parsed.continuous_usage, parsed.echo)
    fmt.top_n = parsed.params.logprobs or 0
    try:
        sub = llm.submit(parsed.prompts, parsed.params, fmt.id)
    except QueueFull as e:
        raise ApiError(429, str(e), type="rate_limit_exceeded", code="rate_limit_exceeded") from None
    except UserError as e:                              # more sequences than the server ever holds
        raise ApiError(400, str(e), "n" if parsed.params.n > 1 else "prompt") from None
    except EngineDead as e:
        raise failed(e) from None
    try:
        await sub.accepted()
        fmt.accepted(parsed.prompts, sub.prompt_token_ids)
    except UserError as e:
        raise from_user_error(e, "messages" if chat else "prompt") from None
    except (RequestFailed, EngineDead) as e:            # 500: a bug this request met; 503: the core died
        raise failed(e) from None
    except BaseException:                               # anything else, a cancellation too: nothing is left
        sub.close()                                     # running or counted for a request that is gone
        raise
    prompt_tokens = sum(len(p) for p in sub.prompt_token_ids)
    if parsed.stream:                                   # close() after the stream, also when its generator never
        return StreamingResponse(_stream(sub, fmt, prompt_tokens), media_type="text/event-stream",
                                 background=BackgroundTask(sub.close))   # started (the client left first)
    work = asyncio.ensure_future(_collect(sub, fmt, prompt_tokens))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
    if not work.done():                                 # the client went away: abort (in the generator's finally)
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return error_response(ApiError(499, "client closed the request"))
    gone.cancel()
    return work.result()


async def _stream(sub, fmt: Formatter, prompt_tokens: int):
    completion_tokens = 0
    try:
        async for i, update in sub.updates():
            completion_tokens += sum(len(ch.token_ids) for ch in update.choices)
            for event in fmt.stream_chunks(i, update):
                yield event
    except Exception as e:                              # the engine died, or this request met a bug
        yield f"data: {json.dumps(failed(e).body())}\n\n"
    else:
        if fmt.include_usage:
            yield fmt.usage_chunk(fmt.usage(prompt_tokens, completion_tokens))
    yield DONE


async def _collect(sub, fmt: Formatter, prompt_tokens: int):
    acc, completion_tokens = {}, 0
    try:
        async for i, update in sub.updates():
            fmt.seen(i, update)
            completion_tokens += merge(acc, i, fmt.n, update)
        return fmt.whole(acc, fmt.usage(prompt_tokens, completion_tokens))
    except Exception as e:                              # the engine died, or this request met a bug
        return error_response(failed(e))


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
