"""The chain: Hugging Face's greedy generate() and every stage emit the same token ids (fp32, on
the default device: the interpreter on a CPU, compiled kernels on a GPU). tiny-qwen3 in make test,
the other two checkpoints in make test-lessons."""
import pytest
import torch

from plumbing.errors import UserError

from check_chain import main as check_chain
from harness.stages import STAGES


# Stages 8, 9 and 11 are the README test's rows (tests/test_lessons.py, the lessons tier, with every
# row), to keep make test under 5 minutes on 2 cores. On tiny-qwen3 (no windows) stage 8's row
# runs stage 7's kernels through stage 8's runner with one group; the default tier's
# tests/test_l8_engine.py holds stage 8 equal to HF on a windowed checkpoint, batched, chunked and
# preempted. Stage 9's row runs the model-dtype cache, which is stage 8's own part (the default
# tier's tests/test_l9_engine.py checks that it is, and that the fp8 path emits its reference
# path's tokens). Stage 11's kernels are stage 9's, and its identity with stage 9 is the default
# tier's scripts/l11_identity.py test. On tiny-qwen3 each stage is its own test (its tokens
# against the oracle's, hence against every other stage's), so that make test's xdist workers
# can share them out (tests/conftest.py's SPLIT).
# Stages 12 and 13 likewise: the default tier's test_l12_engine.py holds tp 2 equal to transformers on
# the feature matrix's workload and tp 1 equal to stage 11 part for part; test_l13_stage.py and
# test_l13_invariance.py hold stage 13's parts and kernels (its engine rows are deep).
DEFAULT_TIER = [s for s in STAGES if s not in ("l8_sliding_window", "l9_fp8_kv", "l11_spec_decode",
                                               "l12_tensor_parallel", "l13_batch_invariant")]


@pytest.mark.parametrize("family,stages", [("qwen3", s) for s in DEFAULT_TIER]
                         + [pytest.param("llama", None, marks=pytest.mark.lessons),
                            pytest.param("qwen2", None, marks=pytest.mark.lessons)])
def test_every_stage_matches_hf_generate_for_20_tokens(family, stages, chain_run):
    """(stage 9's fp8 line is the README test's: it reports agreement, and costs 30 s of interpreter)"""
    rc, out = chain_run(family, fp8_line=False, stages=stages)
    print(out)
    assert rc == 0, out
    skipped = out.count(" | skipped: ")          # stage 12's row on a machine with one GPU, and only there
    assert skipped == 0 or (not stages and torch.cuda.device_count() == 1), out
    assert "chain: OK" in out and out.count("| yes ") == (1 if stages else len(STAGES) - skipped)


@pytest.mark.parametrize("stages", ["l3_paged", "l1_dense,nope", ",", ""])
def test_check_chain_refuses_unknown_or_no_stage_names_and_lists_the_valid_ones(stages):
    """`--stages l3_paged` once printed "chain: OK, 0 stage(s)": no verdict over nothing."""
    with pytest.raises(UserError) as e:
        check_chain(["--stages", stages])
    assert all(name in str(e.value) for name in STAGES)


def test_every_registered_stage_is_a_compare_side_and_unknown_sides_are_refused():
    from compare import check_side
    for name in ["hf", *(n for n, s in STAGES.items() if s.layerwise)]:
        check_side(name, "--b")
    with pytest.raises(UserError, match="l4_sampler"):
        check_side("l5", "--b")
    batch_only = [n for n, s in STAGES.items() if not s.layerwise]
    assert batch_only == ["l5_scheduler", "l6_prefix_cache", "l7_fast", "l8_sliding_window", "l9_fp8_kv",
                          "l11_spec_decode", "l12_tensor_parallel", "l13_batch_invariant"]
    for name in batch_only:
        with pytest.raises(UserError, match="serves a whole batch"):
            check_side(name, "--b")


@pytest.mark.parametrize("argv,needle", [
    (["--b", "hf", "--plant-bug", "transpose"], "pass a stage as --b"),
    (["--tol", "-1"], "--tol must be a number >= 0"),
])
def test_compare_refuses_what_it_cannot_do(argv, needle):
    from compare import main as compare_main
    with pytest.raises(UserError, match=needle):
        compare_main(argv)


def test_a_row_this_machine_cannot_run_is_listed_as_skipped_and_not_judged(monkeypatch, capsys):
    """Stage 12's row needs two GPUs where it runs on GPUs: on one it says so, and the others are judged."""
    import dataclasses

    import harness.stages as hs

    def one_gpu(model, n_tokens, path):
        raise hs.Skipped("needs two GPUs (tensor_parallel_size 2), this machine shows one")
    monkeypatch.setitem(hs.STAGES, "l12_tensor_parallel",
                        dataclasses.replace(hs.STAGES["l12_tensor_parallel"], make_engine=one_gpu))
    rc = check_chain(["--stages", "l1_dense,l12_tensor_parallel", "--no-fp8-line"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "| l12_tensor_parallel | skipped: needs two GPUs" in out
    assert "chain: OK, 1 stage(s) emit the oracle's 20 tokens exactly; 1 skipped (l12_tensor_parallel" in out
    rc = check_chain(["--stages", "l12_tensor_parallel", "--no-fp8-line"])     # nothing judged: no OK
    assert rc == 1 and "chain: NOTHING COMPARED" in capsys.readouterr().out
