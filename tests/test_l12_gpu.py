"""Stage 12 on GPUs: NCCL between one process per GPU (skipped with fewer than two). The matrix
workload at tp 2 in float32 (no bf16 near-tie can flip a token) emits transformers' tokens, with
the Triton kernels, the e4m3 cache and n-gram speculation; decode and prefill steps replay CUDA
graphs captured on both ranks (the workers capture as rank 0 does, and replay what it announces),
and with enforce_eager every step runs eagerly. A worker killed while rank 0 replays graphs stops
the engine with one line in bounded time (lifecycle.py's watch)."""
import faulthandler
import os
import signal
import time

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
    verify = getattr(getattr(eng.step_order, "graphs", None), "keys", [])   # speculation's, across ranks too
    assert group.captured == len(eng.runner.keys) + len(verify) > 0      # every graph captured on the workers too
    replays = [m for m in eng.runner.mode_log if m.startswith("graph")]
    assert replays and "eager" in eng.runner.mode_log, set(eng.runner.mode_log)
    if row["speculation"] is not None:                                   # verify steps replay too: "graph BxQ"
        assert any("x" in m for m in replays), set(eng.runner.mode_log)


def test_tp2_with_enforce_eager_runs_every_step_eagerly():
    eng = check(ROW, 2, "cuda", enforce_eager=True)
    assert set(eng.runner.mode_log) == {"eager"} and eng.model.tensor_parallel.captured == 0


def test_a_worker_killed_mid_replay_stops_the_engine_with_one_line(capfd):
    """The GPU case the CPU tests cannot show: rank 0's GPU waits in a replayed graph's collectives
    (NCCL's watchdog does not watch captured work) when its peer dies. The watch sees the exit, stops
    our all-reduce's polls and aborts NCCL; a later step raises the one line. Bounded: 30 s."""
    from l4_sampler.params import SamplingParams
    from l12_tensor_parallel import LLM, RankFailed
    eng = LLM("tiny-qwen3", device="cuda", dtype=torch.float32, tensor_parallel_size=2,
              num_gpu_blocks_override=512).llm_engine
    group = eng.model.tensor_parallel
    worker = group.procs[0]
    for i in range(8):
        eng.add_request({"prompt_token_ids": list(range(5 + i, 40 + i))},
                        SamplingParams(temperature=0, max_tokens=900, ignore_eos=True))
    for _ in range(20):                                                  # decoding: graphs replayed
        eng.step()
    assert any(m.startswith("graph") for m in eng.runner.mode_log[-5:]), eng.runner.mode_log[-5:]
    capfd.readouterr()
    faulthandler.dump_traceback_later(60, exit=True)     # a step that never returns: stacks, and the run ends
    os.kill(worker.pid, signal.SIGKILL)              # a step is in flight (async scheduling): rank 0's GPU in it
    t0, steps = time.monotonic(), 0
    try:
        with pytest.raises(RankFailed) as e:
            while time.monotonic() - t0 < 30 and eng.has_unfinished_requests():
                eng.step()
                steps += 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    took = time.monotonic() - t0
    said = [x for x in capfd.readouterr().err.splitlines() if x.startswith("l12_tensor_parallel:")]
    assert len(said) <= 1, said                      # the watch's line, or none where the step's error came first
    line = str(e.value)
    assert f"tensor-parallel rank 1 (pid {worker.pid}) was killed by signal 9" in line and "\n" not in line
    assert took < 30, took
    print(f"killed mid-replay: the engine stopped {took:.1f} s and {steps} steps later with: {line}")
    with pytest.raises(RankFailed):
        eng.step()
