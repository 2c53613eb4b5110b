"""Exercises: run the project on a learner's version of one function instead of the reference.

A few reference functions are marked ``@learner_can_replace`` (one or two per lesson: the slot
formula, RoPE, the causal limit, top-p). When the environment variable names their lesson, the
function is taken from the learner's file ``exercises/<package>.py`` instead:

    LESSONS_LEARNER=l2 python -m pytest tests/test_l2_gather.py   # l2_gather's hooks from exercises/l2_gather.py
    LESSONS_LEARNER=l1,l4 python scripts/check_chain.py            # several lessons, comma-separated
    python scripts/exercise.py l2                                  # the exercise's own tests, with a verdict

The choice is made once, when the stage module is imported: the decorator returns either the
reference itself or the learner's function, so there is no per-call cost and, with the variable
unset, the stage code is exactly what it was. ``LESSONS_EXERCISES_DIR`` points at another folder
of learner files (default: ``exercises/`` at the repository root). See ``exercises/README.md``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .errors import UserError

ENV = "LESSONS_LEARNER"
DIR_ENV = "LESSONS_EXERCISES_DIR"

HOOKS: dict[str, object] = {}   # "l2_gather.allocator.slot_index" -> the reference function
USED: dict[str, str] = {}       # the same key -> the learner file it was taken from, this process


def exercises_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path(__file__).resolve().parent.parent / "exercises")


def selected_lessons() -> set[str]:
    """The lesson ids named by LESSONS_LEARNER ("l2", or "l2_gather" read as "l2")."""
    return {item.strip().split("_")[0] for item in os.environ.get(ENV, "").split(",") if item.strip()}


def learner_file(package: str) -> Path:
    return exercises_dir() / f"{package}.py"


def _check_selection() -> None:
    known = sorted(p.stem.split("_")[0] for p in exercises_dir().glob("l*_*.py"))
    unknown = sorted(selected_lessons() - set(known))
    if unknown:
        raise UserError(f"{ENV}={os.environ.get(ENV)!r} names {', '.join(unknown)}, which has no file in "
                        f"{exercises_dir()}: choose from {', '.join(known) or '(none)'}.")


def _load(path: Path):
    name = f"_learner_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def learner_can_replace(reference):
    """Decorator for a reference function that a lesson's build-it exercise replaces.

    The hook's lesson is its top-level package (``l2_gather`` -> ``l2``); the learner's function
    has the same name in ``exercises/l2_gather.py``.
    """
    package = reference.__module__.split(".")[0]
    key = f"{reference.__module__}.{reference.__name__}"
    HOOKS[key] = reference
    if not os.environ.get(ENV):
        return reference
    _check_selection()
    if package.split("_")[0] not in selected_lessons():
        return reference
    path = learner_file(package)
    mine = getattr(_load(path), reference.__name__, None)
    if not callable(mine):
        raise UserError(f"{path} has no function {reference.__name__}(): the {package} exercise needs it "
                        f"(or unset {ENV} to use the reference).")
    USED[key] = str(path)
    print(f"[exercise] {key} <- {path}", file=sys.stderr)
    return mine
