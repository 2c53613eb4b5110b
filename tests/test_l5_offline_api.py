"""vLLM's offline API, the fields and methods beyond sampling itself, each against an oracle that is
not the code under test: logit_bias, allowed_token_ids and bad_words against transformers'
generate() with its own LogitsProcessors (and its bad_words_ids); prompt_logprobs against
transformers' forward over the prompt (log_softmax, float32 on a CPU: 1e-4); logprobs=-1 against
log_softmax of the kept logits; the text options against the tokenizer's decode; the request
times, the prefix-cache hit count and the preemption counter against what the workload must do.
Stage 5 on its torch reference, then the same checks with prefix caching, async scheduling and
speculation (n-gram guesses, greedy and sampled verify)."""
import importlib

import pytest
import torch

from l4_sampler import SamplingParams
from l5_scheduler import LLM
from plumbing.errors import UserError

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
N = 10                                                   # new tokens; min_tokens = N: EOS banned, as HF's min_new_tokens
PLP_TOL = 1e-4                                           # float32, two implementations of the same forward


@pytest.fixture(scope="module")
def llm():
    return LLM(None, dtype="float32", impl="torch", max_num_batched_tokens=16, max_model_len=64)


@pytest.fixture(scope="module")
def hf(llm):
    from harness.oracle import hf_model
    from plumbing.tiny import tiny_checkpoint
    return hf_model(tiny_checkpoint(), "cpu", torch.float32)


def tok(llm, text):
    return llm.get_tokenizer()(text, add_special_tokens=False)["input_ids"]


def hf_greedy(hf, prompt, bias=None, allowed=None, bad=None):
    """transformers' greedy generate with its own processors: the oracle for the engine's."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Bias(LogitsProcessor):
        def __call__(self, ids, scores):
            for t, b in (bias or {}).items():
                scores[:, t] += b
            return scores

    class Allowed(LogitsProcessor):
        def __call__(self, ids, scores):
            keep = torch.full_like(scores, float("-inf"))
            keep[:, allowed] = 0
            return scores + keep if allowed else scores
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=N, min_new_tokens=N, do_sample=False, top_k=None,
                      top_p=None, temperature=None, bad_words_ids=bad,
                      logits_processor=LogitsProcessorList([Allowed(), Bias()]))
    return out[0, len(prompt):].tolist()


def run(llm, prompts, **kw):
    sp = SamplingParams(**dict(dict(temperature=0, max_tokens=N, min_tokens=N), **kw))
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp,
                                                            use_tqdm=False)]


def processor_cases(llm, plain):
    """(SamplingParams fields, transformers' processors) whose greedy tokens must differ from ``plain``."""
    a, b = plain[2], plain[3]                           # a word the model says: its second token is banned after it
    word = llm.get_tokenizer().decode([a, b])
    assert tok(llm, word) == [a, b], "pick tokens that round-trip through the tokenizer"
    return [(dict(logit_bias={plain[1]: -50.0, 120: 3.0}), dict(bias={plain[1]: -50.0, 120: 3.0})),
            (dict(allowed_token_ids=[97, 98, 99, plain[4]]), dict(allowed=[97, 98, 99, plain[4]])),
            (dict(bad_words=[word, llm.get_tokenizer().decode([plain[0]])]), dict(bad=[[a, b], [plain[0]]])),
            (dict(bad_words=[word], logit_bias={b: 5.0}, allowed_token_ids=[a, b, 100, 101]),
             dict(bad=[[a, b]], bias={b: 5.0}, allowed=[a, b, 100, 101]))]


def test_logit_bias_allowed_token_ids_and_bad_words_equal_transformers_processors(llm, hf):
    prompts = [P, P[5:] + P[:7]]
    plain = run(llm, prompts)
    assert plain == [hf_greedy(hf, p) for p in prompts]
    for kw, oracle in processor_cases(llm, plain[0]):
        got = run(llm, prompts, **kw)
        want = [hf_greedy(hf, p, **oracle) for p in prompts]
        assert got == want and got[0] != plain[0], kw
    # a batch mixing a processor row with plain rows: the plain rows keep their tokens
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(temperature=0, max_tokens=N,
                        min_tokens=N, logit_bias={plain[0][0]: -50.0}), SamplingParams(temperature=0, max_tokens=N,
                        min_tokens=N)], use_tqdm=False)
    assert outs[1].outputs[0].token_ids == plain[1] and outs[0].outputs[0].token_ids[0] != plain[0][0]


