"""Lesson 11 quotes real output: the acceptance verdict of scripts/l11_identity.py (CPU, float32)."""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

from l11_identity import main as identity_main

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l11_spec_decode.md"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")
def test_lesson11_acceptance_verdict_is_what_the_identity_check_prints():
    text = " ".join(LESSON.read_text().split())
    cmd, verdict = re.search(r"The acceptance command, `(python scripts/l11_identity\.py[^`]*)`.*? ends with `([^`]*)`",
                             text).groups()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = identity_main(shlex.split(cmd)[2:])
    assert rc == 0 and verdict in out.getvalue().splitlines(), out.getvalue()
