"""Stage 11 end to end: greedy output with speculation equals stage 9's without it (stage 9 = HF:
the chain), for k = 1..5, batched, chunked, preempted and prefix-hit; the draft model's blocks are
freed; bad configs are refused. The torch reference path by default (the interpreter is slow);
the Triton path and the other checkpoints in the deep tier."""
import pytest

from l9_fp8_kv import LLM as Stage9
from l11_spec_decode import LLM, SamplingParams
from plumbing.errors import UserError

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
# repeats (so n-grams find matches), shared prefixes (prefix hits), lengths past the budget (chunks)
PROMPTS = [P * 2, P * 2 + [7, 8], P[:9], P[3:] + P[3:12], [5, 6, 7, 8] * 9, P[:20] + P[:20] + P[:5]]
FAST = dict(impl="torch", fused_ops=False)


def run(llm, prompts=PROMPTS, n=16, **params):
    params = dict(max_tokens=n, temperature=0, ignore_eos=True) | params
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(**params), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def small(family, **kw):
    """A budget that chunks the prompts and a pool that runs dry (preemption) with 6 requests."""
    return dict(dtype="float32", max_num_batched_tokens=32, num_gpu_blocks_override=12, **kw)


def check_stats(llm, accepted=True, preempted=True):
    eng = llm.llm_engine
    spec, stats = eng.step_order.speculator, eng.stats
    assert spec.verify_steps > 0 and spec.drafted > 0, "no draft was verified: the test would test nothing"
    assert not accepted or 0 < spec.accepted, "no draft was accepted"
    assert not preempted or any(s.preempted for s in stats), "the pool was meant to be too small: no preemption happened"
    assert any(n < full for s in stats for _, _, n, full in s.chunks), "no prompt was chunked"
    kv = eng.scheduler.kv
    assert kv.stats.hits > 0 and kv.num_free == kv.num_blocks


@pytest.fixture(scope="module")
def reference():
    return {f: run(Stage9(f"tiny-{f}", **small(f), **FAST)) for f in ("qwen3",)}


@pytest.mark.parametrize("k,method", [(1, "replay"), (2, "ngram"), (3, "replay"), (4, "ngram"), (5, "replay")])
def test_l11_greedy_equals_stage9_batched_chunked_preempted_and_shared(reference, k, method):
    """Replay guesses the right token 60% of the time (accepts and refusals in every run); n-gram
    lookup is what a user runs."""
    ref = reference["qwen3"]
    cfg = dict(method=method, num_speculative_tokens=k)
    if method == "ngram":
        cfg |= dict(prompt_lookup_min=1, prompt_lookup_max=3)
    else:
        cfg |= dict(acceptance_rate=0.6, reference={tuple(p): r for p, r in zip(PROMPTS, ref)})
    llm = LLM("tiny-qwen3", **small("qwen3"), **FAST, speculative_config=cfg)
    assert run(llm) == ref
    check_stats(llm)


def test_l11_a_draft_model_equal_to_the_target_is_always_accepted_and_its_blocks_are_freed(reference):
    llm = LLM("tiny-qwen3", **small("qwen3"), **FAST,
              speculative_config=dict(method="draft_model", model="tiny-qwen3", num_speculative_tokens=3))
    assert run(llm) == reference["qwen3"]
    spec = llm.llm_engine.step_order.speculator
    assert spec.drafted > spec.filled                  # the same model guesses its own greedy tokens: all kept
    assert spec.accepted >= spec.drafted - spec.filled  # (fillers, when its small pool ran dry, may be refused)
    d = spec.drafter
    assert d.seqs == {} and d.kv.num_free == d.kv.num_blocks


def test_l11_a_different_draft_model_changes_nothing_but_the_acceptance(reference):
    llm = LLM("tiny-qwen3", **small("qwen3"), **FAST,
              speculative_config=dict(method="draft_model", model="tiny-llama", num_speculative_tokens=2))
    assert run(llm) == reference["qwen3"]
    spec = llm.llm_engine.step_order.speculator
    assert spec.drafted > 0 and spec.accepted < spec.drafted