def test_a_row_with_a_processor_never_takes_the_all_greedy_branch():
    from l4_sampler.sampler import RowState, Sampler
    z = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    for kw, want in [(dict(logit_bias={0: 9.0}), 0), (dict(allowed_token_ids=[1]), 1), (dict(bad_words=["x"]), 2)]:
        row = RowState(SamplingParams(temperature=0, **kw), [0], [], (), [[3]] if "bad_words" in kw else ())
        assert not row.plain_greedy
        assert Sampler()(z, [row], argmax=torch.tensor([3])).token_ids_list == [want], kw


def test_prompt_logprobs_equal_transformers_forward_across_chunks_and_skip_the_prefix_cache(hf):
    from l6_prefix_cache import LLM as Stage6
    prompt = P * 2                                       # 48 tokens, budget 16: three chunks
    ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)       # [48, V]
    llm = Stage6(None, dtype="float32", impl="torch", max_num_batched_tokens=16)
    first = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert first.prompt_logprobs is None and first.num_cached_tokens == 0
    o = llm.generate([{"prompt_token_ids": prompt}, {"prompt_token_ids": prompt}],
                     [SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3), SamplingParams(temperature=0,
                                                                                                     max_tokens=2)],
                     use_tqdm=False)
    pl = o[0].prompt_logprobs
    assert o[0].num_cached_tokens == 0 and o[1].num_cached_tokens == 32     # the plain one hits, as before
    assert pl[0] is None and len(pl) == len(prompt)
    for j in range(1, len(prompt)):
        d, row = pl[j], ref[j - 1]
        assert abs(d[prompt[j]].logprob - row[prompt[j]].item()) < PLP_TOL
        assert d[prompt[j]].rank == int((row > row[prompt[j]]).sum()) + 1
        top = row.topk(3).indices.tolist()
        assert set(top) <= set(d) and len(d) <= 4, (j, d)
    assert o[0].outputs[0].token_ids == o[1].outputs[0].token_ids == first.outputs[0].token_ids


def test_logprobs_minus_one_is_the_whole_vocabulary(llm):
    o = llm.generate({"prompt_token_ids": P}, SamplingParams(temperature=0, max_tokens=2, logprobs=-1,
                                                             prompt_logprobs=-1), use_tqdm=False)[0]
    V = llm.llm_engine.model.cfg.vocab_size
    assert all(len(d) == V for d in o.outputs[0].logprobs) and all(len(d) == V for d in o.prompt_logprobs[1:])
    assert abs(sum(torch.tensor([lp.logprob for lp in o.outputs[0].logprobs[0].values()]).exp()) - 1) < 1e-4


def test_text_options_max_tokens_none_and_truncation(llm):
    t = llm.get_tokenizer()
    special = t.convert_tokens_to_ids("<|im_start|>")
    force = dict(temperature=0, max_tokens=3, allowed_token_ids=[special, 97])
    run1 = llm.generate({"prompt_token_ids": P}, [SamplingParams(**force)], use_tqdm=False)[0].outputs[0]
    raw = llm.generate({"prompt_token_ids": P}, [SamplingParams(**force, skip_special_tokens=False)],
                       use_tqdm=False)[0].outputs[0]
    assert run1.token_ids == raw.token_ids and special in raw.token_ids
    assert run1.text == t.decode(raw.token_ids, skip_special_tokens=True)
    assert raw.text == t.decode(raw.token_ids, skip_special_tokens=False) and "<|im_start|>" in raw.text
    quiet = llm.generate({"prompt_token_ids": P}, SamplingParams(**force, detokenize=False, logprobs=1),
                         use_tqdm=False)[0].outputs[0]
    assert quiet.text == "" and quiet.token_ids == raw.token_ids and quiet.logprobs[0][special].decoded_token is None
    room = llm.llm_engine.config.max_model_len - len(P)
    assert room == 40
    full = llm.generate({"prompt_token_ids": P}, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True,
                        allowed_token_ids=[97]), use_tqdm=False)[0].outputs[0]
    assert len(full.token_ids) == room and full.finish_reason == "length" and full.finished()
    greedy = dict(temperature=0, max_tokens=4, ignore_eos=True)
    cut = llm.generate({"prompt_token_ids": P}, SamplingParams(**greedy, truncate_prompt_tokens=7), use_tqdm=False)[0]
    short = llm.generate({"prompt_token_ids": P[-7:]}, SamplingParams(**greedy), use_tqdm=False)[0]
    assert cut.prompt_token_ids == P[-7:] and cut.outputs[0].token_ids == short.outputs[0].token_ids


