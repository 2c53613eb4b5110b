"""Stage 10 against vLLM's own server tests: their assertions, ported to this server (tiny Qwen3 on
the CPU, one server for the module) and the real ``openai`` client. Each test names the vLLM file it
ports (github.com/vllm-project/vllm, ``tests/entrypoints/openai/``) and the vLLM test; where this
server differs on purpose (a field it refuses rather than ignores, a message worded for people), the
test asserts what it does instead and says why.

Expected values come from outside the server: the tokenizer (prompt lengths, decoded text),
pyproject.toml (the version), the request itself. Consistency checks (a stream adds up to the
whole answer) compare the server with itself, as vLLM's do."""
import json
import tomllib
from collections import defaultdict
from pathlib import Path

import httpx
import openai
import pytest

from l10_serving import running_server, wait_idle
from plumbing.tiny import tiny_checkpoint

MODEL = "tiny-qwen3"
ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "what is 1+1?"}]


@pytest.fixture(scope="module")
def server():
    with running_server(MODEL) as (base, _):
        yield base
        wait_idle(base)


@pytest.fixture(scope="module")
def tok():
    from l1_dense.checkpoint import load_tokenizer
    return load_tokenizer(tiny_checkpoint("qwen3"))


def _client(base, **kw):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=60, max_retries=0, **kw)


def _refused(call, param: str | None, status: int = 400) -> dict:
    """``call`` gets OpenAI's error JSON with ``status`` naming ``param``; returns the error."""
    with pytest.raises(openai.APIStatusError) as e:
        call()
    err = e.value.body
    assert e.value.status_code == status and set(err) == {"message", "type", "param", "code"}, err
    assert err["param"] == param and "\n" not in err["message"], err
    return err


def _chat_ids(tok, messages) -> list[int]:
    """The prompt's ids as the chat template renders them (the tokenizer's own, not the server's)."""
    return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]


