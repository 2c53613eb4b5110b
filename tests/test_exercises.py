"""The lessons' exercises stay true: each break-it breaks what the lesson says, each build-it stub
fails its tests as shipped, and the mechanism swaps in a learner's function only when asked.

Every lesson has an ``## Exercises`` section with a ``### Break it`` and a ``### Build it``
subsection (format: exercises/README.md). The tests read the edit, the commands and the quoted
output from the lesson itself, so the text cannot drift from the code.
"""
import importlib
import os
import pkgutil
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plumbing import exercise
from plumbing.errors import UserError

pytestmark = pytest.mark.lessons          # make test-lessons

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted(p.stem for p in (ROOT / "exercises").glob("l*_*.py"))
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the quoted outputs are the CPU float32 ones")


def _lesson_files(lesson):
    """The lesson's text: lessons/<lesson>.md, then its chapters lessons/<lesson>/<N>_*.md in order
    (lesson 7 is an index and chapters, each exercise in the chapter that teaches it)."""
    chapters = sorted((ROOT / "lessons" / lesson).glob("*.md"), key=lambda p: int(p.name.split("_")[0]))
    return [ROOT / "lessons" / f"{lesson}.md"] + chapters


def _sections(lesson, title):
    """The texts of the lesson's '### <title>...' subsections inside its '## Exercises' sections
    (the lesson's own, or its chapters'), in order: at least one."""
    subs, found = [], False
    for path in _lesson_files(lesson):
        text = path.read_text()
        if "\n## Exercises\n" not in text:
            continue
        found = True
        ex = text.split("\n## Exercises\n", 1)[1].split("\n## ", 1)[0]
        subs += [m.group(1) for m in re.finditer(rf"\n### {title}[^\n]*\n(.*?)(?=\n### |\Z)", ex, re.S)]
    assert found, f"lessons/{lesson}.md (and its chapters, if any) has no '## Exercises' section"
    assert subs, f"lessons/{lesson}.md's Exercises sections have no '### {title}' subsection"
    return subs


def _section(lesson, title):
    """The first '### <title>' subsection."""
    return _sections(lesson, title)[0]


def _runs(section):
    """Quoted runs: fenced blocks whose first line is '$ <command>' -> (command, expected lines)."""
    out = []
    for lang, body in FENCE.findall(section):
        lines = body.rstrip("\n").splitlines()
        if not lang and lines and lines[0].startswith("$ "):
            out.append((lines[0][2:], [ln for ln in lines[1:] if ln.strip() and ln.strip() != "..."]))
    return out