def test_engine_refuses_ids_outside_the_vocabulary_naming_the_field(llm):
    V = llm.llm_engine.model.cfg.vocab_size
    for kw, field in [(dict(logit_bias={V: 1.0}), "logit_bias"), (dict(allowed_token_ids=[0, V]), "allowed_token_ids"),
                      (dict(stop_token_ids=[V + 3]), "stop_token_ids")]:
        with pytest.raises(UserError, match=rf"SamplingParams\.{field} has token ids \[\d+\] outside the vocabulary"):
            llm.generate({"prompt_token_ids": P}, SamplingParams(**kw), use_tqdm=False)


def test_request_times_cached_tokens_and_the_preemption_counter():
    from l6_prefix_cache import LLM as Stage6
    llm = Stage6(None, dtype="float32", impl="torch", max_num_batched_tokens=32, num_gpu_blocks_override=8)
    prompts = [{"prompt_token_ids": P + [k] * 8} for k in range(4)]              # 32 + 16 tokens: 3-4 blocks each
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    sched = llm.llm_engine.scheduler
    assert sched.num_preemptions == sum(o.num_preemptions for o in outs) > 0
    for o in outs:
        m = o.metrics
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.last_token_time <= m.finished_time
        assert m.time_in_queue == m.first_scheduled_time - m.arrival_time
    again = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert again.num_cached_tokens == 16                 # P's first block (the prompt's last block is never a hit)
    assert llm.reset_prefix_cache() is True
    assert llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=1),
                        use_tqdm=False)[0].num_cached_tokens == 0
    e = llm.llm_engine
    e.add_request(prompts[1], SamplingParams(max_tokens=4))
    e.step()
    assert llm.reset_prefix_cache() is False             # a request holds blocks: nothing changes
    while e.has_unfinished_requests():
        e.step()
    got = {m.name: m.value for m in llm.get_metrics()}
    assert got["vllm:num_preemptions"] == sched.num_preemptions and got["vllm:num_requests_running"] == 0
    assert got["vllm:prefix_cache_queries"] >= got["vllm:prefix_cache_hits"] > 0


def test_chat_template_and_continue_final_message(llm):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Par"}]
    t = llm.get_tokenizer()
    o = llm.chat(msgs, SamplingParams(max_tokens=1), use_tqdm=False, add_generation_prompt=False,
                 continue_final_message=True)[0]
    assert o.prompt_token_ids == tok(llm, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nPar")
    mine = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    o = llm.chat(msgs[:1], SamplingParams(max_tokens=1), use_tqdm=False, chat_template=mine)[0]
    assert o.prompt_token_ids == tok(llm, "[user] hi\n") and t.chat_template != mine
    with pytest.raises(UserError, match="add_generation_prompt=False"):
        llm.chat(msgs, continue_final_message=True, use_tqdm=False)


@pytest.mark.parametrize("stage,opts", [("l6_prefix_cache", {}), ("l7_fast", dict(async_scheduling=True)),
                                        ("l11_spec_decode", dict(speculative_config=dict(
                                            method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                                            prompt_lookup_max=3)))])
def test_processors_and_prompt_logprobs_across_the_feature_matrix(llm, hf, stage, opts):
    """The same tokens as stage 5 (= transformers) for each processor case, and the same prompt
    logprobs, with prefix caching, async scheduling or speculation (the verify scores processed logits)."""
    mod = importlib.import_module(stage)
    fast = dict(fused_ops=False) if stage != "l6_prefix_cache" else {}
    other = mod.LLM(None, dtype="float32", impl="torch", max_num_batched_tokens=16, **fast, **opts)
    prompts = [P * 2, P[5:] + P[:7]]                     # repeats: n-grams find guesses
    plain = run(llm, prompts)
    assert run(other, prompts) == plain
    for kw, _ in processor_cases(llm, plain[0]):
        assert run(other, prompts, **kw) == run(llm, prompts, **kw), kw
    allowed = sorted(set(plain[0][:3]) | {97, 98})     # sampled: every token (kept guesses too) in the set
    for seed in range(3):
        assert set(sum(run(other, prompts, temperature=1.0, seed=seed, allowed_token_ids=allowed), [])) <= set(allowed)
    spec = getattr(other.llm_engine.step_order, "speculator", None)
    assert spec is None or spec.accepted > 0, "no guess was verified: speculation was not tested"
    a = [o.prompt_logprobs for o in other.generate([{"prompt_token_ids": p} for p in prompts],
                                                   SamplingParams(max_tokens=3, prompt_logprobs=2), use_tqdm=False)]
    b = [o.prompt_logprobs for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                 SamplingParams(max_tokens=3, prompt_logprobs=2), use_tqdm=False)]
    for x, y in zip(a, b):
        assert len(x) == len(y) and all(abs(x[j][t].logprob - y[j][t].logprob) < PLP_TOL
                                        for j in range(1, len(x)) for t in y[j])
