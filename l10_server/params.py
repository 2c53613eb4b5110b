"""A checked request body (protocol.py) -> what the engine takes: the prompts and one SamplingParams.

    completions   prompt "text" | [ids] | ["text", ...] | [[ids], ...]  -> one engine prompt each
                  max_tokens: 16 when left out (OpenAI's default)
    chat          messages -> the chat template (api.py renders them with the front tokenizer)
                  max_tokens / max_completion_tokens: the room the prompt leaves when left out (vLLM)

The engine checks again what only it can know (a prompt too long for ``max_model_len``, token ids
outside the vocabulary); ``from_user_error`` turns its refusal into a 400 naming the field.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from l4_sampler.params import SamplingParams
from plumbing.errors import UserError

from .errors import ApiError
from .protocol import _SAMPLING, ChatCompletionRequest, CompletionRequest, SamplingFields

#: the body's fields that SamplingParams takes under the same name
ENGINE_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "n", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output",
                 "stop", "logit_bias", "allowed_token_ids", "bad_words", "skip_special_tokens",
                 "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs")
#: JSON's spelling -> SamplingParams' (a JSON object's keys are strings)
CONVERT = {"stop": lambda s: [s] if isinstance(s, str) else list(s),
           "logit_bias": lambda d: {int(k): v for k, v in d.items()}}


@dataclass
class Parsed:
    prompts: list                    # each a string or {"prompt_token_ids": [...]}
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False      # one last chunk carries the usage
    continuous_usage: bool = False   # ... and every chunk the usage so far
    model: str | None = None
    return_token_ids: bool = False
    echo: bool = False
    extra: dict = field(default_factory=dict)


def from_user_error(e: UserError, default_param: str) -> ApiError:
    """The engine's own check (SamplingParams, a prompt too long ...) as a 400 naming the field."""
    m = re.search(r"SamplingParams\.(\w+)", str(e))      # (search: "prompt 2: ..." names one of a list)
    if m:
        return ApiError(400, str(e), m.group(1))
    m = re.search(r"prompt \((\d+) tokens\) \+ max_tokens \(\d+\) = \d+ exceeds .* = (\d+) tokens", str(e))
    if m and int(m.group(1)) < int(m.group(2)):            # the prompt fits: max_tokens asked too much
        return ApiError(400, str(e), "max_tokens")
    m = re.match(r"(?:prompt \d+: )?(\w+)\b", str(e))       # "stop_token_ids [300] are outside ..."
    if m and m.group(1) in _SAMPLING and m.group(1) != "model":
        return ApiError(400, str(e), m.group(1))
    return ApiError(400, str(e), default_param)


def sampling_params(body: SamplingFields, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    kw = {}
    for name in ENGINE_FIELDS:
        value = getattr(body, name)
        if value is not None:
            kw[name] = CONVERT[name](value) if name in CONVERT else value
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kw)
    except UserError as e:
        raise from_user_error(e, "max_tokens") from None


def _stream(body: SamplingFields) -> dict:
    opts = body.stream_options
    usage = bool(opts and opts.include_usage)
    return dict(stream=bool(body.stream), include_usage=usage,
                continuous_usage=usage and bool(opts.continuous_usage_stats), model=body.model,
                return_token_ids=bool(body.return_token_ids))


def prompts(p) -> list:
    """OpenAI's four prompt forms (checked by the model): "text", [ids], ["text", ...], [[ids], ...]."""
    if isinstance(p, str):
        return [p]
    if isinstance(p[0], int):
        return [{"prompt_token_ids": list(p)}]
    if isinstance(p[0], str):
        return list(p)
    return [{"prompt_token_ids": list(x)} for x in p]


def parse_completion(body: CompletionRequest) -> Parsed:
    params = sampling_params(body, body.max_tokens or 16, body.logprobs)
    if body.echo and body.logprobs is not None and params.prompt_logprobs is None:   # vLLM: echo's logprobs
        params = dataclasses.replace(params, prompt_logprobs=body.logprobs)
    return Parsed(prompts(body.prompt), params, echo=bool(body.echo), **_stream(body))


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    """Messages with string content; a list of text parts is joined."""
    return [{"role": m.role, "content": m.content if isinstance(m.content, str) else "".join(x.text for x in m.content)}
            for m in body.messages]


def parse_chat(body: ChatCompletionRequest) -> Parsed:
    max_tokens = body.max_completion_tokens or body.max_tokens
    params = sampling_params(body, max_tokens, (body.top_logprobs or 0) if body.logprobs else None)
    return Parsed([], params, extra={"messages": chat_messages(body)},
                  **_stream(body))
