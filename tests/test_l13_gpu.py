"""Stage 13 on a GPU, bf16, a random-weight Qwen3-0.6B-shaped checkpoint: with batch_invariant a
request's logits are the same bits, every step, alone or in batches of 2..128, whole or chunked,
undisturbed or preempted and recomputed, a prefix-cache miss or hit, decoded plainly or verified by
n-gram speculation (k 1..5) or a draft model (tests/l13_scenarios.py). Without it the same pairs
differ somewhere (the control: were none to differ, the scenarios would prove nothing), and the
test prints which, the measured wall of lesson 13. CUDA graphs, async scheduling (off with
speculation) and the default step order run as shipped."""
import os

import pytest
import torch

from l13_batch_invariant import scenarios as sc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

SIZES = dict(num_gpu_blocks_override=4096, max_model_len=1024, max_num_seqs=128)   # several processes per GPU


@pytest.fixture(scope="module")
def checkpoint():
    from benchmarks.outputs import scratch_dir
    from harness.random_checkpoint import build_checkpoint
    return build_checkpoint(os.path.join(scratch_dir("l13_gpu"), "qwen3-0.6b-random"), "Qwen/Qwen3-0.6B")


def _pairs(path: str, invariant: bool) -> dict:
    from l13_batch_invariant import LLM
    r = sc.Runner(lambda **o: LLM(path, device="cuda", dtype=torch.bfloat16, keep_logits=True,
                                  batch_invariant=invariant, **dict(SIZES, **o)))
    return sc.scenarios(r, 151936, draft=path)


def test_with_batch_invariant_every_pair_is_the_same_bits(checkpoint):
    bad = sc.differing(_pairs(checkpoint, True))
    assert not bad, f"batch_invariant: these pairs differ: {bad}"


def test_without_it_some_pairs_differ(checkpoint):
    pairs = _pairs(checkpoint, False)
    bad = sc.differing(pairs)
    print(f"without batch_invariant, {len(bad)} of {len(pairs)} pairs differ: {bad}")
    assert bad, "no pair differs without batch_invariant: the scenarios cannot tell invariant kernels from others"
