"""Stage 12's engine: worker processes joined by gloo, the engine core in this process (rank 0).

tp 2 emits transformers' greedy tokens on tests/matrix.py's workload (a shared prefix, chunked
prompts, a preemption), and close() then stops its workers at once; tp 1 is stage 11's engine part for part; a worker that is killed, hangs or
is interrupted stops the engine in bounded time with one line, and close() never hangs."""
import os
import signal
import subprocess
import sys
import time

import pytest

import matrix as m
from plumbing.errors import UserError

ROW = dict(enable_prefix_caching=True, model="tiny-qwen3", kv_cache_dtype="auto", speculation=None,
           async_scheduling=True, fused_ops=False)


def run_tp(row: dict, tp: int, device: str = "cpu", **extra):
    """The matrix workload through stage 12's engine: tokens, logits, the engine (its ranks closed)."""
    from l4_sampler.params import SamplingParams
    from l12_tensor_parallel import LLM
    opts = m.options(row, device) | dict(num_gpu_blocks_override=m.pool_override(row, device),
                                         tensor_parallel_size=tp) | extra
    eng = LLM(row["model"], **opts).llm_engine
    try:
        params = SamplingParams(temperature=0, max_tokens=m.NEW_TOKENS, ignore_eos=True)
        ids = [eng.add_request({"prompt_token_ids": p}, params) for p in m.WORKLOAD]
        while eng.has_unfinished_requests():
            eng.step()
    finally:
        if tp > 1:
            group, t0 = eng.model.tensor_parallel, time.monotonic()
            group.close()
            assert time.monotonic() - t0 < 3 and all(p.exitcode == 0 for p in group.procs)   # a clean stop
            group.close()                                                                  # again: nothing
    return [eng.requests[i].output_ids for i in ids], [eng.requests[i].logits for i in ids], eng


def check(row: dict, tp: int, device: str = "cpu", **extra):
    tokens, logits, eng = run_tp(row, tp, device, **extra)
    assert m.judge(row, tokens, logits) is None
    assert any(s.preempted for s in eng.stats) and any(st + n < full for s in eng.stats for _, st, n, full in s.chunks)
    assert (eng.scheduler.kv.stats.hits > 0) == row["enable_prefix_caching"]
    sent = eng.model.tensor_parallel.sent
    assert sent.steps + sent.replays >= len(eng.stats), sent   # every forward pass went to the workers
    print(sent)
    return eng


def test_tp2_emits_transformers_tokens_chunked_preempted_with_a_shared_prefix():
    check(ROW, 2)


@pytest.mark.deep
@pytest.mark.parametrize("row,tp", [
    (dict(ROW, fused_ops=True), 2),                                                 # Triton kernels on shards
    (dict(ROW, speculation="ngram", async_scheduling=False, enable_prefix_caching=False), 2),
    (dict(ROW, model="tiny-qwen2-hybrid", async_scheduling=False), 2),              # windows: 2 KV cache groups
    (dict(ROW, model="tiny-mistral"), 2),
    (ROW, 4),                                                                        # each KV head on 2 ranks
    (dict(ROW, kv_cache_dtype="fp8", fused_ops=True), 2),                           # e4m3: agreement
    (dict(ROW, speculation="draft_model", async_scheduling=False), 2),              # the draft model: rank 0's
], ids=lambda v: str(v) if isinstance(v, int) else m.row_id(v))
def test_tp_rows_emit_transformers_tokens(row, tp):
    check(row, tp)


@pytest.mark.deep
@pytest.mark.parametrize("model,tp", [("tiny-llama", 4), ("tiny-qwen2", 2)])
def test_tp_on_other_checkpoints(model, tp, capfd):
    """llama at tp 4 (2 KV heads over 4 ranks), qwen2 (one KV head, biases, tied embeddings); the
    switch for our all-reduce, given on a CPU (gloo has its own only), is said to be ignored."""
    from l12_tensor_parallel import LLM, SamplingParams
    from l11_spec_decode import LLM as LLM11
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [{"prompt_token_ids": w} for w in m.WORKLOAD]
    want = [o.outputs[0].token_ids for o in LLM11(model, impl="torch", device="cpu").generate(prompts, p)]
    llm = LLM(model, impl="torch", device="cpu", tensor_parallel_size=tp, disable_custom_all_reduce=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, p)]
    llm.llm_engine.model.tensor_parallel.close()
    assert got == want
    assert "disable_custom_all_reduce is ignored: gloo has only its own all-reduce" in capfd.readouterr().err