def test_l11_stops_inside_accepted_drafts_and_max_tokens_are_exact(reference):
    """A stop token or the length limit in the middle of a step's accepted guesses ends the request
    there: the tokens after it are dropped."""
    ref = reference["qwen3"]
    cfg = dict(method="replay", num_speculative_tokens=5, acceptance_rate=1.0,
               reference={tuple(p): r for p, r in zip(PROMPTS, ref)})
    llm = LLM("tiny-qwen3", **small("qwen3"), **FAST, speculative_config=cfg)
    stop = ref[0][6]
    outs = llm.generate([{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": PROMPTS[1]}],
                        [SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop]),
                         SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == ref[0][:ref[0].index(stop) + 1]
    assert outs[0].outputs[0].finish_reason == "stop"
    assert outs[1].outputs[0].token_ids == ref[1][:7] and outs[1].outputs[0].finish_reason == "length"


def test_l11_seeded_sampling_repeats_and_logprobs_follow_the_emitted_tokens():
    cfg = dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)
    kw = dict(temperature=0.8, top_p=0.9, seed=7, presence_penalty=0.5, logprobs=2)
    a, b = (LLM("tiny-qwen3", dtype="float32", **FAST, speculative_config=cfg) for _ in range(2))
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3]]
    oa = a.generate(prompts, SamplingParams(max_tokens=12, **kw), use_tqdm=False)
    ob = b.generate(prompts, SamplingParams(max_tokens=12, **kw), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in oa] == [o.outputs[0].token_ids for o in ob]
    assert a.llm_engine.step_order.speculator.verify_steps > 0
    for o in oa:
        c = o.outputs[0]
        assert len(c.logprobs) == len(c.token_ids)
        assert [next(iter(d)) for d in c.logprobs] == c.token_ids      # the emitted token comes first
        assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids)))


@pytest.mark.parametrize("cfg,match", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "not implemented"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}, "not supported"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
    ({"method": "draft_model", "model": "tiny-qwen3", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
     "only applies to method 'ngram'"),
    ("ngram", "must be a dict"),
])
def test_l11_refuses_configs_it_does_not_implement_naming_the_problem(cfg, match):
    with pytest.raises(UserError, match=match):
        LLM(None, **FAST, speculative_config=cfg)


@pytest.mark.deep
def test_l11_deep_triton_path_greedy_equals_stage9_on_the_hybrid():
    """The Triton kernels through the interpreter, on the windowed hybrid (KV cache groups, windows
    freeing blocks) with k 3. The default tier runs the torch path for k 1-5 on the three tiny
    checkpoints (scripts/l11_identity.py); the lessons tier's chain runs tiny Qwen3's Triton path
    with n-gram guesses; the GPU tests replay verify graphs. (The interpreter takes ~3 minutes for
    six requests on tiny Qwen3, so the deep tier runs this one.)"""
    prompts = PROMPTS[:4]
    ref = run(Stage9("tiny-qwen2-hybrid", **small("qwen2-hybrid")), prompts, n=10)
    cfg = dict(method="replay", num_speculative_tokens=3, acceptance_rate=0.6,
               reference={tuple(p): r for p, r in zip(prompts, ref)})
    llm = LLM("tiny-qwen2-hybrid", **small("qwen2-hybrid"), speculative_config=cfg)
    assert run(llm, prompts, n=10) == ref
    check_stats(llm, preempted=False)
    assert llm.llm_engine.scheduler.kv.blocks_freed > 0          # the windows freed blocks meanwhile