def _post(base, path, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    kw.setdefault("headers", {"content-type": "application/json"})
    return httpx.post(f"{base}{path}", content=content, timeout=60, **kw)


# ---- basic/test_basic.py ---------------------------------------------------------------------

def test_version_health_and_a_form_body_as_vllm_test_basic(server):
    """vLLM basic/test_basic.py: test_show_version ({"version": ...}), test_check_health (200),
    test_request_wrong_content_type (a form body is an APIStatusError: here 415, OpenAI's JSON).
    Not ported: test_server_load (no /load), test_request_cancellation (test_l10_server.py's
    disconnect test frees the blocks of a client that hung up)."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert httpx.get(f"{server}/version", timeout=10).json() == {"version": version}
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200
    c = _client(server)
    err = _refused(lambda: c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10,
        extra_headers={"Content-Type": "application/x-www-form-urlencoded"}), None, status=415)
    assert "application/json" in err["message"]


# ---- completion/test_completion.py -----------------------------------------------------------

def test_single_completion_and_logprobs_as_vllm_test_completion(server, tok):
    """vLLM completion/test_completion.py: test_single_completion, test_no_logprobs,
    test_zero_logprobs, test_some_logprobs, test_too_many_completion_logprobs. Differs: no
    usage.prompt_tokens_details (vLLM's --enable-prompt-tokens-details); some_logprobs' top
    count: the top logprobs are keyed by token text, and ids whose text is the same (U+FFFD: the
    byte tokens above 127 of this byte-level model) share a key, so 5 asked may show fewer."""
    c = _client(server)
    prompt = "Hello, my name is"
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0)
    assert r.id is not None and len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert len(r.choices[0].text) >= 5
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert (r.usage.completion_tokens, r.usage.prompt_tokens, r.usage.total_tokens) == (5, n_prompt, n_prompt + 5)
    ids = c.completions.create(model=MODEL, prompt=[0, 0, 0, 0, 0], max_tokens=5, temperature=0.0)
    assert len(ids.choices[0].text) >= 1 and (ids.choices[0].model_extra or {}).get("prompt_logprobs") is None
    kw = dict(model=MODEL, prompt=[0, 0, 0, 0, 0], max_tokens=5, temperature=0.0)
    assert c.completions.create(logprobs=None, **kw).choices[0].logprobs is None
    zero = c.completions.create(logprobs=0, **kw).choices[0].logprobs
    assert zero.token_logprobs is not None and len(zero.top_logprobs[0]) == 1
    some = c.completions.create(logprobs=5, **kw).choices[0].logprobs
    assert all(1 <= len(top) <= 6 for top in some.top_logprobs)
    assert max(len(top) for top in some.top_logprobs) >= 5
    _refused(lambda: c.completions.create(logprobs=21, **kw), "logprobs")
    _refused(lambda: list(c.completions.create(logprobs=30, stream=True, **kw)), "logprobs")
    assert len(c.completions.create(**kw).choices[0].text) >= 0          # the server still works


def test_completion_streaming_and_batches_as_vllm_test_completion(server):
    """vLLM completion/test_completion.py: test_completion_streaming (the chunks add up to the
    whole text, one finish_reason, the last), test_batch_completions (two equal prompts give equal
    texts, text and token ids, whole and streamed). Differs: the n=2 part uses use_beam_search,
    which this server refuses by name (no beam search)."""
    c = _client(server)
    kw = dict(model=MODEL, prompt="What is an LLM?", max_tokens=5, temperature=0.0)
    single = c.completions.create(**kw).choices[0].text
    chunks = list(c.completions.create(stream=True, **kw))
    assert [ch.choices[0].finish_reason is not None for ch in chunks].count(True) == 1
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].choices[0].text
    assert "".join(ch.choices[0].text for ch in chunks) == single
    for prompts in (["Hello, my name is"] * 2, [[0, 0, 0, 0, 0]] * 2):
        batch = c.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0.0)
        assert len(batch.choices) == 2 and batch.choices[0].text == batch.choices[1].text
        texts = [""] * 2
        for chunk in c.completions.create(model=MODEL, prompt=prompts, max_tokens=5, temperature=0.0, stream=True):
            assert len(chunk.choices) == 1
            texts[chunk.choices[0].index] += chunk.choices[0].text
        assert texts[0] == texts[1] == batch.choices[0].text
    _refused(lambda: c.completions.create(model=MODEL, prompt="x", n=2, max_tokens=5,
                                          extra_body={"use_beam_search": True}), "use_beam_search")


def test_parallel_sampling_as_vllm_test_completion(server):
    """vLLM completion/test_completion.py: test_parallel_no_streaming, test_parallel_streaming:
    n=3 at temperature 1 gives 3 choices, indexed 0..2, each with a finish_reason, all different,
    none longer than max_tokens. Differs: vLLM also asserts the three end at different lengths
    (its model stops at EOS); the tiny model runs each to max_tokens, so that one is left out."""
    c = _client(server)
    kw = dict(model=MODEL, prompt="What is an LLM?", max_tokens=20, n=3, temperature=1.0, seed=42)
    whole = c.completions.create(logprobs=0, **kw)
    assert [ch.index for ch in whole.choices] == [0, 1, 2]
    assert all(ch.finish_reason is not None and len(ch.logprobs.tokens) <= 20 for ch in whole.choices)
    assert len({ch.text for ch in whole.choices}) == 3
    chunks, finished = defaultdict(list), 0
    for chunk in c.completions.create(stream=True, **kw):
        chunks[chunk.choices[0].index].append(chunk.choices[0].text)
        finished += chunk.choices[0].finish_reason is not None
    assert finished == 3 and all(len(v) <= 20 for v in chunks.values())
    assert len({"".join(v) for v in chunks.values()}) == 3


def _stream(c, endpoint: str, **kw) -> list:
    create = c.chat.completions.create if endpoint == "chat" else c.completions.create
    return list(create(stream=True, **kw))


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_stream_options_as_vllm(server, endpoint):
    """vLLM completion/test_completion.py: test_completion_stream_options, and
    chat_completion/test_chat.py: test_chat_completion_stream_options: usage only where asked
    (include_usage: one last chunk with no choices; with continuous_usage_stats too: every chunk,
    its completion_tokens growing, the last one 10 with min_tokens 10), and stream_options
    without stream: true is a 400."""
    c = _client(server)
    kw = (dict(messages=MESSAGES, max_completion_tokens=10) if endpoint == "chat"
          else dict(prompt="What is the capital of France?", max_tokens=5))
    kw.update(model=MODEL, temperature=0.0)
    for opts in ({"include_usage": False, "continuous_usage_stats": False},
                 {"include_usage": False, "continuous_usage_stats": True}, {}):
        assert all(ch.usage is None for ch in _stream(c, endpoint, stream_options=opts, **kw))
    chunks = _stream(c, endpoint, stream_options={"include_usage": True, "continuous_usage_stats": False}, **kw)
    assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-2].choices[0].finish_reason is not None
    last = chunks[-1].usage
    assert chunks[-1].choices == [] and last.prompt_tokens > 0 and last.completion_tokens > 0
    assert last.total_tokens == last.prompt_tokens + last.completion_tokens
    chunks = _stream(c, endpoint, stream_options={"include_usage": True, "continuous_usage_stats": True},
                     **dict(kw, extra_body={"min_tokens": 5 if endpoint == "completions" else 10}))
    seen = 0
    for ch in chunks:
        u = ch.usage
        assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert u.completion_tokens > seen or (not ch.choices and u.completion_tokens == seen)
        seen = u.completion_tokens
    assert seen == (5 if endpoint == "completions" else 10) and chunks[-1].choices == []
    create = c.chat.completions.create if endpoint == "chat" else c.completions.create
    for opts in ({"include_usage": None}, {"include_usage": True}, {"continuous_usage_stats": None},
                 {"continuous_usage_stats": True}):
        _refused(lambda: create(stream=False, stream_options=opts, **kw), "stream_options")


def test_echo_and_refusals_as_vllm_test_completion(server, tok):
    """vLLM completion/test_completion.py: test_echo_logprob_completion (the text starts with the
    prompt, for text and for token ids), test_prompt_logprobs_completion (-1 is a 400; none asked:
    none given), test_invalid_json_schema / _regex / _grammar (a 400). Differs: echo with logprobs
    needs the prompt's logprobs, which this server does not return yet, so it is refused by name,
    as prompt_logprobs is (0 and 1 too) and structured_outputs (not implemented)."""
    c = _client(server)
    for prompt in ("Hello, my name is", [0, 0, 0, 0, 0]):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0, echo=True)
        text = tok.decode(prompt) if isinstance(prompt, list) else prompt
        plain = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0)
        assert r.choices[0].text == text + plain.choices[0].text
        err = _refused(lambda: c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, logprobs=1),
                       "echo")
        assert "logprobs" in err["message"]
    prompts = ["A robot may not injure another robot", "My name is"]
    for k in (-1, 0, 1):
        _refused(lambda: c.completions.create(model=MODEL, prompt=prompts, extra_body={"prompt_logprobs": k}),
                 "prompt_logprobs")
    r = c.completions.create(model=MODEL, prompt=prompts, max_tokens=3)
    assert all((ch.model_extra or {}).get("prompt_logprobs") is None for ch in r.choices)
    _refused(lambda: c.completions.create(model=MODEL, prompt="x", extra_body={"structured_outputs": {"regex": "[.*"}}),
             "structured_outputs")


# ---- chat_completion/test_chat.py ------------------------------------------------------------

def test_chat_logprobs_and_a_session_as_vllm_test_chat(server, tok):
    """vLLM chat_completion/test_chat.py: test_no_logprobs_chat, test_zero_logprobs_chat,
    test_some_logprobs_chat, test_too_many_chat_logprobs, test_single_chat_session (usage: 5
    generated, the prompt as the chat template renders it; a second turn), test_prompt_logprobs_chat
    (-1 a 400; none asked: none given). Differs: prompt_logprobs 0 and 1 are refused by name (not
    implemented yet); vLLM's content has at least 5 characters for 5 tokens, but this model's
    byte tokens may join into fewer characters, so at least 1."""
    c = _client(server)
    kw = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=5, temperature=0.0)
    assert c.chat.completions.create(logprobs=False, **kw).choices[0].logprobs is None
    zero = c.chat.completions.create(logprobs=True, top_logprobs=0, **kw).choices[0].logprobs
    assert zero.content is not None and len(zero.content[0].top_logprobs) == 0
    some = c.chat.completions.create(logprobs=True, top_logprobs=5, **kw).choices[0].logprobs
    assert len(some.content[0].top_logprobs) == 5
    _refused(lambda: list(c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10,
                                                     logprobs=True, top_logprobs=21, stream=True)), "top_logprobs")
    _refused(lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10,
                                               logprobs=True, top_logprobs=30), "top_logprobs")
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=5, logprobs=True, top_logprobs=5)
    n_prompt = len(_chat_ids(tok, MESSAGES))
    assert r.id is not None and len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage == openai.types.CompletionUsage(completion_tokens=5, prompt_tokens=n_prompt,
                                                   total_tokens=n_prompt + 5)
    assert r.choices[0].message.role == "assistant" and len(r.choices[0].message.content) >= 1
    turn = MESSAGES + [{"role": "assistant", "content": r.choices[0].message.content},
                       {"role": "user", "content": "express your result in json"}]
    assert c.chat.completions.create(model=MODEL, messages=turn, max_completion_tokens=5).choices[0].message.content \
        is not None
    for k in (-1, 0, 1):
        _refused(lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"prompt_logprobs": k}),
                 "prompt_logprobs")
    assert (r.model_extra or {}).get("prompt_logprobs") is None


def test_chat_streaming_n_and_message_forms_as_vllm_test_chat(server):
    """vLLM chat_completion/test_chat.py: test_chat_streaming (deltas add up to the whole, one
    finish_reason, the last; role "assistant"), test_chat_completion_n_parameter_non_streaming /
    _streaming / _n_with_seed / _n_equals_1, test_response_format_text, test_complex_message_content
    and test_custom_role (text parts and a custom role render as plain text does). Differs:
    test_extra_fields_allowed: a message's unknown field is refused by name here (the server
    never ignores a field), and response_format json_object / json_schema are refused (JSON modes
    are not implemented)."""
    c = _client(server)
    kw = dict(model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.0)
    whole = c.chat.completions.create(**kw).choices[0]
    chunks = list(c.chat.completions.create(stream=True, **kw))
    assert all(ch.choices[0].delta.role in (None, "assistant") for ch in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason is not None for ch in chunks].count(True) == 1
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason and chunks[-1].choices[0].delta.content
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == whole.message.content
    n3 = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=20, temperature=0.7, n=3)
    assert [ch.index for ch in n3.choices] == [0, 1, 2] and all(ch.message.content for ch in n3.choices)
    assert len({ch.message.content for ch in n3.choices}) > 1
    by_index = defaultdict(str)
    for chunk in c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=15, temperature=0.7,
                                           n=2, stream=True):
        for choice in chunk.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert sorted(by_index) == [0, 1] and all(by_index.values())
    seeded = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10, temperature=0.8,
                                       n=2, seed=42)
    assert [ch.index for ch in seeded.choices] == [0, 1]
    one = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=10, n=1)
    assert len(one.choices) == 1 and one.choices[0].index == 0
    assert c.chat.completions.create(response_format={"type": "text"}, **kw).choices[0].message.content is not None
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
        _refused(lambda: c.chat.completions.create(response_format=fmt, **kw), "response_format")
    text = [{"role": "my-custom-role", "content": "what is 1+1?"}]
    parts = [{"role": "my-custom-role", "content": [{"type": "text", "text": "what is 1+1?"}]}]
    a, b = (c.chat.completions.create(model=MODEL, messages=m, max_completion_tokens=8, temperature=0, seed=0)
            for m in (text, parts))
    assert a.choices[0].message.content == b.choices[0].message.content
    err = _refused(lambda: c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "what is 1+1?", "extra_field": "0"}]), "messages")
    assert err["message"].startswith("messages[0].extra_field: unknown field")


def test_long_seed_as_vllm_test_chat(server):
    """vLLM chat_completion/test_chat.py: test_long_seed (a seed outside int64 is a 400). Differs:
    vLLM's message is pydantic's ("less_than_equal"); here one line naming the range, in ``param``."""
    c = _client(server)
    for seed in (-2**63 - 1, 2**63, 10**30):
        err = _refused(lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES[:1], temperature=0, seed=seed),
                       "seed")
        assert str(seed) in err["message"] and "9223372036854775807" in err["message"]
    assert c.chat.completions.create(model=MODEL, messages=MESSAGES[:1], max_tokens=2, seed=2**63 - 1).choices


def test_stop_token_ids_as_vllm_test_chat_stop_token_ids_validation(server, tok):
    """vLLM chat_completion/test_chat_stop_token_ids_validation.py: the last id of the vocabulary
    is taken; one past it is a 400 whose message names the id and the vocabulary's size; a negative
    id is a 400. Here the error names stop_token_ids in ``param``."""
    c = _client(server)
    vocab = len(tok)                                   # the tiny model's vocabulary is its tokenizer's
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Testing stop token ids"}], max_tokens=5)
    assert c.chat.completions.create(extra_body={"stop_token_ids": [vocab - 1]}, **kw).choices[0].message.content \
        is not None
    err = _refused(lambda: c.chat.completions.create(extra_body={"stop_token_ids": [vocab + 1]}, **kw),
                   "stop_token_ids")
    assert str(vocab + 1) in err["message"] and str(vocab) in err["message"]
    _refused(lambda: c.chat.completions.create(extra_body={"stop_token_ids": [-1]}, **kw), "stop_token_ids")


# ---- basic/test_return_token_ids.py ----------------------------------------------------------

def test_return_token_ids_in_completions_as_vllm(server, tok):
    """vLLM basic/test_return_token_ids.py: test_basic_completion_with_emoji (prompt_token_ids and
    token_ids on the choice; the prompt's ids contain its encoding; the ids decode to the text;
    without the flag neither is there) and the streaming part of
    test_comparison_with_prompt_logprobs_and_logprobs (the first chunk carries prompt_token_ids,
    the chunks' token_ids add up). Differs: return_tokens_as_token_ids and prompt_logprobs are
    refused (not implemented), so the streamed ids are checked against the whole answer's."""
    c = _client(server)
    prompt = "Complete this sentence with emojis: I love coding 🚀"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=1)
    r = c.completions.create(extra_body={"return_token_ids": True}, **kw)
    choice = r.choices[0].model_dump()
    encoded = tok(prompt, add_special_tokens=False)["input_ids"]
    got = choice["prompt_token_ids"]
    assert any(got[i:i + len(encoded)] == encoded for i in range(len(got) - len(encoded) + 1))
    assert isinstance(choice["token_ids"], list) and len(choice["token_ids"]) > 0
    assert tok.decode(choice["token_ids"], skip_special_tokens=True).startswith(r.choices[0].text)
    without = c.completions.create(extra_body={"return_token_ids": False}, **kw).model_dump()
    assert without["choices"][0].get("token_ids") is None and without.get("prompt_token_ids") is None
    assert without["choices"][0].get("prompt_token_ids") is None
    kw = dict(model=MODEL, prompt="Tell me a short fact about Python:", max_tokens=30, temperature=0, logprobs=1,
              extra_body={"return_token_ids": True})
    chunks = list(c.completions.create(stream=True, **kw))
    first = chunks[0].choices[0].model_dump()
    assert len(first["prompt_token_ids"]) > 0
    assert all("prompt_token_ids" not in ch.choices[0].model_dump() for ch in chunks[1:])
    streamed = [t for ch in chunks for t in ch.choices[0].model_dump()["token_ids"]]
    assert streamed == c.completions.create(**kw).choices[0].model_dump()["token_ids"]
    assert [t for ch in chunks for t in ch.choices[0].logprobs.tokens] == [tok.decode([t]) for t in streamed]
    _refused(lambda: c.completions.create(**dict(kw, extra_body={"return_tokens_as_token_ids": True})),
             "return_tokens_as_token_ids")


def test_return_token_ids_in_chat_as_vllm(server, tok):
    """vLLM basic/test_return_token_ids.py: test_chat_completion_with_emoji_and_token_ids and the
    token-id half of test_chat_completion_with_tool_use: the response's prompt_token_ids decode to
    the rendered messages, the choice's token_ids to its text; streamed, the first chunk carries
    prompt_token_ids (the same ids) and no later chunk has the key at all. Differs: tools are
    refused (no tool calling)."""
    c = _client(server)
    messages = [{"role": "system", "content": "You like to use emojis in your responses."},
                {"role": "user", "content": "Repeat after me: I love cats 🐱"}]
    kw = dict(model=MODEL, messages=messages, max_tokens=20, temperature=0, extra_body={"return_token_ids": True})
    r = c.chat.completions.create(logprobs=True, **kw)
    assert "prompt_token_ids" in r.model_dump() and r.choices[0].model_dump()["token_ids"]
    prompt = tok.decode(r.model_dump()["prompt_token_ids"])
    assert "You like to use emojis in your responses" in prompt and "I love cats 🐱" in prompt
    assert r.model_dump()["prompt_token_ids"] == _chat_ids(tok, messages)
    content, ids = "", []
    chunks = list(c.chat.completions.create(stream=True, **kw))
    assert tok.decode(chunks[0].model_dump()["prompt_token_ids"]) == prompt
    for chunk in chunks[1:]:
        assert "prompt_token_ids" not in chunk.model_dump()
    for chunk in chunks:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            ids += chunk.choices[0].model_dump().get("token_ids") or []
    assert content == r.choices[0].message.content and ids == r.choices[0].model_dump()["token_ids"]
    without = c.chat.completions.create(**dict(kw, extra_body={"return_token_ids": False})).model_dump()
    assert without.get("prompt_token_ids") is None and without["choices"][0].get("token_ids") is None
    _refused(lambda: c.chat.completions.create(tools=[{"type": "function", "function": {"name": "get_weather"}}],
                                               tool_choice="auto", **kw), "tools")


# ---- completion/test_prompt_validation.py, chat_completion/test_non_object_body_validation.py --

def test_prompt_validation_as_vllm(server):
    """vLLM completion/test_prompt_validation.py: test_empty_prompt (no prompt: a 400),
    test_out_of_vocab_token_ids (a 400 about the vocabulary); chat_completion/
    test_non_object_body_validation.py (a body that is not a JSON object: a 4xx, never a 500).
    Differs: the words (vLLM: "Either prompt or prompt_embeds must be provided", "out of
    vocabulary"); prompt_embeds is refused by name (not implemented)."""
    c = _client(server)
    _refused(lambda: c.completions.create(model=MODEL, prompt=None, max_tokens=5), "prompt")
    _refused(lambda: c.completions.create(model=MODEL, prompt="x", extra_body={"prompt_embeds": []}), "prompt_embeds")
    err = _refused(lambda: c.completions.create(model=MODEL, prompt=[999999], max_tokens=5, temperature=0.0), "prompt")
    assert "vocabulary" in err["message"] and "999999" in err["message"]
    for body in (b"this is not valid json{{{", b'["not", "an", "object"]', b"42", b"null"):
        for path in ("/v1/chat/completions", "/v1/completions"):
            r = _post(server, path, body)
            assert r.status_code == 400 and r.json()["error"]["param"] is None, r.text
            assert ("not valid JSON" if body.startswith(b"this") else "must be a JSON object") in r.json()["error"]["message"]


# ---- this server's own: routes, schemas, the fields not implemented yet -----------------------

def test_unknown_routes_and_methods_get_openais_error_json_and_docs_show_the_models(server):
    """A wrong route (404) or method (405, with Allow) is OpenAI's error JSON, not FastAPI's
    {"detail": ...}; /openapi.json describes both bodies (the models' fields, the refusals as
    OpenAI's error shape, no 422: the server never sends one); /docs serves."""
    for method, path, status in (("GET", "/v1/completions", 405), ("POST", "/nope", 404), ("GET", "/v1/nope", 404)):
        r = httpx.request(method, f"{server}{path}", timeout=10)
        err = r.json()["error"]
        assert r.status_code == status and set(err) == {"message", "type", "param", "code"}, r.text
        assert f"{method} {path}" in err["message"] and "detail" not in r.json()
    assert httpx.get(f"{server}/v1/chat/completions", timeout=10).headers["allow"] == "POST"
    spec = httpx.get(f"{server}/openapi.json", timeout=10).json()
    schemas = spec["components"]["schemas"]
    assert {"prompt", "echo", "return_token_ids", "stream_options", "seed"} <= set(schemas["CompletionRequest"]["properties"])
    assert {"messages", "top_logprobs", "max_completion_tokens"} <= set(schemas["ChatCompletionRequest"]["properties"])
    assert schemas["CompletionRequest"]["additionalProperties"] is False and "error" in schemas["ErrorResponse"]["properties"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        post = spec["paths"][path]["post"]
        assert "422" not in post["responses"] and "4XX" in post["responses"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("Request")
    assert httpx.get(f"{server}/docs", timeout=10).status_code == 200


NOT_YET = [("logit_bias", {"5": 1.0}), ("allowed_token_ids", [5]), ("bad_words", ["x"]),
           ("skip_special_tokens", False), ("spaces_between_special_tokens", False), ("truncate_prompt_tokens", 3),
           ("prompt_logprobs", 1)]


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_fields_the_engine_does_not_take_yet_are_refused_in_one_line_and_their_neutral_values_pass(server, endpoint):
    """vLLM's fields that SamplingParams is gaining: each is a 400 naming it ("not implemented"),
    never ignored; its neutral value ({} for logit_bias, true for skip_special_tokens ...) passes.
    A wrong type says what the field must be, in JSON's words (true, not True)."""
    base = {"prompt": "x"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "x"}]}
    base["max_tokens"] = 2
    for name, value in NOT_YET:
        r = _post(server, f"/v1/{endpoint}", dict(base, **{name: value}))
        err = r.json()["error"]
        assert (r.status_code, err["param"]) == (400, name) and "not implemented" in err["message"], r.text
    neutral = {"logit_bias": {}, "bad_words": [], "skip_special_tokens": True, "spaces_between_special_tokens": True}
    assert _post(server, f"/v1/{endpoint}", dict(base, **neutral)).status_code == 200
    r = _post(server, f"/v1/{endpoint}", dict(base, max_tokens=True))
    assert r.json()["error"]["message"] == "max_tokens: must be an integer >= 1, got true"
    r = _post(server, f"/v1/{endpoint}", dict(base, ignore_eos="yes"))
    assert r.json()["error"]["message"] == 'ignore_eos: must be true or false, got "yes"'


def test_the_models_map_to_sampling_params_as_vllm_test_chat_unit_tests():
    """vLLM chat_completion/test_chat.py: test_chat_completion_request_n_parameter_to_sampling_params,
    _default, _various_values: a request's n reaches SamplingParams (default 1)."""
    from l10_server.params import parse_chat, parse_completion
    from l10_server.protocol import ChatCompletionRequest, CompletionRequest
    msgs = [{"role": "user", "content": "Hello"}]
    for n in (1, 2, 5, 10):
        assert parse_chat(ChatCompletionRequest(model="m", messages=msgs, n=n, max_tokens=10)).params.n == n
    req = ChatCompletionRequest(model="m", messages=msgs, max_tokens=10)
    assert req.n is None and parse_chat(req).params.n == 1 and parse_chat(req).params.max_tokens == 10
    assert parse_completion(CompletionRequest(prompt="x")).params.max_tokens == 16     # OpenAI's default
