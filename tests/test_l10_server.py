"""Stage 10: the OpenAI-compatible server, driven by the real ``openai`` client over HTTP on
127.0.0.1, one server for the module. Every loop is bounded (client timeouts, polling deadlines).
Servers and processes of their own (a full queue, a dying engine core, the CLI and its flags):
tests/test_l10_server_lifecycle.py."""
import asyncio
import contextlib

import httpx
import openai
import pytest
import torch

from l10_serving import metrics, running_server, wait_idle
from plumbing.tiny import tiny_checkpoint

PROMPT = "The capital of France is"


def _client(base, **kw):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0, **kw)


def _hf_greedy(family, prompt_ids, n):
    from harness.oracle import hf_generate
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return hf_generate(tiny_checkpoint(family), prompt_ids, n, device, dtype).token_ids


def _ids(choice):
    return (choice.model_extra or {})["token_ids"]


@pytest.fixture(scope="module")
def qwen3(tiny_server):
    """The process's tiny-Qwen3 server (conftest.py), left idle."""
    yield tiny_server
    wait_idle(tiny_server[0])


@contextlib.contextmanager
def _server_of(family, qwen3):
    if family == "qwen3":
        yield qwen3[0]                                 # the module's server
    else:
        with running_server(f"tiny-{family}") as (base, _):
            yield base


@pytest.mark.parametrize("family", ["qwen3", pytest.param("llama", marks=pytest.mark.deep),
                                    pytest.param("qwen2", marks=pytest.mark.deep)])
def test_greedy_completions_streamed_and_whole_equal_hf(family, qwen3):
    from l1_dense.checkpoint import load_tokenizer
    tok = load_tokenizer(tiny_checkpoint(family))
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    want = _hf_greedy(family, ids, 24)
    with _server_of(family, qwen3) as base:
        c = _client(base)
        kw = dict(model=f"tiny-{family}", max_tokens=24, temperature=0, extra_body={"return_token_ids": True})
        whole = c.completions.create(prompt=PROMPT, **kw)
        by_ids = c.completions.create(prompt=ids, **kw)
        chunks = list(c.completions.create(prompt=PROMPT, stream=True, **kw))
        chat = c.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **kw)
    streamed = [t for ch in chunks for choice in ch.choices for t in _ids(choice)]
    assert _ids(whole.choices[0]) == _ids(by_ids.choices[0]) == streamed == want
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text == tok.decode(want, skip_special_tokens=True)
    assert [ch.choices[0].finish_reason for ch in chunks].count(None) == len(chunks) - 1
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert whole.usage.prompt_tokens == len(ids) and whole.usage.completion_tokens == len(want)
    assert chat.choices[0].message.role == "assistant" and len(_ids(chat.choices[0])) >= 1


def test_32_concurrent_streams_with_mixed_lengths_and_parameters_each_equal_its_solo_run(qwen3):
    base, _ = qwen3
    prompts = [f"Request {i}: " + "abc def " * (i % 7) for i in range(32)]
    kws = [dict(model="tiny-qwen3", max_tokens=4 + i % 9, extra_body={"return_token_ids": True},
                **(dict(temperature=0) if i % 2 else dict(temperature=0.8, seed=i, top_p=0.9)),
                **(dict(stop=["\n"]) if i % 5 == 0 else {})) for i in range(32)]
    c = _client(base)
    solo = [_ids(c.completions.create(prompt=p, **kw).choices[0]) for p, kw in zip(prompts, kws)]   # one at a time
    steps = metrics(base)["engine_steps_total"]

    async def stream(ac, p, kw):
        out, reasons = [], []
        async for ch in await ac.completions.create(prompt=p, stream=True, **kw):
            for choice in ch.choices:
                out += _ids(choice)
                reasons.append(choice.finish_reason)
        return out, reasons

    async def all_at_once():
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0) as ac:
            return await asyncio.gather(*[stream(ac, p, kw) for p, kw in zip(prompts, kws)])
    got = asyncio.run(all_at_once())
    assert [g for g, _ in got] == solo
    assert all(len([r for r in rs if r is not None]) == 1 and rs[-1] is not None for _, rs in got)
    alone = sum(kw["max_tokens"] for kw in kws)                   # steps if they had run one at a time
    assert metrics(base)["engine_steps_total"] - steps < alone / 4   # they really ran together
    wait_idle(base)


