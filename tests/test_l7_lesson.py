"""Lesson 7's quoted CPU output is what the scripts print (tiny Qwen3, float32, on a CPU).
The GPU numbers of the ledger are measurements (docs/bench_l7_h200.*), not tested here."""
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

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
    run_it = LESSON.split("## 7.10 Run it", 1)[1]
    tokens = re.search(r"`(\[\d+(?:, \d+)*\])`", run_it).group(1)
    fast = " ".join(re.search(r"`(fast path  : .*?)`", run_it, re.S).group(1).split())
    out = _run([])
    assert f"token ids  : {tokens}" in out
    assert fast in [" ".join(ln.split()) for ln in out.splitlines()], out


def test_l7_lesson_chain_count_is_the_registry_size():
    from harness.stages import STAGES
    assert f"chain: OK, {len(STAGES)} stage(s) emit the oracle's 20 tokens exactly" in LESSON
