"""Request bodies of the OpenAI API -> what the engine takes, every field checked.

A field the server does not implement is refused (400, naming it), never ignored: a client that
sends ``logit_bias`` or ``tools`` and gets an answer would believe they were honoured. The fields:

    both endpoints   model, max_tokens, temperature, top_p, top_k, min_p, seed, stop, n,
                     presence_penalty, frequency_penalty, repetition_penalty, stream,
                     stream_options.include_usage, ignore_eos, min_tokens, stop_token_ids,
                     include_stop_str_in_output, return_token_ids (vLLM's: each choice also
                     carries its token ids), user (accepted, unused: it is only a label)
    /v1/completions  prompt (text, ids, or a list of either), logprobs (0..20), echo (false),
                     best_of (= n), suffix (null), logit_bias (null or {})
    /v1/chat/...     messages, logprobs (bool) + top_logprobs (0..20), max_completion_tokens,
                     response_format ({"type": "text"}), tools / tool_choice (none)

Defaults are OpenAI's: max_tokens 16 for completions; for chat, the room the prompt leaves (vLLM).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from l4_sampler.params import SamplingParams
from plumbing.errors import UserError

MAX_LOGPROBS = 20


class ApiError(Exception):
    """An error the client gets as OpenAI's JSON: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


def from_user_error(e: UserError, default_param: str) -> ApiError:
    """The engine's own check (SamplingParams, a prompt too long ...) as a 400 naming the field."""
    m = re.search(r"SamplingParams\.(\w+)", str(e))      # (search: "prompt 2: ..." names one of a list)
    if m:
        return ApiError(400, str(e), m.group(1))
    m = re.search(r"prompt \((\d+) tokens\) \+ max_tokens \(\d+\) = \d+ exceeds .* = (\d+) tokens", str(e))
    if m and int(m.group(1)) < int(m.group(2)):            # the prompt fits: max_tokens asked too much
        return ApiError(400, str(e), "max_tokens")
    return ApiError(400, str(e), default_param)


@dataclass
class Parsed:
    prompts: list                    # each a string or {"prompt_token_ids": [...]}
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    fill_max_tokens: bool = False    # max_tokens: whatever room the prompt leaves
    model: str | None = None
    return_token_ids: bool = False
    extra: dict = field(default_factory=dict)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


# name -> (check, what it must be). A None value means "the default" for every optional field.
_SAMPLING = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "max_tokens": (_is_int, "an integer >= 1"),
    "temperature": (_is_num, "a number >= 0"),
    "top_p": (_is_num, "a number in (0, 1]"),
    "top_k": (_is_int, "an integer: -1 or 0 (off) or >= 1"),
    "min_p": (_is_num, "a number in [0, 1]"),
    "seed": (_is_int, "an integer"),
    "stop": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) and s for s in v)),
             "a string or a list of non-empty strings"),
    "n": (_is_int, "an integer >= 1"),
    "presence_penalty": (_is_num, "a number in [-2, 2]"),
    "frequency_penalty": (_is_num, "a number in [-2, 2]"),
    "repetition_penalty": (_is_num, "a number > 0"),
    "stream": (lambda v: isinstance(v, bool), "true or false"),
    "stream_options": (lambda v: isinstance(v, dict) and set(v) <= {"include_usage", "continuous_usage_stats"}
                       and all(isinstance(x, bool) for x in v.values()), '{"include_usage": true|false}'),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "min_tokens": (_is_int, "an integer >= 0"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(_is_int(t) for t in v), "a list of integers"),
    "include_stop_str_in_output": (lambda v: isinstance(v, bool), "true or false"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "return_token_ids": (lambda v: isinstance(v, bool), "true or false"),
}
_COMPLETIONS = {
    "prompt": (lambda v: True, "a string, a list of token ids, or a list of either"),
    "logprobs": (lambda v: _is_int(v) and 0 <= v <= MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]"),
    "echo": (lambda v: v is False, "false (echoing the prompt is not implemented)"),
    "best_of": (_is_int, "equal to n (best_of > n is not implemented)"),
    "suffix": (lambda v: False, "null (suffix / insertion is not implemented)"),
    "logit_bias": (lambda v: v == {}, "null or {} (logit_bias is not implemented)"),
}
_CHAT = {
    "messages": (lambda v: True, 'a non-empty list of {"role": ..., "content": ...}'),
    "logprobs": (lambda v: isinstance(v, bool), "true or false"),
    "top_logprobs": (lambda v: _is_int(v) and 0 <= v <= MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]"),
    "max_completion_tokens": (_is_int, "an integer >= 1"),
    "response_format": (lambda v: v == {"type": "text"}, '{"type": "text"} (JSON modes are not implemented)'),
    "tools": (lambda v: v == [], "absent (tool calling is not implemented)"),
    "tool_choice": (lambda v: v == "none", '"none" (tool calling is not implemented)'),
}


