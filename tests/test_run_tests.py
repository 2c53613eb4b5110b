"""scripts/run_tests.py and tests/shards.py: make's tiers as N pytest processes.

The shards cover every selected test exactly once (whole files, test_chain.py test by test); the
runner's exit status is a failing shard's, and a run where no test ran is exit 5, never an OK.
"""
import pytest

from run_tests import main, report
from shards import parse, plan, unit


def test_plan_puts_each_unit_on_one_shard_longest_first_on_the_least_loaded():
    shards = plan({"a": 100, "b": 60, "c": 50, "d": 10, "e": 1}, 2)
    assert sorted(sum(shards, [])) == ["a", "b", "c", "d", "e"]
    assert shards == [["a", "d", "e"], ["b", "c"]]                 # 111 and 110 seconds
    assert plan({"a": 1}, 3) == [["a"], [], []]


def test_units_are_files_but_the_chain_is_shared_out_stage_by_stage():
    assert unit("tests/test_l7_engine.py::test_x[a-b]") == "tests/test_l7_engine.py"
    chain = "tests/test_chain.py::test_every_stage_matches_hf_generate_for_20_tokens[qwen3-l7_fast]"
    assert unit(chain) == chain


@pytest.mark.parametrize("spec", ["2/2", "0/0", "a/b", "1"])
def test_a_bad_shard_is_refused(spec):
    with pytest.raises(ValueError, match="expected I/N"):
        parse(spec)


def test_report_exits_with_a_failing_shards_status_and_5_when_nothing_ran(capsys):
    ok, bad = "=== 3 passed, 9 deselected in 1.0s ===", "=== 1 failed, 2 passed in 1.0s ==="
    assert report([ok, ok], [0, 0], 0.0) == 0
    assert "run_tests: 6 passed in" in capsys.readouterr().out
    assert report([ok, bad], [0, 1], 0.0) == 1
    assert "1 failed" in capsys.readouterr().out
    none = "=== 9 deselected in 0.1s ==="
    assert report([ok, none], [0, 5], 0.0) == 0                    # one shard had nothing selected
    assert report([none, none], [5, 5], 0.0) == 5
    assert "no test ran" in capsys.readouterr().out


def test_two_processes_run_a_selection_and_an_empty_one_is_not_ok(capsys):
    tier = ["--", "-m", "not lessons and not deep", "tests/test_chain.py", "-k", "refuses"]
    assert main(["--jobs", "2"] + tier) == 0
    out = capsys.readouterr().out                                  # six refusal cases, a unit each
    assert "run_tests: 6 passed in" in out and out.count(" exited 0 after ") == 2, out
    assert main(["--jobs", "1"] + tier[:-1] + ["no_such_test_name"]) == 5   # (one process: pytest's own 5)