@pytest.mark.parametrize("family", ["qwen3", "qwen2-hybrid"])
def test_l11_verify_graph_inputs_give_the_eager_steps_logits(reference, family):
    """What a CUDA-graph replay of a verify step reads (``prepare(out, pad_to=B)``: q tokens per sequence,
    padded to the bucket with PAD sequences, max_seqlen_kv = max_model_len) gives the eager step's
    logits. On the CPU, where no graph exists, the padded inputs run eagerly; the GPU tests replay."""
    from l11_spec_decode.graphs import uniform_verify
    ref = run(Stage9(f"tiny-{family}", **small(family), **FAST), n=10)
    cfg = dict(method="replay", num_speculative_tokens=2, acceptance_rate=0.5,
               reference={tuple(p): r for p, r in zip(PROMPTS, ref)})
    llm = LLM(f"tiny-{family}", **small(family), **FAST, speculative_config=cfg)
    r = llm.llm_engine.runner
    real, seen = r.execute, []

    def spy(out):
        res = real(out)
        q = uniform_verify(out)
        if q is not None:
            n, B = len(out.scheduled), r.bucket(len(out.scheduled) + 1)
            lay, _ = r.prepare(out, pad_to=B)
            logits, _ = r.forward(lay, q, r.config.max_model_len, 1)
            seen.append(float((logits[:n * q] - res.logits).abs().max()))
        return res
    r.execute = spy
    assert run(llm, n=10) == ref
    assert len(seen) >= 3 and max(seen) < 1e-4, seen


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["qwen3", "qwen2-hybrid"])
def test_l11_gpu_verify_steps_replay_graphs_and_greedy_equals_stage9(family):
    """The Triton path with CUDA graphs: uniform verify steps replay their (B, k + 1) graph, and the
    tokens equal stage 9's (float32, so no bf16 near-tie can flip them)."""
    ref = run(Stage9(f"tiny-{family}", **small(family)))
    cfg = dict(method="replay", num_speculative_tokens=3, acceptance_rate=0.6,
               reference={tuple(p): r for p, r in zip(PROMPTS, ref)})
    llm = LLM(f"tiny-{family}", **small(family), speculative_config=cfg)
    assert run(llm) == ref
    modes = llm.llm_engine.runner.mode_log
    assert any(m.startswith("graph") and m.endswith("x4") for m in modes), sorted(set(modes))
    check_stats(llm)


def test_l11_identity_check_passes_and_fails_on_a_planted_verifier(monkeypatch, capsys):
    """scripts/l11_identity.py (the lesson's acceptance command: greedy = stage 9 on the three tiny
    checkpoints, k 1-5, alone and mixed) as built, and with a speculator that emits the refused
    guess instead of the target's token: it must say FAIL and exit 1."""
    from l11_identity import main
    from l11_spec_decode.speculator import Speculator
    assert main([]) == 0                                    # three checkpoints x k 1-5 x alone and mixed
    assert "identity: OK, 30 runs (k 1-5 x 2 workloads x 3 checkpoints) emit stage 9's tokens exactly" in capsys.readouterr().out
    argv = ["--families", "qwen3", "--max-k", "2", "--new-tokens", "10"]
    real = Speculator.verify

    def planted(self, logits, reqs, drafts, sampler, argmax=None):
        new, lps, where = real(self, logits, reqs, drafts, sampler, argmax)
        for toks, d in zip(new, drafts):
            if len(toks) - 1 < len(d):
                toks[-1] = d[len(toks) - 1]
        return new, lps, where
    monkeypatch.setattr(Speculator, "verify", planted)
    assert main(argv) == 1
    assert "identity: FAIL" in capsys.readouterr().out