def _run(command, cwd, env_extra=None, timeout=300):
    # The command runs as a learner would type it: without the exercise switches and without the
    # PYTEST_* settings (PYTEST_ADDOPTS, PYTEST_PLUGINS) of whatever pytest runs this file (a CI
    # runner's -rN would hide the "FAILED ..." lines a lesson quotes).
    env = {k: v for k, v in os.environ.items()
           if k not in (exercise.ENV, exercise.DIR_ENV) and not k.startswith("PYTEST_")}
    env.update(env_extra or {})
    # The packages of `cwd` (a break-it's edited copy), not those of the editable install, which
    # points at the checkout: a script's own folder is on its sys.path, the repository root is not.
    env["PYTHONPATH"] = os.pathsep.join([str(cwd)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    argv = [sys.executable if a == "python" else a for a in shlex.split(command)]
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def _assert_quoted(lines, out, where):
    """Each quoted line is a whole output line; one ending in ' ...' is the start of an output line
    (float columns whose last digits vary by machine, or pytest's "FAILED <test> - <message>",
    whose message is cut to the terminal's width, or printed whole where CI is set)."""
    printed = out.splitlines()
    for ln in lines:
        ok = (any(p.startswith(ln[:-4]) for p in printed) if ln.endswith(" ...") else ln in printed)
        assert ok, f"{where} quotes {ln!r}; the command printed:\n{out}"


# --- break it -----------------------------------------------------------------------------------
@cpu_only
@pytest.mark.parametrize("lesson", LESSONS)
def test_break_it_edit_makes_the_checker_print_what_the_lesson_quotes(lesson, tmp_path):
    for i, sec in enumerate(_sections(lesson, "Break it")):   # every break-it of the lesson
        _check_break_it(lesson, sec, tmp_path / f"break{i}")


def _check_break_it(lesson, sec, tmp_path):
    path = re.search(r"In `([\w/]+\.py)`", sec).group(1)
    code = [body for lang, body in FENCE.findall(sec) if lang == "python"]
    assert len(code) >= 2, f"{lesson}: the break-it needs the old and the new line(s) as two ```python blocks"
    old, new = code[0], code[1]
    assert f"git checkout -- {path}" in sec, f"{lesson}: the break-it must say how to undo it"
    source = (ROOT / path).read_text()
    assert source.count(old) == 1, f"{lesson}.md tells the learner to change these lines of {path}, " \
                                   f"which it no longer contains exactly once:\n{old}"
    repo = tmp_path / "repo"
    for d in ROOT.iterdir():            # the packages (stages, tooling), the scripts, exercises and tests
        if d.is_dir() and ((d / "__init__.py").exists() or d.name in ("scripts", "exercises", "tests")):
            shutil.copytree(d, repo / d.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / path).write_text(source.replace(old, new))
    runs = _runs(sec)
    assert runs, f"{lesson}: the break-it quotes no '$ command' block"
    command, quoted = runs[0]
    rc, out = _run(command, repo)
    assert rc != 0, f"{lesson}: after the edit, `{command}` still passes:\n{out}"
    _assert_quoted(quoted, out, f"lessons/{lesson}.md (break it)")
    failed = {ln.split()[1] for ln in out.splitlines() if ln.startswith("FAILED ")}
    listed = {ln.split()[1] for ln in quoted if ln.startswith("FAILED ")}
    assert not listed or listed == failed, (f"lessons/{lesson}.md (break it) lists the tests that fail; "
                                            f"missing: {sorted(failed - listed)}")


# --- build it -----------------------------------------------------------------------------------
def _verdicts(lesson):
    sec = _section(lesson, "Build it")
    runs = [(cmd, lines) for cmd, lines in _runs(sec) if cmd.startswith("python scripts/exercise.py")]
    assert len(runs) == 2, f"{lesson}: the build-it quotes two exercise.py runs: the stub's and a correct one's"
    (cmd, before), (cmd2, after) = runs
    assert cmd == cmd2 == f"python scripts/exercise.py {lesson.split('_')[0]}"
    return cmd, before[-1], after[-1]


@pytest.mark.parametrize("lesson", LESSONS)
def test_build_it_stub_fails_as_shipped_with_the_quoted_verdict(lesson):
    """The stub raises NotImplementedError, so every test of the exercise fails; a correct version
    passes the same N tests (the suite itself runs them on the reference, and they pass)."""
    cmd, before, after = _verdicts(lesson)
    rc, out = _run(cmd, ROOT)
    assert rc == 1, f"the shipped stub exercises/{lesson}.py does not fail its tests (solved it? " \
                    f"`git checkout -- exercises/{lesson}.py` restores the stub):\n{out[-3000:]}"
    assert f"\n{before}\n" in out, f"lessons/{lesson}.md quotes {before!r} for the stub; got:\n{out[-3000:]}"
    n = re.fullmatch(r"verdict: FAIL, (\d+) of \1 tests failed", before)
    assert n, f"the stub must fail every test of the exercise, the lesson says {before!r}"
    assert "NotImplementedError" in out
    assert after == f"verdict: PASS, {n.group(1)} of {n.group(1)} tests passed"


def test_a_correct_learner_file_passes_through_the_mechanism(tmp_path):
    """End to end on the cheapest exercise: a learner file that is right (it hands back the
    reference) gives the lesson's 'after' verdict, and the script confirms the file was used."""
    lesson = "l4_sampler"
    stub = (ROOT / "exercises" / f"{lesson}.py").read_text()
    (tmp_path / f"{lesson}.py").write_text(
        "from plumbing.exercise import HOOKS\n"
        "top_p_keep = HOOKS['l4_sampler.sampler.top_p_keep']\n" + stub[stub.index("TESTS = "):])
    cmd, _, after = _verdicts(lesson)
    rc, out = _run(cmd, ROOT, {exercise.DIR_ENV: str(tmp_path)})
    assert rc == 0 and f"\n{after}\n" in out, out[-3000:]


# --- the mechanism itself (in process, fast) ---------------------------------------------------
def _fake(name="slot_fn", module="l9_fake.part"):
    def reference():
        return "reference"
    reference.__name__, reference.__module__ = name, module
    return reference


def test_no_variable_means_the_reference_object_itself(monkeypatch):
    monkeypatch.delenv(exercise.ENV, raising=False)
    ref = _fake()
    assert exercise.learner_can_replace(ref) is ref


def test_named_lesson_takes_the_learner_function_and_others_keep_theirs(monkeypatch, tmp_path):
    (tmp_path / "l9_fake.py").write_text("def slot_fn():\n    return 'learner'\n")
    (tmp_path / "l8_other.py").write_text("")
    monkeypatch.setenv(exercise.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(exercise.ENV, "l9")
    monkeypatch.delitem(sys.modules, "_learner_l9_fake", raising=False)
    assert exercise.learner_can_replace(_fake())() == "learner"
    other = _fake(module="l8_other.part")
    assert exercise.learner_can_replace(other) is other
    monkeypatch.delitem(sys.modules, "_learner_l9_fake")


@pytest.mark.parametrize("value,files,needle", [
    ("l7", ["l9_fake.py"], "names l7, which has no file"),
    ("l9", ["l9_fake.py"], "has no function slot_fn()"),
])
def test_bad_selection_is_a_clear_error(monkeypatch, tmp_path, value, files, needle):
    for f in files:
        (tmp_path / f).write_text("def other():\n    pass\n")
    monkeypatch.setenv(exercise.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(exercise.ENV, value)
    monkeypatch.delitem(sys.modules, "_learner_l9_fake", raising=False)
    with pytest.raises(UserError, match=re.escape(needle)):
        exercise.learner_can_replace(_fake())
    monkeypatch.delitem(sys.modules, "_learner_l9_fake", raising=False)


def test_every_exercise_file_names_a_hook_of_its_stage():
    """Each stub defines a function that its stage marks @learner_can_replace."""
    for lesson in LESSONS:
        for m in pkgutil.iter_modules([str(ROOT / lesson)]):      # import the whole stage: every
            importlib.import_module(f"{lesson}.{m.name}")          # hook registers itself
        hooks = {k.rsplit(".", 1)[1] for k in exercise.HOOKS if k.startswith(lesson + ".")}
        text = (ROOT / "exercises" / f"{lesson}.py").read_text()
        defined = set(re.findall(r"^def (\w+)\(", text, re.M))
        assert hooks and hooks <= defined, f"exercises/{lesson}.py defines {defined}, the stage's hooks are {hooks}"
