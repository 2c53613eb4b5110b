"""Lesson 6 quotes real output: the trace and metadata of the default smoke run, its summary
lines and tokens, the readmission line of a smaller pool, and measure_wall's counts (tiny Qwen3,
float32, CPU: the lesson's stated conditions). Every quoted line holds only ints or fixed-digit
ratios of ints, so the comparison is exact."""
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from l6_smoke import main as l6_main
from measure_wall import main as wall_main

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l6_prefix_cache.md"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def _out(fn, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(argv)
    return out.getvalue().splitlines()


@cpu_only
def test_lesson6_quoted_trace_metadata_and_summary_are_what_the_smoke_script_prints():
    text = LESSON.read_text()
    quoted = [ln for ln in text.splitlines()
              if ln.startswith(("trace      : ", "prefix hit : ")) or re.match(r"^ {11}\w+ +=", ln)]
    assert len(quoted) >= 14, "the lesson should quote steps 0-6 of the trace, step 2's metadata and the hit line"
    out = _out(l6_main, ["--trace", "--trace-meta", "--impl", "torch"])
    missing = [ln for ln in quoted if ln not in out]
    assert not missing, f"lesson 6 quotes lines the script no longer prints: {missing[:3]}"


@cpu_only
def test_lesson6_quoted_tokens_and_run_it_lines_are_current():
    text = LESSON.read_text().replace("\n  ", " ")
    out = _out(l6_main, [])
    tokens = re.search(r"prints lesson 1's tokens for the usual prompt, `(\[[^\]]*\])`", text).group(1)
    assert f"token ids  : {tokens}" in out
    quoted = re.findall(r"`((?:usual hit|prefill) +: [^`]*)`", text)
    assert len(quoted) == 2
    for line in quoted:
        assert line in out, f"lesson 6 quotes {line!r}; l6_smoke printed:\n{out}"
    off = _out(l6_main, ["--no-enable-prefix-caching"])
    assert f"token ids  : {tokens}" in off
    n_off = re.search(r"the same tokens, and (\d+) tokens computed", text).group(1)
    assert any(ln.startswith(f"prefill    : {n_off} tokens computed") for ln in off)


@cpu_only
def test_lesson6_quoted_readmission_with_stage5s_pool_is_current():
    """6.7: with stage 5's 14-block pool the preempted request's cached block is evicted first."""
    text = LESSON.read_text().replace("\n", " ")
    m = re.search(r"`python scripts/l6_smoke\.py (--num-gpu-blocks-override \d+)`.*?\(`(readmissions after preemption: "
                  r"[^`]*)`\)", text)
    assert m, "lesson 6 no longer quotes the readmission line of the smaller pool"
    out = _out(l6_main, m.group(1).split())
    assert any(ln.startswith("prefix hit : ") and ln.endswith(m.group(2)) for ln in out), \
        f"lesson 6 quotes {m.group(2)!r} for {m.group(1)}; l6_smoke printed:\n{out}"


def test_lesson6_quoted_wall_counts_are_what_measure_wall_prints():
    text = LESSON.read_text()
    block = text[text.index("$ python scripts/measure_wall.py --lesson 6"):].split("```")[0].splitlines()[1:]
    quoted = [ln for ln in block if ln.strip()]
    assert len(quoted) == 3
    out = _out(wall_main, ["--lesson", "6"])
    assert quoted == out, f"measure_wall --lesson 6 printed:\n{out}"
