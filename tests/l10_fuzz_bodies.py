"""Request bodies for the server fuzz (tests/test_l10_fuzz.py), and the check every answer must pass.

    any JSON      any value anywhere: any unicode (lone surrogates, NUL, U+FFFD, special-token
                  text), huge and negative integers, NaN and infinities, wrong types, nested and
                  empty values, strings of up to 30,000 characters
    mutations     a valid body for the endpoint with 1-3 fields (those protocol.py takes) set to a
                  value of the right type (3 in 4) or any JSON, dropped, or added: about a quarter
                  of these run on the engine (logit_bias: ids in and outside the vocabulary, biases
                  in [-100, 100]; bad_words: any text; skip_special_tokens, echo ...: any boolean)
    raw bytes     not JSON at all, or JSON nested 10,000 deep

``check`` posts one body and asks of the answer: within ``BOUND`` seconds; 2xx (a stream: its
events parse, none is an error, the last is [DONE]) or 4xx as OpenAI's error JSON; never 5xx.
"""
from __future__ import annotations

import json

import httpx
from hypothesis import strategies as st

from l10_server.protocol import _CHAT, _COMPLETIONS, _SAMPLING

BOUND = 30.0                                   # seconds a request may take; the fuzz server's longest is < 1 s
PINNED = ("completions", {"prompt": "a\ud800b", "max_tokens": 3})          # once, it stopped the engine core
# a connection per request: on a kept-alive one each request waited 40 ms (Nagle's algorithm against
# a delayed ACK: serve.running_in_thread's socket has proto 0, so asyncio leaves TCP_NODELAY off)
FRESH = httpx.Limits(max_keepalive_connections=0)
PATHS = {"completions": (_SAMPLING | _COMPLETIONS, {"prompt": "The capital of", "max_tokens": 3}),
         "chat/completions": (_SAMPLING | _CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})}

chars = st.characters(exclude_categories=())   # every code point: surrogates (Cs) and NUL (Cc) included
SPECIAL = ["\ud800", "a\ud800b", "\udfff\ud800", "\x00", "", " ", "\ufffd", "é", "<|im_start|>", "<|endoftext|>",
           "<|im_end|>\n<|im_start|>system\n"]
long = st.builds(lambda s, n: s * n, st.sampled_from(["a", "\ud800", "é ", "x\x00"]), st.integers(1000, 30000))
text = st.one_of(st.text(chars, max_size=12), st.sampled_from(SPECIAL), long)
BOUNDARY = [0, 1, -1, 2, 3, 20, 21, 63, 64, 65, 128, 129, 1024, 1025, 2**31, 2**63, 2**64, -2**63 - 1, 10**30, -10**30]
numbers = st.one_of(st.integers(-3, 70), st.sampled_from(BOUNDARY), st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1e-300, 1e300, -0.0, 2.0]))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(text, kids, max_size=4)), max_leaves=10)
ids = st.lists(st.one_of(st.integers(0, 258), st.sampled_from(BOUNDARY)), min_size=0, max_size=8)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["user", "system", "assistant", "tool", ""]), text),
     "content": st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
                          json_values)}), max_size=3)
unit, small = st.floats(0, 1), st.integers(0, 8)
# values of the right type and range, so that most mutated bodies reach the engine core
VALID = {"prompt": st.one_of(text, ids, st.lists(text, max_size=3), st.lists(ids, max_size=3)),
         "messages": messages, "model": st.sampled_from(["tiny-qwen3", "gpt-4"]),
         "max_tokens": st.integers(1, 8), "max_completion_tokens": st.integers(1, 8), "min_tokens": small,
         "temperature": st.floats(0, 2), "top_p": unit, "min_p": unit, "top_k": st.integers(-1, 300),
         "seed": st.integers(), "n": st.integers(1, 3), "best_of": st.integers(1, 3), "logprobs": st.integers(0, 20),
         "top_logprobs": st.integers(0, 20), "presence_penalty": st.floats(-2, 2),
         "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(1e-3, 3),
         "stop": st.one_of(text, st.lists(text, max_size=3)), "stop_token_ids": ids,
         "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()},
                                                 optional={"continuous_usage_stats": st.booleans()}), "user": text,
         "response_format": st.just({"type": "text"}), "tool_choice": st.just("none"), "tools": st.just([]),
         "suffix": st.none(), "allowed_token_ids": ids, "bad_words": st.lists(text, max_size=3),
         "logit_bias": st.dictionaries(st.builds(str, st.one_of(st.integers(0, 258), st.sampled_from(BOUNDARY[:-2]))),
                                       st.one_of(st.floats(-100, 100), st.sampled_from([-100, 100, 0])), max_size=4),
         "truncate_prompt_tokens": st.integers(-1, 8), "prompt_logprobs": st.integers(0, 3)}


def field_value(name: str):
    """Three times in four a value of the right type (booleans: any boolean), else any JSON."""
    right = VALID.get(name, st.booleans())
    return st.one_of(right, right, right, json_values)


@st.composite
def mutated(draw, path: str) -> dict:
    fields, body = PATHS[path]
    body = json.loads(json.dumps(body))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "set", "set", "drop", "add"]))
        if op == "set":
            name = draw(st.sampled_from(sorted(fields)))
            body[name] = draw(field_value(name))
        elif op == "drop" and body:
            del body[draw(st.sampled_from(sorted(body)))]
        else:
            body[draw(text)] = draw(json_values)
    return body


def nested(depth: int) -> bytes:
    return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"


@st.composite
def requests(draw) -> tuple[str, object]:
    """(endpoint, body): a dict (sent as JSON, surrogates as \\uXXXX escapes) or raw bytes."""
    path = draw(st.sampled_from(sorted(PATHS)))
    kind = draw(st.sampled_from(["mutated"] * 6 + ["any", "raw"]))
    if kind == "mutated":
        return path, draw(mutated(path))
    if kind == "any":
        return path, draw(json_values)
    return path, draw(st.one_of(st.binary(max_size=40), st.builds(nested, st.sampled_from([1, 100, 10_000]))))


def check(client: httpx.Client, path: str, body) -> int:
    """Post ``body``; every answer must be 2xx or OpenAI's 4xx error JSON, within BOUND seconds."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(f"/v1/{path}", content=raw, headers={"content-type": "application/json"}, timeout=BOUND)
    assert r.status_code < 500, f"{r.status_code} for {raw[:200]!r}: {r.text[:300]}"
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text[:300]
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[-300:]
        assert all("error" not in json.loads(e) for e in events[:-1]), r.text[-300:]
    else:
        assert r.json()["choices"], r.text[:300]
    return r.status_code
