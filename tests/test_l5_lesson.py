"""Lesson 5 quotes real output: the trace and metadata of the default smoke run, its tokens and
its schedule line (tiny Qwen3, float32, CPU: the lesson's stated conditions). Trace lines hold
only ints, so they are compared exactly."""
import contextlib
import io
import os
import re
from pathlib import Path

import pytest
import torch

from l5_smoke import main as l5_main

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l5_scheduler.md"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def _run(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        l5_main(argv)
    return out.getvalue()


@cpu_only
def test_lesson5_quoted_trace_and_metadata_are_what_the_smoke_script_prints():
    text = LESSON.read_text()
    quoted = [ln for ln in text.splitlines() if ln.startswith("trace      : ") or re.match(r"^ {11}\w+ +=", ln)]
    assert len(quoted) >= 30, "the lesson should quote the trace of steps 0-4 and 14 with their metadata"
    out = _run(["--trace", "--trace-meta", "--impl", "torch"]).splitlines()
    missing = [ln for ln in quoted if ln not in out]
    assert not missing, f"lesson 5 quotes lines the script no longer prints: {missing[:3]}"


@cpu_only
def test_lesson5_quoted_tokens_finish_and_schedule_lines_are_current():
    text = LESSON.read_text().replace("\n  ", " ")
    out = _run([])
    tokens = re.search(r"prints lesson 1's tokens for the usual prompt, `(\[[^\]]*\])`", text).group(1)
    assert f"token ids  : {tokens}" in out
    for line in re.findall(r"`((?:finish|schedule) +: [^`]*)`", text):
        assert line in out, f"lesson 5 quotes {line!r}; l5_smoke printed:\n{out}"


def test_lesson5_quoted_fuzz_figures_are_what_the_default_tier_prints():
    """5.10 quotes the default tier's fuzz summary (derandomized: the same figures on every machine)."""
    import subprocess
    import sys
    text = LESSON.read_text()
    command = '$ python -m pytest -q -m "not lessons and not deep" tests/test_l5_fuzz.py'
    block = text[text.index(command):].split("```")[0].splitlines()[1:]
    quoted = [ln for ln in block if ln.strip() and ln.strip() != "..."]
    assert len(quoted) >= 3, "lesson 5.10 should quote the fuzz summary and the pass line"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not lessons and not deep",
                        "tests/test_l5_fuzz.py"], cwd=LESSON.parent.parent, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})  # as a learner runs it
    assert r.returncode == 0, r.stdout[-3000:]
    printed = r.stdout.splitlines()
    for ln in quoted:
        head = ln.split(" in ")[0] if ln.endswith("s") and " passed" in ln else ln    # the time varies
        assert any(p == ln or (head != ln and p.startswith(head + " in ")) for p in printed), \
            f"lesson 5.10 quotes {ln!r}; the default tier printed:\n{r.stdout[-3000:]}"
