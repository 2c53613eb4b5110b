"""Stage 12 on GPUs: NCCL between one process per GPU (skipped with fewer than two). The matrix
workload at tp 2 in float32 (no bf16 near-tie can flip a token) emits transformers' tokens, with
the Triton kernels, the e4m3 cache and n-gram speculation; decode and prefill steps replay CUDA
graphs captured on both ranks (the workers capture as rank 0 does, and replay what it announces),
and with enforce_eager every step runs eagerly."""
import pytest
import torch

from test_l12_engine import ROW, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (tensor_parallel_size 2)")]


@pytest.mark.parametrize("row", [
    ROW,
    dict(ROW, fused_ops=True),
    dict(ROW, speculation="ngram", async_scheduling=False, enable_prefix_caching=False, fused_ops=True),
    dict(ROW, model="tiny-qwen2-hybrid", kv_cache_dtype="fp8", fused_ops=True, async_scheduling=False),
], ids=lambda r: f"fused_ops={r['fused_ops']}-{r['speculation']}-{r['kv_cache_dtype']}-{r['model']}")
def test_tp2_on_two_gpus_replays_graphs_and_emits_transformers_tokens(row, capfd):
    eng = check(row, 2, "cuda")
    group, err = eng.model.tensor_parallel, capfd.readouterr().err
    assert group.spec.backend == "nccl" and group.procs[0].exitcode == 0
    assert group.captured == len(eng.runner.keys) > 0                    # every graph captured on the workers too
    replays = [m for m in eng.runner.mode_log if m.startswith("graph")]
    assert replays and "eager" in eng.runner.mode_log, set(eng.runner.mode_log)
    assert ("verify steps eagerly" in err) == (row["speculation"] is not None)


def test_tp2_with_enforce_eager_runs_every_step_eagerly():
    eng = check(ROW, 2, "cuda", enforce_eager=True)
    assert set(eng.runner.mode_log) == {"eager"} and eng.model.tensor_parallel.captured == 0