def _check_fields(body, table: dict) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(table))
    if unknown:
        raise bad(unknown[0], f"unknown parameter (this server takes: {', '.join(sorted(table))})")
    for name, value in body.items():
        check, what = table[name]
        if value is not None and not check(value):
            raise bad(name, f"must be {what}, got {str(value)[:60]!r}")
    return {k: v for k, v in body.items() if v is not None}


def _params(b: dict, max_tokens: int, logprobs: int | None) -> SamplingParams:
    names = ("temperature", "top_p", "top_k", "min_p", "seed", "n", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids", "include_stop_str_in_output")
    kw = {k: b[k] for k in names if k in b}
    if "stop" in b:
        kw["stop"] = [b["stop"]] if isinstance(b["stop"], str) else list(b["stop"])
    try:
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **kw)
    except UserError as e:
        raise from_user_error(e, "max_tokens") from None


def _prompts(p) -> list:
    """OpenAI's four prompt forms: "text", [ids], ["text", ...], [[ids], ...]."""
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        return [{"prompt_token_ids": list(p)}]
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        return list(p)
    if isinstance(p, list) and p and all(isinstance(x, list) and x and all(_is_int(t) for t in x) for x in p):
        return [{"prompt_token_ids": list(x)} for x in p]
    raise bad("prompt", f"must be a non-empty string, a list of token ids, or a list of either; got {str(p)[:60]!r}")


def _stream(b: dict) -> tuple[bool, bool]:
    stream, opts = b.get("stream", False), b.get("stream_options") or {}
    if opts and not stream:
        raise bad("stream_options", "is only allowed with stream: true")
    return stream, opts.get("include_usage", False)


def parse_completion(body) -> Parsed:
    b = _check_fields(body, {**_SAMPLING, **_COMPLETIONS})
    if "prompt" not in b:
        raise bad("prompt", "is required")
    if "best_of" in b and b["best_of"] != b.get("n", 1):
        raise bad("best_of", "must equal n (best_of > n is not implemented)")
    stream, usage = _stream(b)
    params = _params(b, b.get("max_tokens", 16), b.get("logprobs"))
    return Parsed(_prompts(b["prompt"]), params, stream, usage, model=b.get("model"),
                  return_token_ids=b.get("return_token_ids", False))


def chat_messages(messages) -> list[dict]:
    """Messages with string content; OpenAI's list-of-parts content is joined when every part is text."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", 'must be a non-empty list of {"role": ..., "content": ...}')
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and all(isinstance(x, dict) and x.get("type") == "text"
                                             and isinstance(x.get("text"), str) for x in content):
            content = "".join(x["text"] for x in content)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise bad("messages", f'each message must be {{"role": str, "content": str or text parts}}, '
                                  f"got {str(m)[:60]!r}")
        out.append({"role": m["role"], "content": content})
    return out


def parse_chat(body) -> Parsed:
    b = _check_fields(body, {**_SAMPLING, **_CHAT})
    messages = chat_messages(b.get("messages"))
    if "top_logprobs" in b and not b.get("logprobs"):
        raise bad("top_logprobs", "needs logprobs: true")
    if "max_tokens" in b and "max_completion_tokens" in b:
        raise bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    max_tokens = b.get("max_completion_tokens", b.get("max_tokens"))
    stream, usage = _stream(b)
    params = _params(b, max_tokens or 1, b.get("top_logprobs", 0) if b.get("logprobs") else None)
    return Parsed([], params, stream, usage, fill_max_tokens=max_tokens is None, model=b.get("model"),
                  return_token_ids=b.get("return_token_ids", False), extra={"messages": messages})
