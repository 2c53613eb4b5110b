"""Stage 10 against vLLM's own server tests, chat and return_token_ids: their assertions ported
as tests/test_l10_openai_compat.py ports the completions ones (its docstring gives the rules:
each test names the vLLM file and test it ports; where this server differs on purpose it says
why; expected values come from outside the server)."""
from collections import defaultdict

import openai

from l10_openai import MESSAGES, MODEL, _chat_ids, _client, _refused, offline, server, tok  # noqa: F401 (fixtures)


# ---- chat_completion/test_chat.py ------------------------------------------------------------

def test_chat_logprobs_and_a_session_as_vllm_test_chat(server, tok, offline):
    """vLLM chat_completion/test_chat.py: test_no_logprobs_chat, test_zero_logprobs_chat,
    test_some_logprobs_chat, test_too_many_chat_logprobs, test_single_chat_session (usage: 5
    generated, the prompt as the chat template renders it; a second turn), test_prompt_logprobs_chat
    (-1 a 400; 0 and 1: at the top of the response, not empty, the offline engine's for the prompt
    the chat template renders, at 1e-5; none asked: none given). Differs: vLLM's content has at least
    5 characters for 5 tokens, but this model's byte tokens may join into fewer characters, so at
    least 1."""
    from l4_sampler.params import SamplingParams
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
    _refused(lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"prompt_logprobs": -1}),
             "prompt_logprobs")
    ids = _chat_ids(tok, MESSAGES)
    for k in (0, 1):
        got = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=2,
                                        extra_body={"prompt_logprobs": k}).model_extra["prompt_logprobs"]
        want = offline.generate({"prompt_token_ids": ids}, SamplingParams(prompt_logprobs=k, max_tokens=1),
                                use_tqdm=False)[0].prompt_logprobs
        assert got is not None and len(got) == len(ids) > 0 and got[0] is None
        assert all(abs(g[str(t)]["logprob"] - lp.logprob) <= 1e-5 and g[str(t)]["rank"] == lp.rank
                   for g, d in zip(got[1:], want[1:]) for t, lp in d.items())
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
