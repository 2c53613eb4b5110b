"""Lesson 8 quotes real output: the wall's chain and blocks-held runs, the smoke run's tokens and
window line, and the acceptance verdict (windowed tiny checkpoints, float32, CPU: the lesson's
stated conditions). A quoted line ending in ' ...' is the start of a printed line."""
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

from check_chain import main as chain_main
from l8_blocks_held import main as held_main
from l8_smoke import main as l8_main

pytestmark = pytest.mark.lessons          # make test-lessons

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "l8_sliding_window.md"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")
MAINS = {"check_chain": chain_main, "l8_blocks_held": held_main}


def _out(fn, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(argv)
    return out.getvalue().splitlines()


def _quoted_runs(section: str):
    """The '$ python scripts/X.py ARGS' blocks of one section: (script, argv, quoted lines)."""
    text = LESSON.read_text().split(section, 1)[1].split("\n## ", 1)[0]
    for body in re.findall(r"```\n(\$ python scripts/.*?)```", text, re.S):
        first, *lines = body.strip("\n").splitlines()
        script, *argv = shlex.split(first[2:])[1:]
        yield Path(script).stem, argv, [ln for ln in lines if ln.strip()]


def _printed(quoted, out):
    return any(p.startswith(quoted[:-4]) for p in out) if quoted.endswith(" ...") else quoted in out


@cpu_only
def test_lesson8_wall_runs_print_what_the_lesson_quotes(tmp_path):
    runs = list(_quoted_runs("## 8.1 The wall"))
    assert len(runs) == 2, "8.1 quotes the chain's refusals and the blocks-held run"
    for script, argv, quoted in runs:
        if "--out" in argv:
            argv[argv.index("--out") + 1] = str(tmp_path / "held")
        out = _out(MAINS[script], argv)
        missing = [ln for ln in quoted if not _printed(ln, out)]
        assert not missing, f"lesson 8 quotes {missing} for {script} {argv}; it printed:\n" + "\n".join(out)


@cpu_only
def test_lesson8_run_it_tokens_window_line_and_acceptance_verdict_are_current():
    text = LESSON.read_text().split("## 8.11 Run it", 1)[1].replace("\n", " ")
    tokens = re.search(r"`(token ids  : \[[^\]]*\])`", text).group(1)
    window = re.search(r"a line starting `(window     : [^`]*)`", text).group(1)
    out = _out(l8_main, ["--model", "tiny-qwen2-hybrid"])
    assert tokens in out
    assert any(ln.startswith(window) for ln in out), f"lesson 8 quotes {window!r}; l8_smoke printed:\n{out}"
    verdict = re.search(r"ends with `(chain: [^`]*)`", text).group(1)
    assert verdict in _out(chain_main, ["--model", "tiny-qwen2-hybrid"])
