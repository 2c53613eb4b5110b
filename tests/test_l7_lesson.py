"""Lesson 7's quoted CPU output is what the scripts print (tiny Qwen3, float32, on a CPU), and the
lesson holds together: an index (lessons/l7_fast.md) and its chapters (lessons/l7_fast/N_*.md).
The GPU numbers of the ledger are measurements (docs/bench_l7_*), not tested here."""
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.lessons          # make test-lessons

ROOT = Path(__file__).resolve().parent.parent
INDEX_PATH = ROOT / "lessons" / "l7_fast.md"
CHAPTER_PATHS = sorted((ROOT / "lessons" / "l7_fast").glob("*.md"), key=lambda p: int(p.name.split("_")[0]))
INDEX = INDEX_PATH.read_text()
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def chapter(prefix: str) -> str:
    """The text of the chapter whose file name starts with ``prefix`` ("5_host")."""
    (path,) = [p for p in CHAPTER_PATHS if p.name.startswith(prefix)]
    return path.read_text()


def _run(argv):
    from l7_smoke import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    return out.getvalue()


def _squash(line: str) -> str:
    return " ".join(line.split())


# --- the shape of the lesson ---------------------------------------------------------------------
def test_l7_index_links_every_chapter_in_order_and_each_chapter_links_back():
    """Chapters are numbered 1..N without gaps, the index's table links each in order, and each
    chapter links back to the index and to its neighbours."""
    numbers = [int(p.name.split("_")[0]) for p in CHAPTER_PATHS]
    assert numbers == list(range(1, len(numbers) + 1)), [p.name for p in CHAPTER_PATHS]
    linked = re.findall(r"\]\(l7_fast/(\d+_\w+\.md)\)", INDEX.split("## The chapters", 1)[1].split("\n## ", 1)[0])
    assert linked == [p.name for p in CHAPTER_PATHS], linked
    for i, path in enumerate(CHAPTER_PATHS):
        text = path.read_text()
        assert "](../l7_fast.md)" in text, f"{path.name} does not link back to the index"
        for j in (i - 1, i + 1):
            if 0 <= j < len(CHAPTER_PATHS):
                assert f"]({CHAPTER_PATHS[j].name})" in text, f"{path.name} does not link to {CHAPTER_PATHS[j].name}"


def test_l7_chapters_are_short_and_every_relative_link_resolves():
    """One idea a chapter: at most about 400 lines. Every relative link of the index and the
    chapters (anchors aside) points at a file that exists, and every anchor at a heading."""
    for path in [INDEX_PATH] + CHAPTER_PATHS:
        text = path.read_text()
        if path != INDEX_PATH:
            assert len(text.splitlines()) <= 400, f"{path.name} has {len(text.splitlines())} lines"
        for target in re.findall(r"\]\(([^)#:\s]+\.md)(?:#[\w-]+)?\)", text):
            assert (path.parent / target).resolve().exists(), f"{path.name} links {target}, which does not exist"
        for target, anchor in re.findall(r"\]\(([^)#:\s]+\.md)#([\w-]+)\)", text):
            heads = re.findall(r"^#+ (.+)$", (path.parent / target).read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}
            assert anchor in slugs, f"{path.name} links {target}#{anchor}: no such heading"


def test_l7_every_repository_file_the_lesson_names_exists():
    """A path like `l7_fast/step.py` or `tests/test_l7_async.py` in the lesson is a file of the
    repository (scripts/ and the results under docs/ are checked by their own tests)."""
    for path in [INDEX_PATH] + CHAPTER_PATHS:
        named = set(re.findall(r"\b((?:l\d+_\w+|harness|plumbing|tests|exercises)/\w+\.py)\b", path.read_text()))
        missing = sorted(p for p in named if not (ROOT / p).exists())
        assert not missing, f"{path.name} names files that do not exist: {missing}"


# --- quoted outputs ------------------------------------------------------------------------------
@cpu_only
def test_l7_lesson_quotes_the_smoke_tokens_and_fast_path_line():
    run_it = INDEX.split("## Run it", 1)[1]
    tokens = re.search(r"`(\[\d+(?:, \d+)*\])`", run_it).group(1)
    fast = _squash(re.search(r"`(fast path  : .*?)`", run_it, re.S).group(1))
    out = _run([])
    assert f"token ids  : {tokens}" in out
    assert fast in [_squash(ln) for ln in out.splitlines()], out


@cpu_only
def test_l7_lesson_quotes_the_profile_row():
    """`l7_smoke.py --profile` prints the plain run's lines, then one table row per mode: on a CPU
    one eager row whose step count and tokens per step are quoted (the times are this machine's).
    The index quotes the row's start; chapter 1 quotes the header and the whole row, whose wall and
    host ms are this machine's (equal to each other on a CPU) and whose GPU wait is 0.00."""
    run_it = INDEX.split("## Run it", 1)[1]
    row = _squash(re.search(r"`(eager +\d+ +\d+\.\d)`", run_it).group(1))
    fast = _squash(re.search(r"`(fast path  : .*?)`", run_it, re.S).group(1))
    out = [_squash(ln) for ln in _run(["--profile"]).splitlines()]
    assert fast in out, out
    rows = [ln for ln in out if ln.startswith("eager ")]
    assert len(rows) == 1 and rows[0].startswith(row + " ") and rows[0].endswith("(kernel counts need CUDA)"), out
    block = chapter("1_").split("```\nprofile    :", 1)[1].split("```", 1)[0]
    header, quoted = ("profile : " + _squash(block.splitlines()[0]), _squash(block.splitlines()[1]))
    assert header in out, (header, out)
    mode, steps, per_step, wall, host, wait, *tail = quoted.split()
    got_mode, got_steps, got_per_step, got_wall, got_host, got_wait, *got_tail = rows[0].split()
    assert (mode, steps, per_step, wait, tail) == (got_mode, got_steps, got_per_step, got_wait, got_tail), (quoted, rows)
    assert wall == host and got_wall == got_host, (quoted, rows)


def test_l7_lesson_chain_count_is_the_registry_size():
    from harness.stages import STAGES
    assert f"chain: OK, {len(STAGES)} stage(s) emit the oracle's 20 tokens exactly" in INDEX


def test_l7_lesson_quotes_the_host_wall_counts():
    """The columns and call counts of chapter 5's wall table are exact (times are this machine's,
    not compared): plain parts (no cheap branches), stage 6, stage 7."""
    from measure_wall import main
    quoted = chapter("5_").split("$ python scripts/measure_wall.py --lesson 7", 1)[1].split("```", 1)[0]
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


def test_l7_lesson_split_rule_by_hand_is_what_the_rule_says():
    """Chapter 4's worked split counts: the quoted `python -c` prints the quoted line."""
    quoted = chapter("4_").split("```\n$ python -c ", 1)[1].split("```", 1)[0].splitlines()
    argv = shlex.split("python -c " + quoted[0])
    r = subprocess.run([sys.executable] + argv[1:], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == quoted[1].strip(), (quoted, r.stdout, r.stderr)