def test_l11_pay_off_rule_proposes_nothing_for_a_big_batch_and_drops_leftover_guesses():
    """Above disable_by_batch_size decoders the speculator proposes nothing, and a guess left on a
    request that was not scheduled is dropped (else the step would mix shapes and run eagerly)."""
    from types import SimpleNamespace
    from l11_spec_decode.drafters import NgramDrafter
    from l11_spec_decode.speculator import Speculator

    def req(i):
        return SimpleNamespace(request_id=f"r{i}", kv=SimpleNamespace(cur_len=9), num_tokens=10,
                               prompt_ids=[1, 2, 3, 1, 2, 3, 1, 2], output_ids=[3, 1],
                               params=SamplingParams(max_tokens=50))
    spec = Speculator(NgramDrafter(1, 2), 3, 1024, disable_by_batch_size=2)
    spec.propose([req(0), req(1)])
    assert spec.drafts == {"r0": [2, 3, 1], "r1": [2, 3, 1]} and spec.off_steps == 0   # n-gram "1" -> what followed
    spec.drafts["r2"] = [7, 7]                               # a leftover guess on a request not scheduled
    spec.propose([req(0), req(1), req(2)])
    assert spec.drafts == {} and spec.off_steps == 1


def test_l11_host_cost_script_runs_and_its_token_check_can_fail(monkeypatch, capsys):
    """scripts/l11_host_cost.py (benchmarks.md's CPU figure) checks the engine emitted the given
    continuation: a verifier that keeps the first guess and appends token 0 unchecked must fail it."""
    from l11_host_cost import main
    from l11_spec_decode import speculator
    assert main(["--tokens", "40"]) == 0
    assert "alpha 1: " in capsys.readouterr().out
    monkeypatch.setattr(speculator.Speculator, "verify", lambda self, logits, reqs, drafts, sampler, argmax=None: (
        [d[:1] + [0] for d in drafts], None, [[0, 0] for _ in reqs]))
    with pytest.raises(SystemExit, match="other tokens"):
        main(["--tokens", "40"])


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_l11_alone_every_step_after_the_prefill_has_a_graph_to_replay(alpha):
    """One request, k 4, to its length limit: every decode and verify step is a shape the GPU's
    GraphRunner captures (graphs.graph_keys, buckets of the runner), including the last steps, which
    verify fewer guesses (an eager step cost ~15 ms of host on an H100, against ~1.4 ms replayed)."""
    from l7_fast.graphs import graph_keys, step_key
    from l11_spec_decode.graphs import uniform_verify, verify_keys
    prompt = PROMPTS[0]
    ref = run(Stage9("tiny-qwen3", **FAST), [prompt], n=23)
    cfg = dict(method="replay", num_speculative_tokens=4, acceptance_rate=alpha, reference={tuple(prompt): ref[0]})
    llm = LLM("tiny-qwen3", **FAST, speculative_config=cfg)
    eng, keys = llm.llm_engine, []
    r, execute = eng.runner, eng.runner.execute

    def key(out):
        q = uniform_verify(out)
        return (r.bucket(len(out.scheduled)), q) if q is not None else step_key(out, r.bucket, [])
    r.execute = lambda out: keys.append(key(out)) or execute(out)
    assert run(llm, [prompt], n=23) == ref
    captured = graph_keys(r.buckets, []) + verify_keys(r.buckets, 5, eng.step_order.speculator.disable_by_batch_size,
                                                       r.config.max_num_batched_tokens)
    assert keys[0] is None and len(keys) > 5                   # the prompt's prefill (no prefill buckets here)
    assert all(k in captured for k in keys[1:]), keys
    assert any(1 < k[1] < 5 for k in keys[1:]), keys           # the tail verified fewer than 4 guesses


def test_l11_verify_graphs_are_only_captured_for_steps_the_budget_allows():
    """A verify step never holds more tokens than the budget: its graph would be captured for nothing,
    on inputs sized for the budget (on a GPU, past their end: a 16-token budget, 6 x 3 guesses)."""
    from l11_spec_decode.graphs import verify_keys
    keys = verify_keys([1, 2, 4, 6], 3, 8, 16)
    assert (4, 3) in keys and (6, 2) in keys and (6, 3) not in keys
    assert all(B * q <= 16 for B, q in keys) and len(verify_keys([1, 2, 4, 6], 3, 8, 8192)) == 8

