"""Stage 13's place in the assembler: off by default (stage 12's engine, part for part); on, its two
parts; what they do not cover refused in one line, before any rank starts or weight loads where it
can be; stage 7's ops flags given with it said to be ignored. The kernels: test_l13_invariance.py."""
import pytest

from plumbing.errors import UserError


def _engine(**kw):
    from l13_batch_invariant import LLM
    return LLM("tiny-qwen3", device="cpu", **kw).llm_engine


def test_off_by_default_and_on_it_picks_its_two_parts(capsys):
    off = _engine(impl="triton")
    assert "l13_batch_invariant" not in off.chosen.values(), off.chosen
    on = _engine(impl="triton", batch_invariant=True, fused_ops=True)
    assert on.chosen["ops"] == on.chosen["kv_cache"] == "l13_batch_invariant"
    assert type(on.runner.ops).__name__ == "InvariantOps" and type(on.runner.cache).__name__ == "InvariantKVCache"
    assert "fused_ops ignored: batch_invariant runs its own ops" in capsys.readouterr().err


@pytest.mark.parametrize("kw,says", [
    (dict(tensor_parallel_size=2), "batch_invariant runs on one GPU"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype='fp8'"),
    (dict(impl="torch"), "needs the Triton kernels"),
])
def test_what_it_does_not_cover_is_refused_before_the_model_loads(kw, says, monkeypatch):
    import l12_tensor_parallel.stage as l12
    monkeypatch.setattr(l12, "load_shard", lambda *a, **k: pytest.fail("a rank loaded its shard"))
    with pytest.raises(UserError, match=says):
        _engine(**dict(dict(impl="triton", batch_invariant=True), **kw))


def test_a_windowed_checkpoint_is_refused():
    from l13_batch_invariant import LLM
    with pytest.raises(UserError, match="sliding windows"):
        LLM("tiny-qwen2-hybrid", device="cpu", impl="triton", batch_invariant=True)