def test_stop_strings_and_utf8_streamed_text_equals_whole_text(qwen3):
    base, _ = qwen3
    c = _client(base)
    whole0 = c.completions.create(model="tiny-qwen3", prompt="日本語のテキスト", max_tokens=30, temperature=0)
    text = whole0.choices[0].text
    stop = text[5:7]                                      # a stop string the output is known to contain
    for extra in ({}, {"include_stop_str_in_output": True}):
        kw = dict(model="tiny-qwen3", prompt="日本語のテキスト", max_tokens=30, temperature=0, stop=[stop],
                  extra_body=extra)
        whole = c.completions.create(**kw).choices[0]
        deltas = [ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices]
        assert "".join(deltas) == whole.text
        assert whole.finish_reason == "stop" and whole.model_extra["stop_reason"] == stop
        assert whole.text == (text[:text.index(stop) + len(stop)] if extra else text[:text.index(stop)])


def test_a_client_that_disconnects_is_aborted_and_its_blocks_freed_and_the_others_finish_exactly(qwen3):
    base, _ = qwen3
    body = {"model": "tiny-qwen3", "prompt": PROMPT, "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
            "stream": True}
    other = dict(model="tiny-qwen3", prompt="Another user", max_tokens=40, temperature=0,
                 extra_body={"return_token_ids": True, "ignore_eos": True})
    solo = _ids(_client(base).completions.create(**other).choices[0])
    start = wait_idle(base)["generation_tokens_total"]
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", f"{base}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            events = [next(lines) for _ in range(6)]            # a few tokens in ...
            assert metrics(base)["kv_blocks_used"] > 0
            others = iter(_client(base).completions.create(stream=True, **other))   # another user, meanwhile
            got = _ids(next(others).choices[0])
        got += [t for ch in others for choice in ch.choices for t in _ids(choice)]   # the first hung up; this goes on
    assert got == solo                                          # the other request finished exactly
    assert any(e.startswith("data: {") for e in events)
    m = wait_idle(base)                                         # blocks back in the pool ...
    assert m["generation_tokens_total"] - start < 1000 + len(solo)   # ... long before max_tokens
    # a whole (non-streamed) request whose client gives up is aborted too: 16 prompts of 990 tokens
    many = dict(body, stream=False, max_tokens=990, prompt=[f"{PROMPT} {i}" for i in range(16)])
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/completions", json=many, timeout=0.3)
    m2 = wait_idle(base)
    assert m2["generation_tokens_total"] - m["generation_tokens_total"] < 16 * 990
    aborted = "request_success_total{finished_reason=abort}"
    assert m2[aborted] == m.get(aborted, 0) + 16


def test_seeded_sampling_reproduces_and_n_gives_indexed_choices_seeded_by_index(qwen3):
    base, _ = qwen3
    c = _client(base)
    kw = dict(model="tiny-qwen3", prompt=PROMPT, max_tokens=10, temperature=1.0, top_p=0.9, extra_body={"return_token_ids": True})
    a = [_ids(c.completions.create(seed=s, **kw).choices[0]) for s in (7, 8, 9)]
    assert a[0] == _ids(c.completions.create(seed=7, **kw).choices[0])
    assert len({tuple(x) for x in a}) > 1                                    # the seed matters
    n3 = c.completions.create(seed=7, n=3, **kw)
    assert [ch.index for ch in n3.choices] == [0, 1, 2] and [_ids(ch) for ch in n3.choices] == a
    streamed = {}
    for ch in c.completions.create(seed=7, n=3, stream=True, **kw):
        for choice in ch.choices:
            streamed.setdefault(choice.index, []).extend(_ids(choice))
    assert [streamed[i] for i in range(3)] == a
    assert n3.usage.completion_tokens == sum(len(x) for x in a)


def test_logprobs_in_openais_shapes(qwen3):
    base, _ = qwen3
    c = _client(base)
    comp = c.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3).choices[0]
    lp = comp.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    # greedy: the sampled token is the most likely; up to 1 + 3 entries (ids with one text share a key)
    assert all(1 <= len(top) <= 4 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    chat = c.chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                     temperature=0, logprobs=True, top_logprobs=2).choices[0]
    assert len(chat.logprobs.content) == 4
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob == pytest.approx(x.logprob)
               for x in chat.logprobs.content)


