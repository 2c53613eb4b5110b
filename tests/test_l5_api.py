"""What a server needs from the engine (issue 20, item 1), on the built-in tiny models, CPU:
abort frees a request's blocks at once and the others finish exactly; an interrupted generate()
leaves nothing behind; a long-lived engine forgets released requests (memory flat over 10,000);
n > 1 (vLLM's ids and seeds; siblings share the prompt's blocks); include_stop_str_in_output;
vLLM's logprobs shape and cumulative_logprob; get_tokenizer and chat."""
import importlib
import math
import re
import tracemalloc

import pytest

from l4_sampler import SamplingParams
from l5_scheduler import LLM
from plumbing.errors import UserError

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _solo(llm, prompt, params=GREEDY):
    return llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0].token_ids


def _used(engine):
    kv = engine.scheduler.kv
    return kv.num_blocks - kv.num_free


@pytest.mark.parametrize("stage", ["l5_scheduler", pytest.param("l6_prefix_cache", marks=pytest.mark.deep),
                                   pytest.param("l7_fast", marks=pytest.mark.deep),
                                   pytest.param("l8_sliding_window", marks=pytest.mark.deep)])
def test_abort_frees_a_running_and_a_waiting_request_at_once_and_the_others_finish_exactly(stage):
    mod = importlib.import_module(stage)
    kw = dict(impl="torch") if stage == "l5_scheduler" else {}
    model = "tiny-qwen2-hybrid" if stage == "l8_sliding_window" else None      # KV cache groups, windows freed
    llm = mod.LLM(model, dtype="float32", max_num_seqs=2, max_num_batched_tokens=32, **kw)
    e = llm.llm_engine
    prompts = [P, P[3:] + [7], P[5:] * 2, P[1:]]
    ids = [e.add_request({"prompt_token_ids": p}, GREEDY) for p in prompts]
    for _ in range(3):
        e.step()
    assert [e.requests[i].status.value for i in ids] == ["running", "running", "waiting", "waiting"]
    before = _used(e)
    e.abort_request([ids[1], ids[2], "no-such-id"])            # unknown ids are ignored, as in vLLM
    assert _used(e) < before and ids[1] not in e.requests and ids[2] not in e.requests
    while e.has_unfinished_requests():
        e.step()
    assert [e.release(i).outputs[0].token_ids for i in (ids[0], ids[3])] == [_solo(llm, prompts[0]), _solo(llm, prompts[3])]
    assert e.scheduler.kv.num_free == e.scheduler.kv.num_blocks and not e.requests


def test_interrupted_generate_aborts_its_requests_and_the_next_generate_is_exact(monkeypatch):
    llm = LLM(None, dtype="float32", impl="torch", max_num_seqs=2)
    e, real, calls = llm.llm_engine, llm.llm_engine.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real()
    monkeypatch.setattr(e, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([{"prompt_token_ids": P}, {"prompt_token_ids": P[2:]}, {"prompt_token_ids": P[4:]}], GREEDY,
                     use_tqdm=False)
    assert not e.requests and not e.has_unfinished_requests() and e.scheduler.kv.num_free == e.scheduler.kv.num_blocks
    monkeypatch.setattr(e, "step", real)
    fresh = LLM(None, dtype="float32", impl="torch")
    assert _solo(llm, P[4:]) == _solo(fresh, P[4:])
    assert not e.requests and not e.groups                     # released: nothing kept for a returned output


@pytest.mark.deep                                   # 13 s; make test checks that generate() leaves nothing
def test_a_long_lived_engine_forgets_released_requests_memory_flat_over_10000():
    llm = LLM(None, dtype="float32", impl="torch", max_num_seqs=256, max_num_batched_tokens=2048)
    e = llm.llm_engine
    e.keep_stats = False                                       # as a server runs it
    sp = SamplingParams(temperature=0, max_tokens=1)
    tracemalloc.start()
    sizes = []
    for r in range(10):
        llm.generate([{"prompt_token_ids": [(r * 7 + i) % 250, i % 250 + 1]} for i in range(1000)], sp, use_tqdm=False)
        sizes.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    assert not e.requests and not e.groups and not e.stats
    growth = sizes[-1] - sizes[1]                              # round 1 warms the caches
    assert growth < 200_000, f"traced memory grew {growth} bytes over 8,000 released requests: {sizes}"


def test_n_gives_indexed_completions_with_vllms_seeds_and_siblings_share_the_prompt():
    from l6_prefix_cache import LLM as LLM6
    llm = LLM6(None, dtype="float32")
    sp = SamplingParams(temperature=0.8, seed=5, max_tokens=8, n=3, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": P * 2}, sp, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    for k, c in enumerate(out.outputs):                       # vLLM: child k samples with seed + k
        assert c.token_ids == _solo(llm, P * 2, SamplingParams(temperature=0.8, seed=5 + k, max_tokens=8,
                                                               ignore_eos=True))
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert any(n for s in llm.llm_engine.stats for _, n in s.hits), "no sibling found the prompt's blocks cached"
    with pytest.raises(UserError, match="n must be an int >= 1"):
        SamplingParams(n=0)


def test_include_stop_str_in_output_keeps_the_stop_string_and_cuts_after_it():
    llm = LLM(None, dtype="float32", impl="torch")
    text = llm.generate("The capital of France is", GREEDY, use_tqdm=False)[0].outputs[0].text
    stop = text[3:5]
    outs = [llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=12, stop=[stop],
                                                                    include_stop_str_in_output=inc),
                         use_tqdm=False)[0].outputs[0] for inc in (False, True)]
    assert outs[0].text == text[:3] and outs[1].text == text[:5]
    assert outs[0].finish_reason == outs[1].finish_reason == "stop" and outs[1].stop_reason == stop


