"""Run a lesson's build-it exercise: the project's own tests, on your version of one function.

    python scripts/exercise.py l2                 # your slot_index from exercises/l2_gather.py
    python scripts/exercise.py l2 --reference     # the same tests on the project's reference
    python scripts/exercise.py l2 -- -x           # anything after -- goes to pytest

Sets LESSONS_LEARNER=<lesson> (see plumbing/exercise.py) before any stage module with a hook is
imported, runs the tests listed in the exercise file's TESTS with pytest, in this process, and
ends with one verdict line: ``verdict: PASS, 11 of 11 tests passed`` or ``verdict: FAIL, ...``.
Exit status 0 on PASS, 1 otherwise.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

from plumbing.cli import run_main
from plumbing.exercise import ENV, exercises_dir   # reading the variable happens later, at each hook

ROOT = Path(__file__).resolve().parent.parent


def exercise_file(lesson: str) -> Path:
    folder = exercises_dir()
    found = sorted(folder.glob(f"{lesson.split('_')[0]}_*.py"))
    if len(found) != 1:
        known = ", ".join(sorted(p.stem.split("_")[0] for p in folder.glob("l*_*.py")))
        sys.exit(f"error: no exercise {lesson!r} in {folder}: choose one of {known}.")
    return found[0]


def listed_tests(path: Path) -> list[str]:
    """The TESTS list of an exercise file, read without importing it (it may not import yet)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TESTS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    sys.exit(f"error: {path} has no TESTS = [...] list naming the tests to run.")


class Outcomes:
    """pytest plugin: one outcome per test (a failed setup or teardown counts as failed)."""

    def __init__(self):
        self.by_test: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.by_test[report.nodeid] = "failed"
        elif report.when == "call" or report.skipped:
            self.by_test.setdefault(report.nodeid, report.outcome)


def verdict(outcomes: dict[str, str], rc: int) -> tuple[bool, str]:
    n = len(outcomes)
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
    if n == 0 or rc not in (0, 1):
        return False, f"verdict: ERROR, pytest exited with status {rc} after {n} test(s): see above"
    if counts["passed"] == n:
        return True, f"verdict: PASS, {n} of {n} tests passed"
    extra = f" ({counts['skipped']} skipped)" if counts["skipped"] else ""
    return False, f"verdict: FAIL, {counts['failed']} of {n} tests failed{extra}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="exercise", usage="%(prog)s LESSON [--reference] [-- PYTEST_ARGS ...]",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lessons = sorted((f.stem.split("_")[0] for f in (ROOT / "exercises").glob("l[0-9]*_*.py")), key=lambda s: int(s[1:]))
    p.add_argument("lesson", help=f"{', '.join(lessons)} (one file in exercises/ each)")
    p.add_argument("--reference", action="store_true", help="run the same tests on the project's reference")
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, pytest_args = argv[:cut], argv[cut + 1:]      # after --: extra pytest arguments
    args = p.parse_args(argv)
    path = exercise_file(args.lesson)
    lesson = path.stem.split("_")[0]
    if args.reference:
        os.environ.pop(ENV, None)
        who = "the project's reference"
    else:
        os.environ[ENV] = lesson
        who = f"your {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
    tests = listed_tests(path)
    print(f"exercise {lesson}: {len(tests)} test target(s) on {who}", flush=True)

    import pytest   # after the variable is set: the tests import the stage code, which reads it
    plugin = Outcomes()
    rc = int(pytest.main(["-q", "--tb=short", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                          *[str(ROOT / t) for t in tests], *pytest_args], plugins=[plugin]))
    ok, line = verdict(plugin.by_test, rc)
    used = [k for k, v in getattr(sys.modules.get("plumbing.exercise"), "USED", {}).items()
            if Path(v).resolve() == path.resolve()]
    if not args.reference and plugin.by_test and not used:
        ok, line = False, f"verdict: ERROR, the tests never loaded {path.name}: is {lesson}'s hook in place?"
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
