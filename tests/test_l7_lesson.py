"""Lesson 7's quoted CPU output is what the scripts print (tiny Qwen3, float32, on a CPU).
The GPU numbers of the ledger are measurements (docs/bench_l7_h200.*), not tested here."""
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.lessons          # make test-lessons

ROOT = Path(__file__).resolve().parent.parent
LESSON = (ROOT / "lessons" / "l7_fast.md").read_text()
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def _run(argv):
    from l7_smoke import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


@cpu_only
def test_l7_lesson_quotes_the_smoke_tokens_and_fast_path_line():
    run_it = LESSON.split("## 7.15 Run it", 1)[1]
    tokens = re.search(r"`(\[\d+(?:, \d+)*\])`", run_it).group(1)
    fast = " ".join(re.search(r"`(fast path  : .*?)`", run_it, re.S).group(1).split())
    out = _run([])
    assert f"token ids  : {tokens}" in out
    assert fast in [" ".join(ln.split()) for ln in out.splitlines()], out


@cpu_only
def test_l7_lesson_quotes_the_profile_row():
    """`l7_smoke.py --profile` prints the plain run's lines, then one table row per mode: on a CPU
    one eager row whose step count and tokens per step are quoted (the times are this machine's)."""
    run_it = LESSON.split("## 7.15 Run it", 1)[1]
    row = " ".join(re.search(r"`(eager +\d+ +\d+\.\d)`", run_it).group(1).split())
    fast = " ".join(re.search(r"`(fast path  : .*?)`", run_it, re.S).group(1).split())
    out = [" ".join(ln.split()) for ln in _run(["--profile"]).splitlines()]
    assert fast in out, out
    rows = [ln for ln in out if ln.startswith("eager ")]
    assert len(rows) == 1 and rows[0].startswith(row + " ") and rows[0].endswith("(kernel counts need CUDA)"), out


def test_l7_lesson_chain_count_is_the_registry_size():
    from harness.stages import STAGES
    assert f"chain: OK, {len(STAGES)} stage(s) emit the oracle's 20 tokens exactly" in LESSON


def test_l7_lesson_quotes_the_host_wall_counts():
    """The columns and call counts of lesson 7.6's wall table are exact (times are this machine's,
    not compared): plain parts (no cheap branches), stage 6, stage 7."""
    from measure_wall import main
    quoted = LESSON.split("## 7.6 The host", 1)[1].split("$ python scripts/measure_wall.py --lesson 7", 1)[1]
    quoted = quoted.split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--lesson", "7", "--reps", "1"])
    printed = out.getvalue().splitlines()
    header = next(ln for ln in quoted.splitlines() if ln.startswith("| per decode step |"))
    assert header in printed, (header, printed)
    for label in ("KV manager reserve() calls", "StopChecker.update() calls", "block-table row_of() calls"):
        want = next(ln for ln in quoted.splitlines() if ln.startswith(f"| {label} |"))
        assert want in printed, (want, printed)
    calls = next(ln for ln in printed if ln.startswith("| Python function calls"))
    plain, stage6, stage7 = (float(x.replace(",", "")) for x in calls.split("|")[2:5])
    assert stage7 < plain / 4 and stage7 < stage6, calls      # (depends a little on the Python version)
