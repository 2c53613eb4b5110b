"""Stage 13 on a GPU, bf16, a random-weight Qwen3-0.6B-shaped checkpoint: with batch_invariant a
request's logits are the same bits, every step, alone or in batches of 2..128, whole or chunked,
undisturbed or preempted and recomputed, a prefix-cache miss or hit, decoded plainly or verified by
n-gram speculation (k 1..5) or a draft model (l13_batch_invariant/scenarios.py). Without it the same pairs
differ somewhere (the control: were none to differ, the scenarios would prove nothing), and the
test prints which, the measured wall of lesson 13. CUDA graphs, async scheduling (off with
speculation) and the default step order run as shipped."""
import os

import pytest
import torch

from l13_batch_invariant import scenarios as sc

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

# a scenario set keeps about ten engines (one per situation): 1,024 blocks each (1.9 GB of K/V at this shape)
SIZES = dict(num_gpu_blocks_override=1024, max_model_len=1024, max_num_seqs=128)


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


def test_every_tile_the_host_picks_gives_the_same_bits():
    """matmul.py lets the host pick a tile by M (pick_tile) because the tile does not change a row's
    bits on a GPU, only where K is cut does. Checked here on this GPU at Qwen3-0.6B's and 8B's shapes
    (and a bias): rows of every M against the same rows in M = 2,048 and against the interpreter's
    one tile. The control: another K_CHUNK must change the bits, or the comparison sees nothing."""
    from l13_batch_invariant.matmul import REFERENCE, matmul, num_sms, pick_tile
    g = torch.Generator(device="cuda").manual_seed(0)
    tiles, bad = set(), []
    for N, K, bias in ((4096, 1024, False), (1024, 2048, False), (1024, 3072, True), (6144, 4096, False),
                       (4096, 12288, False)):
        w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
        x = torch.randn(2048, K, device="cuda", generator=g).bfloat16()
        b = torch.randn(N, device="cuda", generator=g).bfloat16() if bias else None
        full = matmul(x, w, b)
        for M in (1, 7, 16, 17, 64, 65, 200, 256, 257, 300, 1000, 2048):
            tiles.add(pick_tile(M, N, num_sms(x.device)))
            if not torch.equal(matmul(x[:M], w, b), full[:M]):
                bad.append((N, K, M, pick_tile(M, N, num_sms(x.device))))
            if not torch.equal(matmul(x[:M], w, b, tile=REFERENCE, split=False), full[:M]):
                bad.append((N, K, M, REFERENCE))
        assert not torch.equal(matmul(x[:64], w, b, k_chunk=512), full[:64]), "control: K_CHUNK 512 gave 1024's bits"
    assert not bad, f"(N, K, M, tile) whose rows differ from M = 2,048's: {bad}"
    assert len(tiles) >= 4, f"the host picked only {tiles}: the test covers fewer tiles than it claims"


@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama", "tiny-qwen2"])
def test_tiny_checkpoints_in_bf16_every_pair_is_the_same_bits(model):
    """The project's tiny checkpoints (Qwen2's q/k/v biases, Llama 3's RoPE scaling), bf16 on the GPU,
    the same twelve pairs (the draft model is the checkpoint itself)."""
    from l13_batch_invariant import LLM
    r = sc.Runner(lambda **o: LLM(model, device="cuda", dtype=torch.bfloat16, keep_logits=True, batch_invariant=True,
                                  **dict(SIZES, **o)))
    bad = sc.differing(sc.scenarios(r, 256, draft=model))
    assert not bad, f"{model}, batch_invariant: these pairs differ: {bad}"
