"""The lessons cannot drift from the code: their commands parse, and their quoted output is what
the scripts print (tiny Qwen3, float32, on a CPU: the lessons' stated conditions).

What is compared exactly and what at a tolerance: token ids, verdict lines, table structure,
integers (positions, layers, sizes computed from shapes) exactly; floating-point values whose
last digits depend on the machine (logit and hidden-state differences, logprobs) at the
tolerance stated next to each test, via :func:`_line_close`."""
import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.lessons          # make test-lessons

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "lessons").rglob("*.md")) + [ROOT / "README.md"]   # lesson 7: an index and chapters
#: `python scripts/x.py ARGS` (module x: scripts/ is on sys.path), `python -m benchmarks.x ARGS` and
#: `python benchmarks/x.py ARGS` (module benchmarks.x), studies included
COMMAND = re.compile(r"python (?:scripts/(\w+)\.py|-m (benchmarks(?:\.studies)?\.\w+)|(benchmarks/(?:studies/)?\w+)\.py)"
                     r"([^\n`#|]*)")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


class Parsed(Exception):
    pass


def _commands():
    for doc in DOCS:
        for m in COMMAND.finditer(doc.read_text()):
            module = m.group(1) or m.group(2) or m.group(3).replace("/", ".")
            yield pytest.param(module, m.group(4).strip(), id=f"{doc.name}:{module} {m.group(4).strip()}")


@pytest.mark.parametrize("script,args", list(_commands()))
def test_every_command_in_the_lessons_and_readme_parses(script, args, monkeypatch):
    """Each quoted `python scripts/x.py FLAGS` (or benchmark command) is accepted by its own argument parser."""
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        real(self, argv, namespace)
        raise Parsed
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    argv = shlex.split(args)
    with pytest.raises(Parsed):
        importlib.import_module(script).main(argv)


