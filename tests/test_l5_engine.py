"""Stage 5 on the tiny checkpoints (CPU, float32): a mixed, chunked, preempted batch gives every
request the tokens it gets alone (stage 4) and from Hugging Face; seeds survive batching and
preemption; bad requests fail alone; the API returns what vLLM's does."""
import pytest
import torch

from harness.oracle import hf_generate
from plumbing.errors import UserError
from plumbing.runtime import default_device
from l3_paged.engine import PagedEngine
from l4_sampler.generate import sample_generate
from l4_sampler.params import SamplingParams
from l5_scheduler import LLM
from l5_scheduler.config import make_config
from l5_scheduler import build_engine
from l5_smoke import main as l5_main

DEV = default_device()      # the tiny fixture's device: cuda on a GPU machine (kernels compiled), else cpu
USUAL = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]


def _prompt(n, salt):
    """A deterministic byte prompt of n tokens (no EOS, no special ids)."""
    return [(salt * 37 + 11 * j + (j * j) % 7) % 250 + 3 for j in range(n)]


# (prompt, max_tokens): lengths 1 .. 300, arriving in this order
WORKLOAD = [(_prompt(300, 1), 6), (USUAL, 20), (_prompt(1, 2), 9), (_prompt(130, 3), 7),
            (_prompt(7, 4), 12), (_prompt(45, 5), 10), (_prompt(211, 6), 5)]


def _engine(model, impl="torch", block_size=8, num_blocks=48, budget=64, seqs=None, keep_logits=False, tokenizer=None):
    cfg = make_config(model.cfg, "cpu", next(model.parameters()).dtype, block_size=block_size,
                      num_gpu_blocks_override=num_blocks, max_num_batched_tokens=budget, max_num_seqs=seqs)
    return build_engine(model, tokenizer, cfg, impl=impl, check=True, keep_logits=keep_logits)


def _run(engine):
    while engine.has_unfinished_requests():
        engine.step()
    return engine


def _solo(model, prompt, params, impl="torch"):
    e = PagedEngine(model, 64, 16, impl=impl)
    return sample_generate(e, prompt, params, model.cfg.eos_token_ids, model.cfg.max_position_embeddings).token_ids


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_l5_every_request_in_a_chunked_preempted_batch_matches_stage4_alone_and_hf(tiny, family):
    model, path = tiny(family)
    e = _engine(model)
    greedy = [SamplingParams(temperature=0, max_tokens=m) for _, m in WORKLOAD]
    ids = [e.add_request({"prompt_token_ids": p}, g) for (p, _), g in zip(WORKLOAD, greedy)]
    _run(e)
    stats = e.stats
    assert any(n < plen for s in stats for _, _, n, plen in s.chunks), "no prefill was chunked"
    assert sum(len(s.preempted) for s in stats) >= 1, "nothing was preempted"
    assert max(len(s.chunks) for s in stats) >= 2, "never two prefills in one step"
    for rid, (prompt, m), g in zip(ids, WORKLOAD, greedy):
        got = e.output(rid).outputs[0].token_ids
        ref = hf_generate(path, prompt, m, DEV, torch.float32)
        margins = [float(t.topk(2).values[0] - t.topk(2).values[1]) for t in ref.logits]
        assert min(margins) > 1e-3, f"prompt {rid}: an HF top-1 margin of {min(margins):.2e} is within float noise; pick another prompt"
        assert got == ref.token_ids, f"{rid} vs HF"
        assert got == _solo(model, prompt, g), f"{rid} vs stage 4 alone"


def test_l5_triton_kernel_batch_matches_the_torch_reference_batch(tiny):
    """The same mixed batch through the Triton kernel (interpreter) and Path A: same tokens."""
    model, _ = tiny("qwen3")
    work = [(_prompt(70, 1), 5), (USUAL, 8), (_prompt(3, 2), 6), (_prompt(40, 3), 4)]
    out = {}
    for impl in ("torch", "triton"):
        e = _engine(model, impl=impl, num_blocks=11, budget=24)
        ids = [e.add_request({"prompt_token_ids": p}, SamplingParams(temperature=0, max_tokens=m)) for p, m in work]
        _run(e)
        assert sum(len(s.preempted) for s in e.stats) >= 1
        out[impl] = [e.output(i).outputs[0].token_ids for i in ids]
    assert out["triton"] == out["torch"]


