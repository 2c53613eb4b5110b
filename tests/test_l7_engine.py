"""Stage 7 on the tiny checkpoints: the fast runner changes how a step runs, never what it computes.

CPU (float32, the interpreter): every request's tokens equal stage 6's, with the fused kernels and
split-KV on, through preemption, prefix hits and chunked prefill; the incremental block table
equals the block lists at every step (``check=True`` compares them), and a planted bug that drops
the changes is caught; padding rows only touch the PAD block. GPU (skipped on a CPU): a CUDA-graph
replay gives the same tokens as an eager step at the same batch, in float32 and bfloat16.
"""
import pytest
import torch

from l4_sampler.params import SamplingParams
from l5_scheduler.config import make_config
from l6_prefix_cache import build_engine as build_stage6
from l7_fast import FusedOps, GraphRunner, build_engine, graph_buckets
from l7_fast.runner import is_uniform_decode
from l7_fast.step_inputs import StepInputs

SYSTEM = [(7 * j + (j * j) % 11) % 240 + 5 for j in range(40)]


def _own(n, salt):
    return [(salt * 41 + 13 * j) % 240 + 5 for j in range(n)]


# Shared prefixes (hits), more tokens than the pool holds at once (preemption), a budget smaller
# than the prompts (chunked prefill), and a seeded sampled request beside the greedy ones.
WORK = ([(SYSTEM + _own(5, i), SamplingParams(temperature=0, max_tokens=7)) for i in range(3)]
        + [(_own(30, 9), SamplingParams(temperature=0.8, seed=3, max_tokens=9))])


def _config(model, num_blocks=14, budget=24, seqs=None):
    dev = str(next(model.parameters()).device)
    return make_config(model.cfg, dev, next(model.parameters()).dtype, block_size=8, num_gpu_blocks_override=num_blocks,
                       max_num_batched_tokens=budget, max_num_seqs=seqs)


def _serve(e, work):
    ids = [e.add_request({"prompt_token_ids": p}, sp, request_id=f"q{i}") for i, (p, sp) in enumerate(work)]
    while e.has_unfinished_requests():
        e.step()
    return [e.requests[i].output_ids for i in ids]


def test_graph_buckets():
    assert graph_buckets(256)[:6] == [1, 2, 4, 8, 16, 32] and graph_buckets(256)[-1] == 256
    assert all(b % 16 == 0 for b in graph_buckets(256)[4:]) and len(graph_buckets(256)) == 20
    assert graph_buckets(1) == [1] and graph_buckets(6) == [1, 2, 4, 6] and graph_buckets(40) == [1, 2, 4, 8, 16, 32, 40]


# fused-ops runs every fused kernel through the interpreter (26 s on 2 cores): the deep tier (make
# test-deep, and CI) runs it, so that make test stays under 5 minutes with stage 10's server tests.
@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=pytest.mark.deep)], ids=["torch-ops", "fused-ops"])
def test_l7_tokens_equal_stage6_through_preemption_hits_and_chunks(tiny, fused):
    model, _ = tiny("qwen3")
    cfg = _config(model)
    want_e = build_stage6(model, None, cfg, impl="triton", check=True)
    want = _serve(want_e, WORK)
    e = build_engine(model, None, cfg, impl="triton", check=True, fused_ops=fused)
    got = _serve(e, WORK)
    assert got == want
    assert isinstance(e.runner.ops, FusedOps) == fused
    assert sum(len(s.preempted) for s in e.stats) > 0, "the workload must preempt"
    assert any(n > 0 for s in e.stats for _, n in s.hits), "the workload must hit the prefix cache"
    assert any(s.prefill_tokens and s.decode_tokens for s in e.stats), "a step must mix decodes and chunks"
    if isinstance(e.runner, GraphRunner):
        assert any(m.startswith("graph") for m in e.runner.mode_log)
    # Rows go back when the scheduler's output says so: only the requests that finished in the last
    # step (their news would reach the runner with the next step) still hold one.
    held = set(e.runner.buf.rows)
    assert held == set(e.scheduler.finished_ids) and held, "every finished or preempted request gave its row back"


def test_l7_incremental_block_table_check_catches_a_lost_change(tiny, monkeypatch):
    """check=True compares the device table with the block lists every step; drop the changes of
    requests that already hold a row, and it must fail."""
    model, _ = tiny("qwen3")
    row_of = StepInputs.row_of

    def lossy(self, rid, kv, upd_index, upd_block):
        ent = self.rows.get(rid)
        if ent is not None and ent[1] is kv:
            ent[2] = len(kv.blocks)                    # pretend the new blocks were sent
        return row_of(self, rid, kv, upd_index, upd_block)

    monkeypatch.setattr(StepInputs, "row_of", lossy)
    e = build_engine(model, None, _config(model), impl="torch", check=True, fused_ops=False)
    with pytest.raises(RuntimeError, match="incremental update lost a change"):
        _serve(e, WORK)


