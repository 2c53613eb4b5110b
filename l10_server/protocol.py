"""The OpenAI request bodies as pydantic models: what ``/docs`` and ``/openapi.json`` show, and
every check a body must pass before the engine sees it.

A field the server does not implement is refused (400, naming it), never ignored: a client that
sends ``tools`` and gets an answer would believe they were honoured. So the models forbid unknown
fields (``extra="forbid"``) and are strict (``"max_tokens": "3"`` or ``true`` is not a number).
A field left out or sent as ``null`` means its default. The fields:

    both endpoints   model, max_tokens, temperature, top_p, top_k, min_p, seed, stop, n,
                     presence_penalty, frequency_penalty, repetition_penalty, stream,
                     stream_options (include_usage, continuous_usage_stats), ignore_eos,
                     min_tokens, stop_token_ids, include_stop_str_in_output, return_token_ids,
                     user (accepted, unused: it is only a label), vLLM's logit_bias,
                     allowed_token_ids, bad_words, truncate_prompt_tokens, skip_special_tokens,
                     spaces_between_special_tokens, prompt_logprobs (0..20, not with stream)
    /v1/completions  prompt (text, ids, or a list of either), logprobs (0..20), echo (with
                     logprobs: the prompt's logprobs first), best_of (= n), suffix (null)
    /v1/chat/...     messages, logprobs (bool) + top_logprobs (0..20), max_completion_tokens,
                     response_format ({"type": "text"}), tools / tool_choice (none)

A check that spans fields (``best_of`` and ``n``, ``stream_options`` without ``stream`` ...)
raises ``refuse(param, message)`` in a model validator; errors.py turns each failure into
OpenAI's error JSON naming the field.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

MAX_LOGPROBS = 20
INT64 = (-2**63, 2**63 - 1)


def refuse(param: str, message: str) -> PydanticCustomError:
    """A check of a model validator that failed: errors.py answers 400 with ``param``."""
    return PydanticCustomError("refused", "{message}", {"param": param, "message": f"{param}: {message}"})


def _f(what: str, **constraints) -> Any:
    """An optional field; ``what`` is what it must be (the schema's description, the error's words)."""
    return Field(None, description=what, **constraints)


NUM = dict(allow_inf_nan=False)
TokenId = Annotated[int, Field(ge=0)]
TokenKey = Annotated[str, Field(pattern=r"^[0-9]+$")]             # a token id as a JSON object's key
Bias = Annotated[float, Field(ge=-100, le=100, **NUM)]
# (a string field has no pydantic length limit: pydantic refuses a constrained string that holds a
# lone surrogate as "not a string"; the engine refuses an empty one, and names the surrogate)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool | None = _f("true or false: one last chunk carries the usage")
    continuous_usage_stats: bool | None = _f("true or false: with include_usage, every chunk carries "
                                             "the usage so far (vLLM's)")


class ResponseFormat(Strict):
    type: Literal["text"] = Field(description='"text" (JSON modes are not implemented)')


class TextPart(Strict):
    type: Literal["text"] = Field(description='"text" (other parts are not implemented)')
    text: str


class ChatMessage(Strict):
    role: str
    content: Union[str, list[TextPart]] = Field(description='a string or a list of {"type": "text", "text": str}')


class SamplingFields(Strict):
    """The fields both endpoints take (vLLM's SamplingParams, and how to stream)."""
    model: str | None = _f("a string: the served model's name (GET /v1/models)")
    max_tokens: int | None = _f("an integer >= 1", ge=1)
    temperature: float | None = _f("a number >= 0 (0 = greedy)", ge=0, **NUM)
    top_p: float | None = _f("a number in (0, 1]", gt=0, le=1, **NUM)
    top_k: int | None = _f("an integer: -1 or 0 (off) or >= 1", ge=-1)
    min_p: float | None = _f("a number in [0, 1]", ge=0, le=1, **NUM)
    seed: int | None = _f(f"an integer in [{INT64[0]}, {INT64[1]}] (int64)", ge=INT64[0], le=INT64[1])
    stop: Union[str, list[str]] | None = _f("a non-empty string or a list of non-empty strings")
    n: int | None = _f("an integer >= 1", ge=1)
    presence_penalty: float | None = _f("a number in [-2, 2]", ge=-2, le=2, **NUM)
    frequency_penalty: float | None = _f("a number in [-2, 2]", ge=-2, le=2, **NUM)
    repetition_penalty: float | None = _f("a number > 0 (1 = off)", gt=0, **NUM)
    stream: bool | None = _f("true or false")
    stream_options: StreamOptions | None = _f('{"include_usage": true|false, "continuous_usage_stats": true|false}, '
                                              "with stream: true")
    ignore_eos: bool | None = _f("true or false")
    min_tokens: int | None = _f("an integer >= 0", ge=0)
    stop_token_ids: list[TokenId] | None = _f("a list of token ids (integers >= 0)")
    include_stop_str_in_output: bool | None = _f("true or false")
    return_token_ids: bool | None = _f("true or false: each choice also carries its token ids, and the "
                                       "response its prompt's")
    user: str | None = _f("a string (a label: the server does not use it)")
    # vLLM's: the engine applies them (l4_sampler/params.py); ids it checks against the vocabulary
    logit_bias: dict[TokenKey, Bias] | None = _f('{"token id": bias in [-100, 100], ...}: added to those tokens\' '
                                                 "logits")
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = _f(
        "a non-empty list of token ids: every other token is banned")
    bad_words: list[str] | None = _f("a list of words (non-blank strings): their last token is banned where the "
                                     "output ends with the rest of one")
    skip_special_tokens: bool | None = _f("true or false: special tokens left out of the text (default true)")
    spaces_between_special_tokens: bool | None = _f("true or false (default true; a slow tokenizer's option)")
    truncate_prompt_tokens: int | None = _f("-1 (max_model_len) or an integer >= 1: keep the prompt's last k tokens",
                                            ge=-1)
    prompt_logprobs: int | None = _f(f"an integer in [0, {MAX_LOGPROBS}], without stream: each prompt token's "
                                     "logprob and the top ones", ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _common(self):
        if self.prompt_logprobs is not None and self.stream:      # vLLM's refusal (it lets 0 through, unsent)
            raise refuse("prompt_logprobs", "is not available with stream: true (vLLM's rule): drop one of them")
        if self.stream_options is not None and self.stream_options.model_fields_set and not self.stream:
            raise refuse("stream_options", "is only allowed with stream: true")
        return self


class CompletionRequest(SamplingFields):
    """POST /v1/completions: OpenAI's legacy completions, with vLLM's extra sampling fields."""
    prompt: Union[str, Annotated[list[TokenId], Field(min_length=1)],
                  Annotated[list[str], Field(min_length=1)],
                  Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]] = Field(
        description="a non-empty string, a non-empty list of token ids (integers >= 0), or a non-empty list of either")
    logprobs: int | None = _f(f"an integer in [0, {MAX_LOGPROBS}]", ge=0, le=MAX_LOGPROBS)
    echo: bool | None = _f("true or false: the text starts with the prompt")
    best_of: int | None = _f("an integer equal to n (best_of > n is not implemented)", ge=1)
    suffix: None = _f("null (suffix / insertion is not implemented)")

    @model_validator(mode="after")
    def _completion(self):
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise refuse("best_of", f"must equal n ({self.n or 1}): best_of > n is not implemented")
        return self


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: messages rendered by the model's chat template."""
    messages: Annotated[list[ChatMessage], Field(min_length=1)] = Field(
        description='a non-empty list of {"role": str, "content": str or a list of {"type": "text", "text": str}}')
    logprobs: bool | None = _f("true or false")
    top_logprobs: int | None = _f(f"an integer in [0, {MAX_LOGPROBS}], with logprobs: true", ge=0, le=MAX_LOGPROBS)
    max_completion_tokens: int | None = _f("an integer >= 1", ge=1)
    response_format: ResponseFormat | None = _f('{"type": "text"} (JSON modes are not implemented)')
    tools: Annotated[list[Any], Field(max_length=0)] | None = _f("[] or absent (tool calling is not implemented)")
    tool_choice: Literal["none"] | None = _f('"none" or absent (tool calling is not implemented)')

    @model_validator(mode="after")
    def _chat(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise refuse("top_logprobs", "needs logprobs: true")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise refuse("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
        return self


class ErrorBody(BaseModel):
    message: str = Field(description="one line: what is wrong, and how to fix it")
    type: str = Field(description='"invalid_request_error", "rate_limit_exceeded" or "server_error"')
    param: str | None = Field(description="the request's field at fault, if one is")
    code: str | None = Field(description='"model_not_found", "rate_limit_exceeded" or null')


class ErrorResponse(BaseModel):
    """Every refusal's body (errors.py), OpenAI's shape."""
    error: ErrorBody


#: what the routes answer besides 200 (/docs shows it; FastAPI's own 422 is never sent)
ERRORS = {"4XX": {"model": ErrorResponse, "description": "a bad request: 400 (a field, named in param), 404 (no such "
                  "model), 415 (not JSON), 429 (too many in flight: retry)"},
          "5XX": {"model": ErrorResponse, "description": "500: this request met a bug; 503: the engine core died"}}


def _own(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(model.model_fields) - frozenset(SamplingFields.model_fields)


#: the field names of each body (tests/l10_fuzz_bodies.py mutates bodies with them)
_SAMPLING = frozenset(SamplingFields.model_fields)
_COMPLETIONS = _own(CompletionRequest)
_CHAT = _own(ChatCompletionRequest)
MODELS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest}