def test_chat_without_max_tokens_gets_the_room_the_prompt_leaves(qwen3):
    """vLLM's chat default: max_tokens = max_model_len - prompt tokens (1024 here)."""
    base, _ = qwen3
    r = _client(base).chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "hi"}],
                                              temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.total_tokens == 1024
    r = _client(base).chat.completions.create(model="tiny-qwen3", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=None, temperature=0, extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens >= 5          # min_tokens without max_tokens: vLLM takes it, and so here


BAD = [  # (endpoint, body, status, the param the error names)
    ("completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),    # vLLM's rule
    ("completions", {"prompt": "x", "logit_bias": {"999": 1}}, 400, "logit_bias"),      # outside the vocabulary
    ("completions", {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("completions", {"prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("completions", {"prompt": "x", "bad_words": [" "]}, 400, "bad_words"),
    ("completions", {"prompt": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
    ("completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("completions", {"prompt": [999999]}, 400, "prompt"),
    ("completions", {"prompt": ""}, 400, "prompt"),
    ("completions", {"prompt": "x " * 1100}, 400, "prompt"),          # longer than max_model_len (1024)
    ("completions", {"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    ("completions", {}, 400, "prompt"),
    ("completions", {"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user"}]}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools"),
]


def test_a_lone_surrogate_is_a_400_naming_it_at_every_entry_point_and_the_server_serves_on(qwen3, monkeypatch):
    """A lone surrogate, "a\\ud800b" (valid JSON), once stopped the engine core. Each entry point: a 400 that names
    the surrogate and where it is; the other prompts of a list are not left running. The openai
    client's own encoder raises on a lone surrogate (UTF-8 has none), so it sends here what a
    JavaScript client's JSON.stringify does: the \\ud800 escape."""
    import json

    import openai._base_client
    monkeypatch.setattr(openai._base_client, "openapi_dumps", lambda obj: json.dumps(obj).encode())
    base, _ = qwen3
    c, bad = _client(base), "a\ud800b"
    calls = [("prompt", "the prompt", lambda: c.completions.create(model="tiny-qwen3", prompt=bad, max_tokens=3)),
             ("prompt", "prompt 1: the prompt", lambda: c.completions.create(model="tiny-qwen3", prompt=["ok", bad],
                                                                              max_tokens=3)),
             ("messages", "messages[0].content", lambda: c.chat.completions.create(
                 model="tiny-qwen3", max_tokens=3, messages=[{"role": "user", "content": bad}]))]
    for param, where, call in calls:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        err = e.value.body
        assert err["param"] == param and err["message"].startswith(f"{where} has an unpaired surrogate U+D800 at "
                                                                   "character 1: UTF-8 cannot encode it"), err
    ok = c.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason == "length"
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    wait_idle(base)


def test_an_error_while_detokenizing_one_request_fails_it_alone_with_500_and_frees_its_blocks(qwen3, monkeypatch):
    from l10_server.submission import Submission
    base, _ = qwen3
    real = Submission._text

    def buggy(self, i, ch):                               # a bug that only seed 13's requests meet
        if self.params.seed == 13:
            raise RuntimeError("a detokenizer bug")
        return real(self, i, ch)
    monkeypatch.setattr(Submission, "_text", buggy)
    body = {"prompt": PROMPT, "max_tokens": 8, "seed": 13}
    whole = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
    assert whole.status_code == 500 and whole.json()["error"]["type"] == "server_error"
    assert "RuntimeError: a detokenizer bug" in whole.json()["error"]["message"]
    events = [e for e in httpx.post(f"{base}/v1/completions", json=dict(body, stream=True), timeout=30)
              .text.splitlines() if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and "a detokenizer bug" in events[-2] and len(events) == 2
    ok = httpx.post(f"{base}/v1/completions", json=dict(body, seed=14), timeout=30)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    wait_idle(base)                                       # the failed ones' blocks are back


def test_metrics_count_each_stretch_of_steps_for_bench_serves_timeline(qwen3):
    """Two requests with the engine idle between them: two stretches of steps, each with its own
    start, and the last step's end seen in /metrics (bench_serve.py's timeline reads these)."""
    base, _ = qwen3
    c = _client(base)
    m = [wait_idle(base)]
    for _ in range(2):
        c.completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=3)
        m.append(wait_idle(base))
    for before, after in zip(m, m[1:]):
        assert after["engine_busy_periods_total"] - before["engine_busy_periods_total"] == 1
        assert after["engine_steps_total"] - before["engine_steps_total"] >= 3
        assert before["engine_last_step_end_seconds"] < after["engine_busy_since_seconds"] \
            < after["engine_last_step_end_seconds"] and after["engine_last_add_seconds"] >= after["engine_busy_since_seconds"]


def test_bad_requests_get_openais_error_json_naming_the_param_and_the_server_keeps_serving(qwen3):
    base, _ = qwen3
    for endpoint, body, status, param in BAD:
        r = httpx.post(f"{base}/v1/{endpoint}", json=body, timeout=30)
        err = r.json()["error"]
        assert (r.status_code, err["param"]) == (status, param), (body, r.text)
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
    r = httpx.post(f"{base}/v1/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    ok = _client(base).completions.create(model="tiny-qwen3", prompt=PROMPT, max_tokens=3, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop")
    models = httpx.get(f"{base}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-qwen3"] and httpx.get(f"{base}/health").status_code == 200
    wait_idle(base)
