"""Flags never fail silently: 0 is not "the default", an ignored flag says so on stderr, bad input
names the fix, --json stays one object on stdout while progress and notes go to stderr."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plumbing.cli import Watch
from plumbing.errors import UserError
from l1_smoke import main as l1_main
from l2_smoke import main as l2_main
from l4_smoke import main as l4_main

FAST = ["--max-new-tokens", "2"]


@pytest.mark.parametrize("main,argv,needle", [
    (l1_main, ["--max-seq-len", "0"], "--max-seq-len must be a positive integer, got 0"),
    (l2_main, ["--num-blocks", "0"], "--num-blocks must be a positive integer, got 0"),
    (l2_main, ["--num-blocks", "-3"], "--num-blocks must be a positive integer, got -3"),
    (l2_main, ["--num-blocks", "2"], "raise --num-blocks"),
    (l1_main, ["--max-seq-len", "10"], "raise --max-seq-len"),
    (l1_main, ["--prompt-ids", "-1,5,6"], "token ids [-1] are outside the vocabulary"),
    (l1_main, ["--model", "tiny-foo"], "tiny-qwen3, tiny-llama, tiny-qwen2"),
])
def test_bad_flags_name_the_problem_and_the_fix(main, argv, needle):
    with pytest.raises(UserError) as e:
        main(argv)
    assert needle in str(e.value)


def test_seed_and_truncation_at_temperature_0_are_reported_as_ignored(capsys):
    l4_main(["--seed", "7", "--top-p", "0.9", "--impl", "torch", *FAST])
    err = capsys.readouterr().err
    assert "note: --seed 7, --top-p 0.9 ignored at --temperature 0" in err
    l4_main(["--seed", "7", "--temperature", "0.8", "--impl", "torch", *FAST])
    assert "ignored" not in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the note is about CPU runs")
def test_bfloat16_on_cpu_says_its_tokens_are_not_the_lessons(capsys):
    l1_main(["--dtype", "bfloat16", *FAST])
    assert "differ from the float32 ones the lessons quote" in capsys.readouterr().err


def test_json_is_one_object_with_timing_and_progress_goes_to_stderr(capsys):
    l2_main(["--json", *FAST])
    out = capsys.readouterr().out
    rec = json.loads(out)                       # the whole stdout is one object
    assert rec["elapsed_s"] > 0 and rec["tokens_per_s"] > 0
    l1_main(FAST)
    assert "tokens/s" in capsys.readouterr().out


class _Engine:
    def prefill(self, ids):
        return ids

    def decode(self, tok):
        return tok


def test_watch_prints_progress_on_stderr_unless_quiet(capsys):
    w = Watch(_Engine(), total=3, quiet=False, every_s=0.0)
    w.prefill([1]), w.decode(2), w.decode(3)
    assert capsys.readouterr().err.count("tokens/s") == 3
    q = Watch(_Engine(), total=3, quiet=True, every_s=0.0)
    q.prefill([1]), q.decode(2)
    assert capsys.readouterr().err == ""


def test_measure_wall_says_which_given_flags_its_lesson_ignores(capsys):
    from measure_wall import main as wall_main
    wall_main(["--lesson", "6", "--requests", "4", "--context", "64"])
    err = capsys.readouterr().err
    assert "--context applies to lesson(s) 3 only: ignored for lesson 6" in err
    assert "--requests" not in err


ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def heavy_imports_before_a_bad_flag(script: Path) -> tuple[int, list[str]]:
    """Run ``script --no-such-flag``: its exit code, and torch/triton if either was imported first."""
    r = subprocess.run([sys.executable, "-X", "importtime", str(script), "--no-such-flag"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    return r.returncode, sorted(loaded & {"torch", "triton"})


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_bad_flag_is_refused_before_torch_and_triton_load(script):
    code, heavy = heavy_imports_before_a_bad_flag(script)
    assert code == 2 and heavy == [], (code, heavy)


def test_the_bad_flag_check_fails_on_a_script_that_imports_torch_first(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import argparse\nimport torch\nargparse.ArgumentParser().parse_args()\n")
    assert heavy_imports_before_a_bad_flag(planted) == (2, ["torch"])
    assert len(SCRIPTS) >= 15                    # the smoke scripts, check_chain, compare, the benchmarks
