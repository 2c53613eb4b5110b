"""Lesson 9 quotes real output: the wall's accuracy run (pool blocks in the same memory, the
verdict) and the acceptance verdict (CPU, float32, the reference path: the lesson's conditions).
A quoted line ending in ' ...' is the start of a printed line."""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

from l9_accuracy import main as accuracy_main

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l9_fp8_kv.md"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def _out(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = accuracy_main(argv)
    return rc, out.getvalue().splitlines()


@cpu_only
def test_lesson9_wall_run_prints_what_the_lesson_quotes():
    text = LESSON.read_text().split("## 9.1 The wall", 1)[1].split("\n## ", 1)[0]
    (body,) = re.findall(r"```\n(\$ python scripts/l9_accuracy\.py.*?)```", text, re.S)
    first, *quoted = [ln for ln in body.strip("\n").splitlines() if ln.strip()]
    rc, out = _out(shlex.split(first[2:])[2:])
    assert rc == 0
    for q in quoted:
        ok = any(p.startswith(q[:-4]) for p in out) if q.endswith(" ...") else q in out
        assert ok, f"lesson 9 quotes {q!r}; l9_accuracy printed:\n" + "\n".join(out)


@cpu_only
def test_lesson9_acceptance_verdict_is_what_the_oracle_prints():
    text = LESSON.read_text()
    verdict = re.search(r"`python scripts/l9_accuracy\.py --impl torch`, ends with\n`([^`]*)`", text).group(1)
    rc, out = _out(["--impl", "torch"])
    assert rc == 0 and verdict in out, "\n".join(out)
