"""vLLM's sampling fields through the server (logit_bias, allowed_token_ids, bad_words,
truncate_prompt_tokens, skip_special_tokens, spaces_between_special_tokens): each changes the
tokens and the text as the offline engine does with the same SamplingParams. The oracle is
``LLM.generate`` in this process (tests/l10_serving.offline_llm: the server's engine, built the same
way); the server runs in its own engine core. Greedy or seeded, so both must give the same ids.

The validation test ports vLLM's
``tests/entrypoints/openai/chat_completion/test_chat_logit_bias_validation.py``
(github.com/vllm-project/vllm)."""
import openai
import pytest

from l10_openai import server  # noqa: F401 (the fixture: the process's server, left idle)

MODEL = "tiny-qwen3"
IM_END = 258                                  # the tiny tokenizer's <|im_end|>: a special token


@pytest.fixture(scope="module")
def llm(tiny_offline):
    return tiny_offline


def _client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=60, max_retries=0)


def _offline(llm, prompt, **kw):
    from l4_sampler.params import SamplingParams
    return llm.generate(prompt, SamplingParams(**kw), use_tqdm=False)[0].outputs[0]


def _served(base, prompt, **kw):
    """(token ids, text) of one completion, whole."""
    r = _client(base).completions.create(model=MODEL, prompt=prompt, extra_body=dict(kw.pop("extra"),
                                         return_token_ids=True), **kw)
    return r.choices[0].token_ids, r.choices[0].text, r


def test_logit_bias_validation_as_vllm_test_chat_logit_bias_validation(server, llm):
    """test_chat_logit_bias_valid: the last id of the vocabulary is taken; test_chat_logit_bias_invalid:
    vocab + 1 is a 400 whose message names the id and the vocabulary's size (here also param)."""
    vocab = llm.llm_engine.model.cfg.vocab_size
    c = _client(server)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Testing valid logit bias"}],
                                  max_tokens=5, logit_bias={str(vocab - 1): 1.0})
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Testing invalid logit bias"}],
                                  max_tokens=5, logit_bias={str(vocab + 1): 1.0})
    assert e.value.status_code == 400 and e.value.body["param"] == "logit_bias"
    assert str(vocab + 1) in str(e.value) and str(vocab) in str(e.value)


def test_each_field_changes_the_tokens_as_the_offline_engine_does(server, llm):
    prompt, greedy = "Hello, my name is", dict(temperature=0.0, max_tokens=4)
    plain, _, _ = _served(server, prompt, extra={}, **greedy)
    assert plain == _offline(llm, prompt, **greedy).token_ids
    first = plain[0]

    cases = {"logit_bias": {str(first): -100.0}, "allowed_token_ids": [104, 105, IM_END],
             "bad_words": ["Hello"], "truncate_prompt_tokens": 2}
    for name, value in cases.items():
        ids, text, r = _served(server, prompt, extra={name: value, "ignore_eos": True}, **greedy)
        offline_value = {int(k): v for k, v in value.items()} if name == "logit_bias" else value
        want = _offline(llm, prompt, ignore_eos=True, **{name: offline_value}, **greedy)
        assert (ids, text) == (want.token_ids, want.text), name
        if name == "logit_bias":
            assert ids[0] != first                          # the greedy token, pushed down, is not taken
        if name == "allowed_token_ids":
            assert set(ids) <= set(value)                   # every token is one of them
        if name == "truncate_prompt_tokens":
            assert r.usage.prompt_tokens == 2 and r.choices[0].prompt_token_ids == llm.get_tokenizer()(
                prompt)["input_ids"][-2:]


def test_bad_words_ban_what_greedy_would_say(server, llm):
    """A one-token word that greedy decoding says first is never said once it is a bad word."""
    tok = llm.get_tokenizer()
    plain, _, _ = _served(server, "ab", extra={}, temperature=0.0, max_tokens=6)
    word = next(t for t in (tok.decode([i]) for i in plain) if t.strip() and len(tok(t.lstrip())["input_ids"]) == 1)
    ids, text, _ = _served(server, "ab", extra={"bad_words": [word]}, temperature=0.0, max_tokens=6)
    want = _offline(llm, "ab", temperature=0.0, max_tokens=6, bad_words=[word])
    assert ids == want.token_ids and tok(word.lstrip())["input_ids"][0] not in ids and ids != plain


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_special_tokens_in_the_text_as_asked_streamed_and_whole(server, llm, skip, endpoint):
    """allowed_token_ids with a special token (<|im_end|>, biased up) and ignore_eos: the text shows it with
    skip_special_tokens false and not with true, the stream adds up to the whole text, and both are
    the offline engine's (a stream that sent text the final text lacks would be a 500)."""
    kw = dict(temperature=1.0, seed=3, max_tokens=10)
    extra = dict(allowed_token_ids=[104, 105, IM_END], logit_bias={str(IM_END): 4.0}, ignore_eos=True,
                 skip_special_tokens=skip, spaces_between_special_tokens=skip)
    c, tok = _client(server), llm.get_tokenizer()
    if endpoint == "completions":
        whole = c.completions.create(model=MODEL, prompt="hi", extra_body=dict(extra, return_token_ids=True), **kw)
        stream = c.completions.create(model=MODEL, prompt="hi", extra_body=extra, stream=True, **kw)
        text, streamed = whole.choices[0].text, "".join(ch.choices[0].text for ch in stream)
        prompt = "hi"
    else:
        messages = [{"role": "user", "content": "hi"}]
        whole = c.chat.completions.create(model=MODEL, messages=messages, extra_body=dict(extra, return_token_ids=True),
                                          **kw)
        stream = c.chat.completions.create(model=MODEL, messages=messages, extra_body=extra, stream=True, **kw)
        text, streamed = whole.choices[0].message.content, "".join(ch.choices[0].delta.content or "" for ch in stream)
        prompt = {"prompt_token_ids": whole.prompt_token_ids}
    ids = whole.choices[0].token_ids
    assert IM_END in ids and set(ids) - {IM_END}, ids          # the special token, and other text
    want = _offline(llm, prompt, **kw, **extra)
    assert streamed == text == want.text and ids == want.token_ids
    assert text == tok.decode(ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in text) is (not skip)
