"""Lesson 5 quotes real output: the trace and metadata of the default smoke run, its tokens and
its schedule line (tiny Qwen3, float32, CPU: the lesson's stated conditions). Trace lines hold
only ints, so they are compared exactly."""
import contextlib
import io
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