def test_logprobs_in_vllms_shape_with_ranks_and_the_cumulative_logprob():
    llm = LLM(None, dtype="float32", impl="torch")
    sp = SamplingParams(temperature=1.0, seed=3, max_tokens=6, logprobs=2, ignore_eos=True)
    c = llm.generate({"prompt_token_ids": P}, sp, use_tqdm=False)[0].outputs[0]
    assert len(c.logprobs) == len(c.token_ids)
    for tok, d in zip(c.token_ids, c.logprobs):
        assert next(iter(d)) == tok                           # the sampled token first
        top = sorted((v.rank, -v.logprob) for v in d.values() if v.rank <= 2)
        assert [r for r, _ in top] == [1, 2] and top[0][1] <= top[1][1]       # ranks 1, 2: best first
        assert len(d) == (2 if d[tok].rank <= 2 else 3)
        assert d[tok].rank <= 2 or d[tok].logprob < -top[1][1]               # outside the top: below it
        assert all(v.decoded_token == llm.get_tokenizer().decode([t]) for t, v in d.items())
    assert math.isclose(c.cumulative_logprob, sum(d[t].logprob for t, d in zip(c.token_ids, c.logprobs)), rel_tol=1e-6)
    plain = llm.generate({"prompt_token_ids": P}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None


def test_get_tokenizer_and_chat_render_the_chat_template():
    llm = LLM(None, dtype="float32", impl="torch")
    tok = llm.get_tokenizer()
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    chat = llm.chat(msgs, GREEDY, use_tqdm=False)[0]
    assert chat.prompt_token_ids == tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                                        add_special_tokens=False)["input_ids"]
    assert chat.prompt_token_ids[0] == 257                   # <|im_start|>: one special token, not 12 bytes
    assert chat.outputs[0].token_ids == _solo(llm, chat.prompt_token_ids)
    for bad in ([{"role": "user"}], []):
        with pytest.raises(UserError, match="messages must be"):
            llm.chat(bad, use_tqdm=False)


def test_a_lone_surrogate_is_one_line_user_error_naming_it_in_generate_add_request_and_chat():
    """The tokenizer raises TypeError on "a\\ud800b" (a JSON "\\ud800" escape gives one).
    Offline it is a UserError naming the problem, where, and the fix; nothing is left in the engine."""
    llm = LLM(None, dtype="float32", impl="torch")
    e, bad = llm.llm_engine, "a\ud800b"
    where = re.escape("has an unpaired surrogate U+D800 at character 1: UTF-8 cannot encode it")
    with pytest.raises(UserError, match=f"^prompt 1: the prompt {where}.*remove it") as err:
        llm.generate(["ok", bad], GREEDY, use_tqdm=False)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=f"^the prompt {where}"):
        e.add_request(bad, GREEDY)
    with pytest.raises(UserError, match=rf"^messages\[1\]\.content {where}"):
        llm.chat([{"role": "system", "content": "x"}, {"role": "user", "content": bad}], GREEDY, use_tqdm=False)
    assert not e.requests and not e.has_unfinished_requests() and e.scheduler.kv.num_free == e.scheduler.kv.num_blocks
    assert llm.generate("ok", GREEDY, use_tqdm=False)[0].outputs[0].finish_reason == "length"
