"""Lesson 13 quotes real output: the CPU wall table of scripts/l13_wall.py (which pairs' logits
differ with stage 12's parts and with batch_invariant) and its acceptance verdict (CPU, float32,
about two minutes), and the launch count of scripts/l13_launches.py (its own process: it compiles
kernels for a GPU instead of interpreting them)."""
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l13_batch_invariant.md"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")
def test_lesson13_cpu_wall_table_and_acceptance_verdict_are_what_l13_wall_prints():
    from l13_wall import main
    text = LESSON.read_text()
    cpu = text[text.index("`python scripts/l13_wall.py` on the 2-core CPU"):]
    rows = re.findall(r"^\| [a-z].* \|$", cpu[:cpu.index("\n\n", cpu.index("| pair |"))], re.M)
    rows = [r for r in rows if not r.startswith("| pair |")]
    assert len(rows) >= 5, f"lesson 13's CPU wall table has {len(rows)} rows: the check would test too little"
    verdict = re.search(r"\$ python scripts/l13_wall\.py\n(verdict: \w+)", text).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([])
    printed = out.getvalue().splitlines()
    for row in rows:
        assert row in printed, f"lesson 13 quotes {row!r}; l13_wall.py printed:\n{out.getvalue()}"
    assert any(ln.startswith(verdict + " (") for ln in printed), out.getvalue()


def test_lesson13_launch_count_is_what_l13_launches_prints():
    text = LESSON.read_text()
    rest = text[text.index("`python scripts/l13_launches.py`"):]
    block = [ln.strip() for ln in rest.split("```")[1].splitlines() if ln.strip()]
    assert len(block) >= 5 and block[-1].startswith("all "), block
    root = LESSON.parent.parent
    p = subprocess.run([sys.executable, str(root / "scripts" / "l13_launches.py")], cwd=root, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert p.returncode == 0, p.stderr[-3000:]
    printed = [ln.strip() for ln in p.stdout.splitlines()]
    for line in block:
        assert line in printed, f"lesson 13 quotes {line!r}; l13_launches.py printed:\n{p.stdout}"
