"""The lessons cannot drift from the code: their commands parse, and their quoted output is what
the scripts print (tiny Qwen3, float32, on a CPU: the lessons' stated conditions)."""
import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "lessons").glob("*.md")) + [ROOT / "README.md"]
COMMAND = re.compile(r"python scripts/(\w+)\.py([^\n`#|]*)")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


class Parsed(Exception):
    pass


def _commands():
    for doc in DOCS:
        for m in COMMAND.finditer(doc.read_text()):
            yield pytest.param(m.group(1), m.group(2).strip(), id=f"{doc.name}:{m.group(1)} {m.group(2).strip()}")


@pytest.mark.parametrize("script,args", list(_commands()))
def test_every_command_in_the_lessons_and_readme_parses(script, args, monkeypatch):
    """Each quoted `python scripts/x.py FLAGS` is accepted by x.py's own argument parser."""
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


def _block_after(text, marker):
    """The lines of the first fenced block after `marker`."""
    rest = text[text.index(marker):]
    return [ln for ln in rest.split("```")[1].strip("\n").splitlines()[0:] if ln.strip()]


@cpu_only
@pytest.mark.parametrize("lesson,script,marker", [
    ("l1_dense", "l1_smoke", "Expected from `python scripts/l1_smoke.py`"),
    ("l2_gather", "l2_smoke", "Expected from `python scripts/l2_smoke.py`"),
])
def test_lesson_expected_block_is_what_the_smoke_script_prints(lesson, script, marker):
    expected = _block_after((ROOT / "lessons" / f"{lesson}.md").read_text(), marker)
    _, out = _run(script, [])
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
    rc, out = _run("compare", ["--a", "l2_gather", "--b", "l3_paged[torch]", "--plant-bug", "transpose"])
    assert rc == 1
    for line in quoted:
        assert line in out, f"l3_paged.md quotes {line!r}; compare.py printed:\n{out}"


@cpu_only
def test_lesson4_greedy_and_seeded_tokens_are_current():
    text = (ROOT / "lessons" / "l4_sampler.md").read_text()
    greedy, seeded = re.findall(r"`(\[\d+(?:, \d+)*\])`", text)[:2]
    assert f"token ids  : {greedy}" in _run("l4_smoke", [])[1]
    _, out = _run("l4_smoke", ["--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--logprobs", "3"])
    assert f"token ids  : {seeded}" in out
    first = re.search(r"`logprobs\[0\]: sampled ([^`]*)`", text.replace("\n  ", " "))
    assert first and f"logprobs[0]: sampled {first.group(1)}" in out


@cpu_only
def test_readme_chain_table_is_what_make_demo_prints():
    readme = (ROOT / "README.md").read_text()
    quoted = _block_after(readme, "`make demo` ends with a table and a verdict")
    rc, out = _run("check_chain", [])
    assert rc == 0
    for line in quoted:
        assert line in out, f"README quotes {line!r}; check_chain printed:\n{out}"