def test_tp1_is_stage_11s_engine_part_for_part():
    from l11_spec_decode import LLM as LLM11
    from l12_tensor_parallel import LLM
    kw = dict(device="cpu", impl="torch", num_gpu_blocks_override=32)
    e12, e11 = LLM(None, **kw).llm_engine, LLM11(None, **kw).llm_engine
    assert e12.chosen == e11.chosen and e12.chosen["model"] == "l5_scheduler"
    assert not hasattr(e12.model, "tensor_parallel")


def test_tp2s_model_is_a_part_the_runner_calls_and_every_other_part_is_stage_11s(monkeypatch):
    """The model part is ShardedModel (no method of any object replaced), asked for first: the runner
    holds it, the KV cache was sized for its shard's KV heads. Rank 0 reads its slices of the
    checkpoint only: the whole-model loader is never called."""
    import l5_scheduler.stage
    from l11_spec_decode import LLM as LLM11
    from l12_tensor_parallel import LLM
    from l12_tensor_parallel.model import ShardedModel
    kw = dict(device="cpu", impl="torch", num_gpu_blocks_override=32)
    e11 = LLM11(None, **kw).llm_engine

    def whole(*a):
        raise AssertionError("rank 0 loaded the whole checkpoint")
    monkeypatch.setattr(l5_scheduler.stage, "load_model", whole)
    e12 = LLM(None, tensor_parallel_size=2, **kw).llm_engine
    try:
        assert isinstance(e12.model, ShardedModel) and e12.runner.model is e12.model
        assert e12.chosen == dict(e11.chosen, model="l12_tensor_parallel")
        assert not any("forward" in vars(m) for m in e12.model.modules())
        assert e12.runner.cache.K[0].shape[-2] * 2 == e11.runner.cache.K[0].shape[-2]    # half the KV heads
    finally:
        e12.model.tensor_parallel.close()


def started(tp: int = 2):
    from l12_tensor_parallel import LLM, SamplingParams
    llm = LLM(None, device="cpu", impl="torch", fused_ops=False, tensor_parallel_size=tp, num_gpu_blocks_override=32)
    eng = llm.llm_engine
    eng.add_request({"prompt_token_ids": list(range(5, 30))}, SamplingParams(temperature=0, max_tokens=50,
                                                                            ignore_eos=True))
    eng.step()
    return eng, eng.model.tensor_parallel


def test_ctrl_c_leaves_the_workers_running_and_a_killed_one_stops_the_engine_with_one_line():
    """A terminal's Ctrl-C reaches every process of its group: the workers ignore it, so the step in
    flight completes (rank 0 raises KeyboardInterrupt and stops them). A worker killed stops the
    engine within seconds, named in one line, and the engine stays stopped."""
    from l12_tensor_parallel import RankFailed
    eng, group = started()
    worker = group.procs[0]
    os.kill(worker.pid, signal.SIGINT)
    eng.step()                                                           # the worker is still there
    os.kill(worker.pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RankFailed) as e:
        eng.step()
    assert time.monotonic() - t0 < 10
    assert f"tensor-parallel rank 1 (pid {worker.pid}) was killed by signal 9" in str(e.value)
    assert "\n" not in str(e.value) and group.closed
    with pytest.raises(RankFailed, match="was killed by signal 9"):
        eng.step()


@pytest.mark.deep
def test_a_death_the_watch_saw_stops_the_next_step_with_its_line():
    """On GPUs the watch (lifecycle.py) names a worker that exits and marks the group; the next step,
    or replay, raises that line and stops the rest (here the mark is set by hand: gloo needs no watch)."""
    from l12_tensor_parallel import RankFailed
    eng, group = started()
    group._held["why"] = "tensor-parallel rank 1 (pid 1) was killed by signal 9; the engine stops."
    with pytest.raises(RankFailed, match=r"rank 1 \(pid 1\) was killed by signal 9"):
        eng.step()
    assert group.closed and all(not p.is_alive() for p in group.procs)


@pytest.mark.deep
def test_a_replay_announced_to_a_killed_worker_stops_the_engine_with_one_line():
    """A CUDA graph's replay is announced by pipe (graphs.py): a worker gone by then is named as a
    step's would be (the announcement is the only host message of a replayed step)."""
    from l12_tensor_parallel import RankFailed
    eng, group = started()
    worker = group.procs[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(5)
    with pytest.raises(RankFailed, match=f"tensor-parallel rank 1 \\(pid {worker.pid}\\) was killed by signal 9"):
        group.replay(0)
    assert group.closed


@pytest.mark.deep
def test_a_worker_that_raises_is_named_with_its_error():
    """Planted: a step message the worker cannot read. It sends its error's first line and exits 1;
    rank 0's next step names the rank and quotes the line."""
    from l12_tensor_parallel import RankFailed
    eng, group = started()
    group.conns[0].send_bytes(b"not a step")
    with pytest.raises(RankFailed, match=r"tensor-parallel rank 1 \(pid \d+\) exited \(1\): \w+Error: .*the engine "
                                         r"stops\.$"):
        eng.step()


@pytest.mark.deep
def test_an_error_on_rank_0_mid_step_stops_the_workers_it_left_inside_the_step(monkeypatch):
    """Planted: rank 0's own shard raises after the workers got the step. Its error is raised as
    it is, the workers (waiting in a collective) are stopped at once, and the engine stays stopped."""
    from l12_tensor_parallel import RankFailed
    eng, group = started()

    def broken(*a, **kw):
        raise ValueError("planted")
    monkeypatch.setattr(eng.model.shard, "forward", broken)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="planted"):
        eng.step()
    assert time.monotonic() - t0 < 10 and group.closed and not any(p.is_alive() for p in group.procs)
    with pytest.raises(RankFailed, match="an earlier step raised ValueError on rank 0"):
        eng.step()