def test_l7_padding_rows_touch_only_the_pad_block(tiny):
    model, _ = tiny("qwen3")
    e = build_engine(model, None, _config(model, num_blocks=32, seqs=8), impl="torch", fused_ops=False, enforce_eager=True)
    for i in range(3):
        e.add_request({"prompt_token_ids": _own(6, i)}, SamplingParams(temperature=0, max_tokens=4))
    e.step()                                           # the three prefills
    before = [k.clone() for k in e.runner.cache.K]
    out = e.scheduler.schedule()
    r = e.runner
    lay, _ = r.prepare(out, pad_to=8)
    f = {k: v.tolist() for k, v in r.buf.tensors(lay).items()}
    pad = r.cache.pad_block
    assert f["slot_mapping"][3:] == [pad * 8] * 5 and f["seq_lens_kv"][3:] == [1] * 5
    assert f["rows"][3:] == [r.buf.pad_row] * 5 and f["cu_seqlens_q"] == list(range(9))
    assert r.buf.table[r.buf.pad_row].eq(pad).all()
    logits, _ = r.forward(lay, 1, 64, 1)
    assert logits.shape[0] == 8 and torch.isfinite(logits).all()
    for k_old, k_new in zip(before, r.cache.K):
        blocks = set((k_old != k_new).flatten(1).any(1).nonzero().flatten().tolist())   # blocks written
        real = {b for req, _ in out.scheduled for b in req.kv.blocks}
        assert pad in blocks and blocks <= real | {pad}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [8, 16])
def test_l7_graph_replay_equals_eager_at_the_same_batch(tiny, dtype, batch):
    from l1_dense.checkpoint import load_model
    _, path = tiny("qwen3")
    model = load_model(path, "cuda", dtype)
    cfg = _config(model, num_blocks=512, budget=512, seqs=batch)
    work = [(_own(20 + i, i), SamplingParams(temperature=0, ignore_eos=True, max_tokens=24)) for i in range(batch)]
    eager = build_engine(model, None, cfg, enforce_eager=True)
    graph = build_engine(model, None, cfg)
    want, got = _serve(eager, work), _serve(graph, work)
    assert sum(m == f"graph {batch}" for m in graph.runner.mode_log) >= 20
    assert got == want


def _one_token_chunk_work():
    """Three requests decoding, then a fourth whose prompt is admitted with the one token the budget
    has left: a step of four one-token rows, one of which does not sample."""
    return ([(_own(6, i), SamplingParams(temperature=0, ignore_eos=True, max_tokens=12)) for i in range(3)]
            + [(_own(10, 7), SamplingParams(temperature=0, ignore_eos=True, max_tokens=6))])


def test_l7_a_one_token_chunk_that_does_not_sample_never_replays_a_graph(tiny):
    """A graph was captured for rows that all sample; such a step has another layout (fewer logits
    rows) and must run eagerly. Checked on the decision itself, so it runs on a CPU too."""
    model, _ = tiny("qwen3")
    e = build_engine(model, None, _config(model, num_blocks=32, budget=4, seqs=4), impl="torch", fused_ops=False)
    work = _one_token_chunk_work()
    for i, (p, sp) in enumerate(work[:3]):
        e.add_request({"prompt_token_ids": p}, sp, request_id=f"q{i}")
    while e.stats == [] or e.stats[-1].prefill_tokens:
        e.step()
    e.add_request({"prompt_token_ids": work[3][0]}, work[3][1], request_id="q3")
    out = e.scheduler.schedule()
    assert [n for _, n in out.scheduled] == [1, 1, 1, 1] and out.sample == [True, True, True, False]
    assert not is_uniform_decode(out)                  # GraphRunner.replay_bucket: eager, whatever the bucket
    out.sample[3] = True
    assert is_uniform_decode(out) and e.runner.bucket(4) == 4


@pytest.mark.gpu
def test_l7_graph_engine_equals_eager_through_a_one_token_chunk(tiny):
    from l1_dense.checkpoint import load_model
    _, path = tiny("qwen3")
    model = load_model(path, "cuda", torch.float32)
    cfg = _config(model, num_blocks=64, budget=4, seqs=4)
    got, want = [], []
    for eager, into in ((False, got), (True, want)):
        e = build_engine(model, None, cfg, enforce_eager=eager)
        work = _one_token_chunk_work()
        for i, (p, sp) in enumerate(work[:3]):
            e.add_request({"prompt_token_ids": p}, sp, request_id=f"q{i}")
        for _ in range(3):
            e.step()
        e.add_request({"prompt_token_ids": work[3][0]}, work[3][1], request_id="q3")
        while e.has_unfinished_requests():
            e.step()
        into += [e.requests[f"q{i}"].output_ids for i in range(4)]
        if not eager:
            assert any(m.startswith("graph") for m in e.runner.mode_log)
            cut = [i for i, st in enumerate(e.stats) if st.decode_tokens == 3
                   and any(n == 1 and start + 1 < plen for _, start, n, plen in st.chunks)]
            assert cut, "the workload must give a step of three decodes and a one-token chunk that does not sample"
            assert all(e.runner.mode_log[i] == "eager" for i in cut), [e.runner.mode_log[i] for i in cut]
    assert got == want
