"""The feature matrix (tests/matrix.py): every feature combined with every other, on stage 11's engine.

Default tier: the pairwise rows (every pair of values of two factors in some row), each a chunked,
preempted batch with a shared prefix, judged against transformers. Deep tier: every other row of the
whole product. GPU: the pairwise rows with CUDA graphs on and off, against transformers and, with
graphs, against the same row run eagerly. A planted bug that only one combination shows is caught.
"""
import itertools

import pytest
import torch

import matrix as m

ROWS = m.pairwise(m.FACTORS)
ALL = [dict(zip(m.FACTORS, v)) for v in itertools.product(*m.FACTORS.values())]
REST = [r for r in ALL if m.valid(r) and r not in ROWS]


def test_the_rows_cover_every_pair_and_the_coverage_check_can_fail():
    assert len(ROWS) < len([r for r in ALL if m.valid(r)]) and not m.uncovered(ROWS, m.FACTORS)
    assert m.uncovered(ROWS[1:], m.FACTORS), "dropping a row must leave a pair uncovered"
    assert all(m.valid(r) for r in ROWS)


def check_row(row: dict, device: str = "cpu", **extra):
    tokens, logits, eng = m.run(row, device, **extra)
    wrong = m.judge(row, tokens, logits)
    assert wrong is None, f"{m.row_id(row)}: {wrong}"
    stats, kv = eng.stats, eng.scheduler.kv             # the row ran what it names, or it tests nothing
    assert any(s.preempted for s in stats), "no request was preempted"
    assert any(st + n < full for s in stats for _, st, n, full in s.chunks), "no prompt was chunked"
    assert (kv.stats.hits > 0) == row["enable_prefix_caching"]
    assert ("Overlapped" in type(eng.step_order).__name__) == row["async_scheduling"]
    spec = getattr(eng.step_order, "speculator", None)
    assert (spec is not None and spec.verify_steps > 0) == bool(row["speculation"])
    assert ("float8" in str(eng.runner.cache.K[0].dtype)) == (row["kv_cache_dtype"] != "auto")
    assert (getattr(kv, "blocks_freed", 0) > 0) == (row["model"] != "tiny-qwen3"), "windows freed no block"
    return tokens, eng


@pytest.mark.parametrize("row", ROWS, ids=m.row_id)
def test_matrix_row_equals_transformers(row):
    check_row(row)


@pytest.mark.deep
@pytest.mark.parametrize("row", REST, ids=m.row_id)
def test_matrix_every_other_row_equals_transformers(row):
    check_row(row)


def test_matrix_refuses_the_one_pair_it_cannot_run():
    from plumbing.errors import UserError
    row = dict(ROWS[0], speculation="ngram", async_scheduling=True)
    with pytest.raises(UserError, match="async_scheduling=True cannot run with speculative_config"):
        m.run(row)


def test_matrix_catches_a_bug_only_one_combination_shows(monkeypatch):
    """Planted: the e4m3 cache reads group 0's block table and slots for every layer. Only a windowed
    hybrid checkpoint (several KV cache groups) with an fp8 cache can show it: its pairwise row fails,
    an fp8 row without groups still passes."""
    import l9_fp8_kv.cache as fp8
    monkeypatch.setattr(fp8, "group_of", lambda meta, g: (meta.block_table, meta.slot_mapping))
    hybrid = dict(enable_prefix_caching=True, model="tiny-qwen2-hybrid", kv_cache_dtype="fp8", speculation=None,
                  async_scheduling=False, fused_ops=False)
    tokens, logits, _ = m.run(hybrid)
    assert m.judge(hybrid, tokens, logits) is not None, "the planted bug went unseen"
    plain = dict(hybrid, model="tiny-qwen3")
    tokens, logits, _ = m.run(plain)
    assert m.judge(plain, tokens, logits) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("row", m.pairwise(m.GPU_FACTORS), ids=m.row_id)
def test_matrix_gpu_row_equals_transformers_and_the_eager_engine(row):
    """float32 on the GPU (no bf16 near-tie can flip a token): the Triton path and CUDA graphs."""
    tokens, eng = check_row(row, "cuda")
    graphs = any(mode.startswith("graph") for mode in eng.runner.mode_log)
    assert graphs != row["enforce_eager"], sorted(set(eng.runner.mode_log))
    if not row["enforce_eager"]:
        eager, _, _ = m.run(row, "cuda", enforce_eager=True)
        assert tokens == eager
