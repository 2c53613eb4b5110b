"""The feature matrix: every option that turns a feature on, combined with every other.

    prefix caching      on, off
    checkpoint          tiny-qwen3 (no window), tiny-mistral (every layer windowed), tiny-qwen2-hybrid
    kv_cache_dtype      auto, fp8, fp8_per_token_head
    speculation         none, ngram, a draft model (tiny-llama: same tokenizer, other weights)
    async scheduling    on, off (with speculation: off, and asking for it is refused)
    fused ops           on, off
    graphs              on, off (the GPU only)

``pairwise(FACTORS)`` is a covering array: every pair of values of two factors appears in some row
(11 rows here, against 144 for the whole product on a CPU). Each row runs ``WORKLOAD`` through stage
11's ``LLM``: four requests that share a prefix, in a budget that chunks their prompts and a pool that
preempts one, and is judged against transformers (``judge``): with the model's KV dtype every
token equals HF's greedy tokens; with e4m3 (which cannot be exact) HF reads the engine's own output
and every top-1 disagreement must sit where HF's margin is at most MARGIN_BOUND, as
scripts/l9_accuracy.py bounds stage 9.
"""
from __future__ import annotations

import itertools

FACTORS = {
    "enable_prefix_caching": [True, False],
    "model": ["tiny-qwen3", "tiny-mistral", "tiny-qwen2-hybrid"],
    "kv_cache_dtype": ["auto", "fp8", "fp8_per_token_head"],
    "speculation": [None, "ngram", "draft_model"],
    "async_scheduling": [True, False],
    "fused_ops": [True, False],
}
GPU_FACTORS = dict(FACTORS, enforce_eager=[False, True])
SPECS = {None: None, "ngram": dict(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3),
         "draft_model": dict(method="draft_model", model="tiny-llama", num_speculative_tokens=2)}
MARGIN_BOUND = 1.0                       # logits: an fp8 top-1 flip above HF's margin of 1.0 fails

SYSTEM = [(7 * j + (j * j) % 11) % 240 + 5 for j in range(28)]
#: six prompts, four sharing SYSTEM's first 20-28 tokens (prefix hits), most longer than a step
WORKLOAD = [SYSTEM + [9, 8, 7], SYSTEM + [5, 6] * 3, [3, 1, 4, 1, 5, 9, 2, 6] * 4, SYSTEM[:20], [44, 45] * 9,
            SYSTEM[:24] + [1, 2, 3]]
NEW_TOKENS = 6
SIZES = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=6, dtype="float32")
#: a checkpoint whose every layer is windowed holds little per request (the window's blocks): a
#: smaller step budget bounds that (a windowed group holds ceil((W + chunk - 1) / block_size) + 1)
#: and lets a small pool run dry
SIZES_FOR = {"tiny-mistral": dict(max_num_batched_tokens=8)}
#: the pool, in blocks of the engine's own layout (e4m3 and KV cache groups fit more in the same
#: memory): a few requests' worth in every row, so one is preempted
POOL = {"tiny-qwen3": 16, "tiny-mistral": 10, "tiny-qwen2-hybrid": 40}


def valid(row: dict) -> bool:
    """Speculation runs in stage 5's step order: with async scheduling asked for, it is refused."""
    return not (row["speculation"] and row["async_scheduling"])


def pairwise(factors: dict, ok=valid) -> list[dict]:
    """A covering array, greedily (AETG-style, deterministic): rows are added, each the valid
    combination that covers the most pairs not yet covered, until every coverable pair is."""
    names = list(factors)
    rows = [dict(zip(names, vals)) for vals in itertools.product(*factors.values())]
    rows = [r for r in rows if ok(r)]
    def pairs(r):
        return {((a, r[a]), (b, r[b])) for a, b in itertools.combinations(names, 2)}
    todo = set().union(*(pairs(r) for r in rows))
    out = []
    while todo:
        best = max(rows, key=lambda r: len(pairs(r) & todo))
        out.append(best)
        todo -= pairs(best)
    return out


