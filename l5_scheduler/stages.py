"""Every stage in this repository, found by folder name at run time, so that no stage imports a
later one: the server serves the latest engine, and an option given to an earlier stage's ``LLM``
is refused naming the stage that adds it.

    latest("options")   the latest stage's ``options`` module (light: no torch); its
                        ENGINE_OPTIONS are every stage's options
    latest("stage")     the latest stage's ``stage`` module (the parts: torch, Triton); its STAGES
                        are every stage's contribution, its LLM the whole engine

A stage folder is ``l<N>_<name>`` with a ``stage.py`` (the ones that contribute engine parts).
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stage_packages() -> list[str]:
    """The stage folders that contribute engine parts, in lesson order."""
    found = [(int(m.group(1)), p.name) for p in ROOT.iterdir()
             if (m := re.fullmatch(r"l(\d+)_\w+", p.name)) and (p / "stage.py").exists()]
    return [name for _, name in sorted(found)]


def latest(module: str = "stage"):
    return importlib.import_module(f"{stage_packages()[-1]}.{module}")