@pytest.mark.deep
def test_a_hung_worker_stops_the_engine_after_the_collective_timeout(monkeypatch):
    import l12_tensor_parallel.lifecycle as life
    import l12_tensor_parallel.stage as st
    from l12_tensor_parallel import RankFailed
    monkeypatch.setattr(st, "TIMEOUT_S", 3.0)
    monkeypatch.setattr(life, "STOP_TIMEOUT_S", 1.0)
    eng, group = started()
    worker = group.procs[0]
    os.kill(worker.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(RankFailed, match=r"waited 3 s for a rank that did not answer \(a hung worker\)"):
            eng.step()
        assert time.monotonic() - t0 < 15
        assert not worker.is_alive()                                     # close() killed it, stopped as it was
    finally:
        if worker.is_alive():
            os.kill(worker.pid, signal.SIGKILL)


SCRIPT = """
import faulthandler, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)         # the test asks for stacks if it hangs
signal.signal(signal.SIGINT, signal.default_int_handler)        # a terminal's: an ignored SIGINT is inherited
# (the deep tier's worker process had SIGINT ignored by an earlier test: this child then ignored Ctrl-C)
from l12_tensor_parallel import LLM, SamplingParams
llm = LLM(None, device="cpu", impl="torch", fused_ops=False, tensor_parallel_size=2, num_gpu_blocks_override=32)
print(*[p.pid for p in llm.llm_engine.model.tensor_parallel.procs], flush=True)
while True:
    llm.generate([{"prompt_token_ids": list(range(5, 30))}], SamplingParams(max_tokens=20), use_tqdm=False)
"""


@pytest.mark.deep
def test_ctrl_c_in_a_script_stops_every_rank():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", SCRIPT.replace('"""', "")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert pids, p.stderr.read()
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)                                  # as a terminal does: the whole group
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:                                # rank 0's stacks, then the failure
            os.kill(p.pid, signal.SIGUSR1)
            time.sleep(1)
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"rank 0 did not stop within 20 s of Ctrl-C; its stderr:\n{p.communicate()[1][-8000:]}")
        assert "KeyboardInterrupt" in p.stderr.read()
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def test_a_model_that_is_not_its_checkpoint_is_refused_before_any_rank_starts():
    """build_engine given a loaded model and no path: the other ranks would load tiny-qwen3 (the default)."""
    from l1_dense.checkpoint import load_model, resolve_model_dir
    from l5_scheduler.config import make_config
    from l12_tensor_parallel import build_engine
    import torch
    model = load_model(resolve_model_dir("tiny-llama"), "cpu", torch.float32)
    cfg = make_config(model.cfg, "cpu", torch.float32, num_gpu_blocks_override=16)
    with pytest.raises(UserError, match="which is not this model's checkpoint"):
        build_engine(model, None, cfg, tensor_parallel_size=2, impl="torch")


def test_every_rank_builds_the_smallest_pool_any_rank_holds():
    """Rank 0 and each worker size a pool for their own GPU's free memory; a block id must be a slot
    on every rank, so all build the smallest (planted: the largest, or rank 0's own, fails)."""
    import multiprocessing as mp
    import pickle

    from l5_scheduler.config import EngineConfig
    from l12_tensor_parallel.group import TensorParallel
    group = TensorParallel.__new__(TensorParallel)
    pipes = [mp.Pipe() for _ in range(2)]
    group.conns = [mine for mine, _ in pipes]
    group.sizes = {1: EngineConfig(16, 900, 64, 8, 1024), 2: EngineConfig(16, 700, 64, 8, 1024)}
    agreed = group.agree(EngineConfig(16, 800, 64, 8, 1024))
    assert agreed.num_blocks == 700
    assert all(pickle.loads(theirs.recv_bytes()) == agreed for _, theirs in pipes)