def uncovered(rows: list[dict], factors: dict, ok=valid) -> set:
    """The pairs of values (a valid row could hold) that no row holds: empty for a covering array."""
    names = list(factors)
    want = {((a, r[a]), (b, r[b])) for r in (dict(zip(names, v)) for v in itertools.product(*factors.values()))
            if ok(r) for a, b in itertools.combinations(names, 2)}
    have = {((a, r[a]), (b, r[b])) for r in rows for a, b in itertools.combinations(names, 2)}
    return want - have


def row_id(row: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in row.items() if not (k == "model")) + f"-{row['model']}"


def options(row: dict, device: str = "cpu") -> dict:
    """The LLM(...) options of a row. On a CPU, to keep a row in seconds under Triton's interpreter:
    the attention is Triton's only where the fused ops are (the torch reference otherwise), and the
    fused ops leave out the GEMV (it reads weights and activations only, so no factor here changes
    what it does; tests/test_l7_kernels.py and the GPU rows check it)."""
    opts = {k: v for k, v in row.items() if k not in ("model", "speculation")}
    opts |= dict(SIZES, **SIZES_FOR.get(row["model"], {}), speculative_config=SPECS[row["speculation"]],
                 keep_logits=True, device=device)
    if device == "cpu":
        opts["impl"] = "triton" if row["fused_ops"] else "torch"
        opts["gemv"] = False
    return opts


def pool_override(row: dict, device: str) -> int:
    """num_gpu_blocks_override (blocks of every layer in the model's dtype) for a pool of POOL
    blocks in the row's own layout: the ratio read off an engine of 1,000."""
    from l11_spec_decode import LLM
    big = LLM(row["model"], **options(row, device), num_gpu_blocks_override=1000).llm_engine.scheduler.kv.num_blocks
    return -(-POOL[row["model"]] * 1000 // big)


def run(row: dict, device: str = "cpu", **extra):
    """The workload through stage 11's engine loop: per request its tokens and each token's logits,
    and the engine."""
    from l4_sampler.params import SamplingParams
    from l11_spec_decode import LLM
    opts = options(row, device) | dict(num_gpu_blocks_override=pool_override(row, device)) | extra
    engine = LLM(row["model"], **opts).llm_engine
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ids = [engine.add_request({"prompt_token_ids": p}, params) for p in WORKLOAD]
    while engine.has_unfinished_requests():
        engine.step()
    return [engine.requests[i].output_ids for i in ids], [engine.requests[i].logits for i in ids], engine


_HF: dict = {}


def oracle(model: str):
    """Transformers' model of the checkpoint (float32, CPU), loaded once: (model, greedy tokens per prompt)."""
    if model not in _HF:
        import torch
        from harness.oracle import hf_model
        from l1_dense.checkpoint import resolve_model_dir
        hf = hf_model(resolve_model_dir(model), "cpu", torch.float32)
        greedy = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, top_k=None, top_p=None,
                              temperature=None, min_new_tokens=NEW_TOKENS)[0, len(p):].tolist() for p in WORKLOAD]
        _HF[model] = (hf, greedy)
    return _HF[model]


def judge(row: dict, tokens: list, logits: list) -> str | None:
    """None if the row's output is right, else what is wrong. The model's KV dtype: HF's greedy
    tokens exactly. e4m3: HF teacher-forced along the engine's tokens; a top-1 disagreement is
    allowed only where HF's margin is at most MARGIN_BOUND."""
    import torch
    hf, greedy = oracle(row["model"])
    if row["kv_cache_dtype"] == "auto":
        bad = [i for i, (a, b) in enumerate(zip(tokens, greedy)) if a != b]
        return f"requests {bad} differ from transformers: {[tokens[i] for i in bad]} != {[greedy[i] for i in bad]}" \
            if bad else None
    for i, (prompt, toks, lg) in enumerate(zip(WORKLOAD, tokens, logits)):
        if len(lg) != len(toks):
            return f"request {i}: {len(lg)} logits kept for {len(toks)} tokens"
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + toks[:-1]])).logits[0, len(prompt) - 1:].float()   # [new, V]
        top2 = ref.topk(2, -1).values
        flips = (torch.stack(lg).argmax(-1) != ref.argmax(-1)) & (top2[:, 0] - top2[:, 1] > MARGIN_BOUND)
        if flips.any():
            return f"request {i}: top-1 flips where transformers' margin exceeds {MARGIN_BOUND} at {flips.nonzero().tolist()}"
    return None
