"""Stage 10's server at tensor_parallel_size 2 (deep: a server and two ranks start): the engine core
starts its worker rank (it is not a daemonic process, which Python forbids children), the openai
client's streamed and whole completions equal the offline engine's tokens, and when the server
stops no rank is left running."""
import time

import openai
import pytest

from l10_serving import running_server

pytestmark = pytest.mark.deep
PROMPTS = ["The capital of France is", "one two three one two"]


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (Linux /proc)."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = {int(x) for x in f.read().split()}
        except OSError:
            continue
        out |= kids
        todo += kids
    return out


def test_tp2_serves_the_offline_tokens_and_leaves_no_rank_behind():
    import torch

    from l10_server.serve import impl_options
    from l12_tensor_parallel import LLM, SamplingParams
    cuda = torch.cuda.is_available()             # float32 on a GPU too: no bf16 near-tie between tp 1 and tp 2
    same = dict(impl_options("cuda" if cuda else "cpu"), dtype="float32",
                **(dict(num_gpu_blocks_override=512) if cuda else {}))
    want = [o.outputs[0].token_ids for o in LLM("tiny-qwen3", **same).generate(
        PROMPTS, SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)]
    with running_server("tiny-qwen3", tensor_parallel_size=2, dtype="float32") as (base, server):
        core = server.async_llm.proc.pid
        ranks = {core} | _children(core)
        assert len(ranks) >= 2                                  # the engine core and its worker rank (at least)
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0)
        for prompt, ids in zip(PROMPTS, want):
            kw = dict(model="tiny-qwen3", prompt=prompt, max_tokens=12, temperature=0,
                      extra_body={"return_token_ids": True})
            whole = c.completions.create(**kw).choices[0].model_extra["token_ids"]
            streamed = [t for ch in c.completions.create(stream=True, **kw) if ch.choices
                        for t in ch.choices[0].model_extra["token_ids"]]
            assert whole == streamed == ids
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in ranks):
        time.sleep(0.2)
    assert not [p for p in ranks if _alive(p)], "a rank outlived the server"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