def test_l5_seeded_request_same_tokens_alone_in_a_batch_and_preempted(tiny):
    model, _ = tiny("qwen3")
    p = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=16)
    alone = _solo(model, USUAL, p)
    for num_blocks in (64, 12):                 # roomy: no preemption; tight: the seeded one is preempted
        e = _engine(model, num_blocks=num_blocks, budget=32)
        e.add_request({"prompt_token_ids": _prompt(60, 9)}, SamplingParams(temperature=1.0, max_tokens=12))
        rid = e.add_request({"prompt_token_ids": USUAL}, p)
        e.add_request({"prompt_token_ids": _prompt(20, 8)}, SamplingParams(temperature=1.0, seed=3, max_tokens=10))
        _run(e)
        out = e.output(rid)
        assert out.outputs[0].token_ids == alone, f"num_blocks={num_blocks}"
        assert (out.num_preemptions > 0) == (num_blocks == 12)


def test_l5_bad_requests_fail_alone_and_the_batch_in_flight_finishes_right(tiny):
    model, _ = tiny("qwen3")
    e = _engine(model, num_blocks=20, budget=16, tokenizer=None)        # max_model_len = the pool: 160
    good = [(USUAL, 10), (_prompt(30, 4), 8)]
    ids = [e.add_request({"prompt_token_ids": pr}, SamplingParams(temperature=0, max_tokens=m)) for pr, m in good]
    e.step(), e.step()
    bad = [({"prompt_token_ids": []}, None, "the prompt is empty"),
           ({"prompt_token_ids": [1, 2, 300]}, None, r"outside the vocabulary \[0, 259\)"),
           ({"prompt_token_ids": [True, 2]}, None, "list of ints"),
           ("text", None, "no tokenizer"),
           ({"prompt_token_ids": [1] * 150}, SamplingParams(max_tokens=20),
            r"= 170 exceeds the KV pool \(20 blocks x 8 tokens\) = 160 tokens.*num_gpu_blocks_override"),
           ({"prompt_token_ids": [1, 2]}, {"temperature": 0.5}, "must be a SamplingParams"),
           ({"prompt_token_ids": [1, 2]}, SamplingParams(stop_token_ids=[999]), "stop_token_ids")]
    for prompt, params, msg in bad:
        with pytest.raises(UserError, match=msg):
            e.add_request(prompt, params)
        e.step()
    with pytest.raises(UserError, match=r"SamplingParams.top_p"):
        SamplingParams(top_p=0)
    # a prompt beyond the context: an engine whose max_model_len (64) is below its pool (160)
    cfg = make_config(model.cfg, "cpu", torch.float32, block_size=8, num_gpu_blocks_override=20, max_model_len=64)
    e2 = build_engine(model, None, cfg, impl="torch")
    r2 = e2.add_request({"prompt_token_ids": USUAL}, SamplingParams(temperature=0, max_tokens=10))
    e2.step()
    with pytest.raises(UserError, match=r"\+ max_tokens \(5\) = 65 exceeds max_model_len = 64 tokens"):
        e2.add_request({"prompt_token_ids": [5] * 60}, SamplingParams(max_tokens=5))
    _run(e), _run(e2)
    assert len(e.requests) == 2 and len(e2.requests) == 1
    assert e2.output(r2).outputs[0].token_ids == _solo(model, USUAL, SamplingParams(temperature=0, max_tokens=10))
    for rid, (pr, m) in zip(ids, good):
        assert e.output(rid).outputs[0].token_ids == _solo(model, pr, SamplingParams(temperature=0, max_tokens=m))


def test_l5_one_forward_and_one_attention_launch_per_layer_per_step(tiny, monkeypatch):
    import l3_paged.cache as cache
    model, _ = tiny("qwen3")
    e = _engine(model, impl="triton", num_blocks=40, budget=40)
    calls = {"attn": 0, "forward": 0}
    real_attn, real_fwd = cache.paged_attention_triton, type(model).forward

    def attn(*a, **k):
        calls["attn"] += 1
        return real_attn(*a, **k)

    def fwd(self, *a, **k):
        calls["forward"] += 1
        return real_fwd(self, *a, **k)
    monkeypatch.setattr(cache, "paged_attention_triton", attn)
    monkeypatch.setattr(type(model), "forward", fwd)
    e.add_request({"prompt_token_ids": USUAL}, SamplingParams(temperature=0, max_tokens=3))
    e.step()                                                   # USUAL prefilled; decodes from now on
    e.add_request({"prompt_token_ids": _prompt(50, 1)}, SamplingParams(temperature=0, max_tokens=3))
    calls.update(attn=0, forward=0)
    e.step()                                                   # one decode + a 39-token chunk
    meta = e.last_meta
    assert meta.cu_seqlens_q.tolist() == [0, 1, 40] and meta.logits_indices.tolist() == [0]   # chunk samples nothing
    assert calls == {"attn": model.cfg.num_layers, "forward": 1}