def _run(script, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = importlib.import_module(script).main(argv)
    return rc, out.getvalue()


FLOAT = re.compile(r"-?\d+\.\d+(?:e[+-]\d+)?")


def _line_close(quoted: str, out: str, atol: float, rtol: float = 0.0) -> str | None:
    """None if `out` has a line equal to `quoted` once every float is replaced by a placeholder,
    and whose floats are within atol + rtol * |quoted| of the quoted ones; else why not."""
    skeleton, want = FLOAT.sub("#", quoted), [float(x) for x in FLOAT.findall(quoted)]
    for cand in out.splitlines():
        if FLOAT.sub("#", cand).strip() == skeleton.strip():
            got = [float(x) for x in FLOAT.findall(cand)]
            if all(abs(g - w) <= atol + rtol * abs(w) for g, w in zip(got, want)):
                return None
            return f"quoted {quoted!r}, printed {cand!r}: beyond atol={atol:g} rtol={rtol:g}"
    return f"quoted {quoted!r}: no printed line has this structure"


def _block_after(text, marker):
    """The lines of the first fenced block after `marker`."""
    rest = text[text.index(marker):]
    lines = [ln for ln in rest.split("```")[1].strip("\n").splitlines()[0:] if ln.strip()]
    assert lines, f"the block after {marker!r} is empty: a quote check must not pass on nothing"
    return lines


@cpu_only
@pytest.mark.parametrize("lesson,script,marker", [
    ("l1_dense", "l1_smoke", "Expected from `python scripts/l1_smoke.py`"),
    ("l2_gather", "l2_smoke", "Expected from `python scripts/l2_smoke.py`"),
    ("l12_tensor_parallel", "l12_smoke", "Expected from `python scripts/l12_smoke.py --tensor-parallel-size 2`"),
    ("l13_batch_invariant", "l13_smoke", "Expected from `python scripts/l13_smoke.py`"),
])
def test_lesson_expected_block_is_what_the_smoke_script_prints(lesson, script, marker):
    expected = _block_after((ROOT / "lessons" / f"{lesson}.md").read_text(), marker)
    _, out = _run(script, marker.split("`")[1].split()[2:])      # the flags the marker quotes
    for line in expected:
        assert line in out, f"{lesson}.md quotes {line!r}, {script}.py printed:\n{out}"


@cpu_only
def test_lesson3_tokens_and_planted_bug_output_are_current():
    text = (ROOT / "lessons" / "l3_paged.md").read_text()
    tokens = re.search(r"both `l3_smoke.py` runs print lesson 1's tokens\n`(\[[^\]]*\])`", text).group(1)
    for impl in ("triton", "torch"):
        assert f"token ids  : {tokens}" in _run("l3_smoke", ["--impl", impl])[1]
    rest = text[text.index("$ python scripts/compare.py --a l2_gather"):]
    quoted = [ln for ln in rest.split("```")[0].splitlines()[1:] if ln.strip()]   # the output under the $ line
    assert len(quoted) >= 3, "l3_paged.md no longer quotes compare.py's output"
    rc, out = _run("compare", ["--a", "l2_gather", "--b", "l3_paged[torch]", "--plant-bug", "transpose"])
    assert rc == 1
    assert quoted[-1].startswith("verdict:") and quoted[-1] in out      # the verdict, exactly
    for line in quoted:   # layers, first bad positions, header exactly; max abs diff within 5%
        problem = _line_close(line, out, atol=0.0, rtol=0.05)
        assert problem is None, f"l3_paged.md: {problem}; compare.py printed:\n{out}"


@cpu_only
def test_lesson4_greedy_and_seeded_tokens_are_current():
    text = (ROOT / "lessons" / "l4_sampler.md").read_text()
    greedy, seeded = re.findall(r"`(\[\d+(?:, \d+)*\])`", text)[:2]
    assert f"token ids  : {greedy}" in _run("l4_smoke", [])[1]
    _, out = _run("l4_smoke", ["--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--logprobs", "3"])
    assert f"token ids  : {seeded}" in out
    first = re.search(r"`logprobs\[0\]: sampled ([^`]*)`", text.replace("\n  ", " "))
    assert first, "l4_sampler.md no longer quotes logprobs[0]"
    problem = _line_close(f"logprobs[0]: sampled {first.group(1)}", out, atol=5e-3)   # ids exact, logprobs +-0.005
    assert problem is None, f"l4_sampler.md: {problem}"


@cpu_only
def test_readme_chain_table_is_what_make_demo_prints(chain_run):
    readme = (ROOT / "README.md").read_text()
    quoted = _block_after(readme, "`make demo` ends with a table and a verdict")
    rc, out = chain_run("qwen3")                  # = make demo's `check_chain.py` (tiny Qwen3, float32)
    assert rc == 0
    assert quoted[-1].startswith("chain: OK") and quoted[-1] in out    # the verdict, exactly
    # Stage names, "yes", first diff and margin exactly; the logit-diff column (float32 summation
    # order: its digits vary between machines) within 5e-5, as the README states.
    for line in quoted:
        problem = _line_close(line, out, atol=5e-5)
        assert problem is None, f"README: {problem}; check_chain printed:\n{out}"
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("| stage")]
    assert len(rows) == len([ln for ln in quoted if ln.startswith("| ") and not ln.startswith("| stage")])


def test_lesson2_wall_table_is_what_measure_wall_prints():
    """The paged row comes from the real allocator (deterministic: compared exactly)."""
    text = (ROOT / "lessons" / "l2_gather.md").read_text()
    rows = re.findall(r"^\| (dense|paged), `(?:max_seq_len|block_size)` (\d+)[^|]*\| ([^|]+) \| (\d+) \| ([^|]+) \|$",
                      text, re.M)
    assert len(rows) == 3, rows
    _, out = _run("measure_wall", ["--lesson", "2"])
    for kind, size, reserved, fit, used in rows:
        want = f"| {kind}, {'max_seq_len' if kind == 'dense' else 'block_size'} {size} | {reserved} | {fit} | {used} |"
        assert want in out, f"l2_gather.md row {want!r}; measure_wall printed:\n{out}"
    frag = re.search(r"The mix above wastes less, ([\d.]+%)", text).group(1)
    assert f"= {frag} " in out


def test_measure_wall_lessons_3_and_4_run_and_print_their_quoted_quantities():
    _, out = _run("measure_wall", ["--lesson", "3", "--reps", "1"])
    assert "gather copies 144 MiB per step per sequence" in out and "27 GiB moved" in out
    _, out = _run("measure_wall", ["--lesson", "4", "--batch", "2", "--reps", "1"])
    assert "ms per step on this machine" in out
