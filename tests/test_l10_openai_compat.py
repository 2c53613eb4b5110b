"""Stage 10 against vLLM's own server tests (completions, basic, validation, this server's own): their
assertions, ported to this server (tiny Qwen3 on the CPU, the test process's server, fixtures and
helpers in tests/l10_openai.py) and the real ``openai`` client. Each test names the vLLM file it
ports (github.com/vllm-project/vllm, ``tests/entrypoints/openai/``) and the vLLM test; where this
server differs on purpose (a field it refuses rather than ignores, a message worded for people),
the test asserts what it does instead and says why.

Expected values come from outside the server: the tokenizer (prompt lengths, decoded text),
pyproject.toml (the version), the request itself, the offline engine (prompt logprobs).
Consistency checks (a stream adds up to the whole answer) compare the server with itself, as
vLLM's do."""

import tomllib
from collections import defaultdict

import httpx
import pytest

from l10_openai import MESSAGES, MODEL, ROOT, _client, _post, _refused, offline, server, tok  # noqa: F401 (fixtures)


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
    assert c.completions.create(**kw).choices[0].finish_reason in ("length", "stop")   # the server still works


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
    """vLLM completion/test_completion.py: test_echo_logprob_completion (logprobs 1 and 0: the text
    starts with the prompt, for text and for token ids; the logprobs start with the prompt's, the
    first null), test_invalid_json_schema / _regex / _grammar (a 400; structured_outputs is refused
    by name here: not implemented). Also: echo without logprobs is the prompt + the plain answer,
    and the echoed logprobs are the offline engine's (below, prompt_logprobs)."""
    c = _client(server)
    for prompt in ("Hello, my name is", [0, 0, 0, 0, 0]):
        text = tok.decode(prompt) if isinstance(prompt, list) else prompt
        plain = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0)
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0, echo=True)
        assert r.choices[0].text == text + plain.choices[0].text
        for logprobs_arg in (1, 0):
            r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0, echo=True,
                                     logprobs=logprobs_arg)
            assert r.choices[0].text.startswith(text)
            lp = r.choices[0].logprobs
            assert lp is not None and len(lp.text_offset) > 5
            assert len(lp.token_logprobs) > 5 and lp.token_logprobs[0] is None
            assert len(lp.top_logprobs) > 5 and lp.top_logprobs[0] is None
            assert all(max(logprobs_arg, 1) <= len(top) <= logprobs_arg + 1 for top in lp.top_logprobs[1:])
            assert len(lp.tokens) > 5
            n = len(r.choices[0].model_extra["prompt_logprobs"])           # the prompt's tokens come first
            assert lp.token_logprobs[1:n] == [d[str(t)]["logprob"] for d, t in zip(
                r.choices[0].model_extra["prompt_logprobs"][1:], tok(text)["input_ids"][1:] if isinstance(
                    prompt, str) else prompt[1:])]
            streamed = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0.0,
                                                 echo=True, logprobs=logprobs_arg, stream=True))
            first = streamed[0].choices[0].logprobs                  # vLLM: the prompt's with the first token's
            assert first.token_logprobs[0] is None and first.token_logprobs[:n] == lp.token_logprobs[:n]
            assert sum((ch.choices[0].logprobs.tokens for ch in streamed), []) == lp.tokens
    _refused(lambda: c.completions.create(model=MODEL, prompt="x", extra_body={"structured_outputs": {"regex": "[.*"}}),
             "structured_outputs")


def test_prompt_logprobs_as_vllm_test_completion(server, tok, offline):
    """vLLM completion/test_completion.py: test_prompt_logprobs_completion (-1 is a 400; 0 and 1: each
    choice has them, not empty; none asked: none given). Also: vLLM's shape (null, then per token
    {"id": {logprob, rank, decoded_token}}), the values the offline engine's RequestOutput.prompt_logprobs
    (1e-5: float32 on a CPU, the same engine in another process), and prompt_logprobs with stream a 400
    (vLLM's rule for 1; vLLM takes 0 with stream and sends none, which this server does not ignore)."""
    from l4_sampler.params import SamplingParams
    c = _client(server)
    prompts = ["A robot may not injure another robot", "My name is"]
    _refused(lambda: c.completions.create(model=MODEL, prompt=prompts, extra_body={"prompt_logprobs": -1}),
             "prompt_logprobs")
    for k in (0, 1):
        r = c.completions.create(model=MODEL, prompt=prompts, extra_body={"prompt_logprobs": k})
        want = offline.generate(prompts, SamplingParams(prompt_logprobs=k, max_tokens=1), use_tqdm=False)
        for ch, w in zip(r.choices, want):
            got = ch.model_extra["prompt_logprobs"]
            assert got is not None and len(got) == len(tok(prompts[ch.index])["input_ids"]) and got[0] is None
            for g, d in zip(got[1:], w.prompt_logprobs[1:]):
                assert list(g) == [str(t) for t in d] and k <= len(g) <= k + 1
                for t, lp in d.items():
                    assert g[str(t)]["rank"] == lp.rank and g[str(t)]["decoded_token"] == lp.decoded_token
                    assert abs(g[str(t)]["logprob"] - lp.logprob) <= 1e-5
        _refused(lambda: list(c.completions.create(model=MODEL, prompt=prompts, stream=True,
                                                   extra_body={"prompt_logprobs": k})), "prompt_logprobs")
    r = c.completions.create(model=MODEL, prompt=prompts, max_tokens=3)
    assert all((ch.model_extra or {}).get("prompt_logprobs") is None for ch in r.choices)


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


# ---- this server's own: routes, schemas, vLLM's sampling fields -----------------------------------

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


VLLM_FIELDS = [("logit_bias", {"5": 1.0}), ("allowed_token_ids", [5, 6]), ("bad_words", ["x"]),
               ("skip_special_tokens", False), ("spaces_between_special_tokens", False),
               ("truncate_prompt_tokens", 3), ("prompt_logprobs", 1)]


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_vllms_sampling_fields_are_taken_and_a_wrong_type_says_what_it_must_be(server, endpoint):
    """vLLM's fields that SamplingParams takes: each is served (tests/test_l10_sampling_fields.py
    checks what each does); a wrong type is a 400 naming it that says what the field must be, in
    JSON's words (true, not True)."""
    base = {"prompt": "x"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "x"}]}
    base["max_tokens"] = 2
    for name, value in VLLM_FIELDS:
        assert _post(server, f"/v1/{endpoint}", dict(base, **{name: value})).status_code == 200, name
        r = _post(server, f"/v1/{endpoint}", dict(base, **{name: "yes"}))
        assert (r.status_code, r.json()["error"]["param"]) == (400, name), r.text
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