def test_l5_finished_request_frees_its_blocks_in_the_same_step(tiny):
    model, _ = tiny("qwen3")
    e = _engine(model, num_blocks=30, budget=64)
    a = e.add_request({"prompt_token_ids": USUAL}, SamplingParams(temperature=0, max_tokens=2))
    b = e.add_request({"prompt_token_ids": _prompt(20, 2)}, SamplingParams(temperature=0, max_tokens=5))
    e.step()
    outs = e.step()                                            # a's 2nd token: it finishes now
    assert [(o.request_id, o.finished) for o in outs] == [(a, True), (b, False)]
    assert e.requests[a].kv.freed and e.scheduler.kv.num_free == 30 - len(e.requests[b].blocks)


def test_l5_generate_returns_input_order_and_step_streams_the_same_tokens(tiny):
    model, path = tiny("qwen3")
    llm = LLM(None, device=DEV, max_num_batched_tokens=16, num_gpu_blocks_override=24, block_size=8, impl="torch")
    prompts = ["The capital of France is", {"prompt_token_ids": _prompt(60, 3)}, "Hi"]
    params = [SamplingParams(temperature=0, max_tokens=m) for m in (12, 3, 6)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.request_id for o in outs] == ["r0", "r1", "r2"]
    assert outs[0].outputs[0].token_ids == _solo(model, USUAL, params[0])
    assert [o.outputs[0].finish_reason for o in outs] == ["length"] * 3 and all(o.finished for o in outs)
    assert outs[2].prompt_token_ids == [72, 105] and isinstance(outs[0].outputs[0].text, str)
    eng = llm.llm_engine                                       # the lower level streams the same tokens
    rid = eng.add_request("The capital of France is", params[0])
    streamed = []
    while eng.has_unfinished_requests():
        streamed += [t for o in eng.step() if o.request_id == rid for t in o.new_token_ids]
    assert streamed == outs[0].outputs[0].token_ids
    with pytest.raises(UserError, match="3 prompts but 2 sampling params"):
        llm.generate(prompts, params[:2], use_tqdm=False)
    with pytest.raises(UserError, match=r"prompt 1: .*outside the vocabulary"):
        llm.generate(["ok", {"prompt_token_ids": [999]}], use_tqdm=False)
    assert not eng.has_unfinished_requests()                  # the failed call added nothing


def test_l5_config_errors_name_the_limit_and_the_fix(tiny):
    model, _ = tiny("qwen3")
    mk = lambda **kw: make_config(model.cfg, "cpu", torch.float32, **kw)  # noqa: E731
    with pytest.raises(UserError, match=r"max_num_seqs \(64\) is larger than max_num_batched_tokens \(32\)"):
        mk(max_num_batched_tokens=32, max_num_seqs=64)
    with pytest.raises(UserError, match=r"max_model_len \(2000\) exceeds the model's context"):
        mk(max_model_len=2000)
    with pytest.raises(UserError, match=r"exceeds what the KV pool holds \(4 blocks x 16 = 64 tokens\)"):
        mk(num_gpu_blocks_override=4, max_model_len=100)
    with pytest.raises(UserError, match="block_size must be a positive integer"):
        mk(block_size=0)
    c = mk()
    assert (c.num_blocks, c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len) == (256, 8192, 256, 1024)


def test_l5_smoke_usual_prompt_matches_l4_and_json_has_the_l4_keys(capsys):
    from l4_smoke import main as l4_main
    l4_main(["--json", "--impl", "torch"])
    import json
    l4 = json.loads(capsys.readouterr().out)
    l5_main(["--json", "--impl", "torch"])
    l5 = json.loads(capsys.readouterr().out)
    assert l5["token_ids"] == l4["token_ids"] and set(l4) <= set(l5)
    assert len(l5["requests"]) == 4 and l5["preemptions"] >= 1 and l5["chunked_prefills"]
