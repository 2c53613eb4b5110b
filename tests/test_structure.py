"""The shape of the code, checked: one engine loop given its parts, each stage folder one idea.

    no stage folder imports a higher floor (l3_paged never imports l5_scheduler ...)
    no file over 300 lines and no function over 60, outside tests
    one engine loop: no class anywhere outside tests subclasses LLMEngine or Scheduler, and a later
    stage's LLM is stage 5's, built by composition (a function), not a subclass

Each check is run once on a planted violation, so none passes over nothing.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAGES = sorted((p.name for p in ROOT.glob("l[0-9]*_*") if p.is_dir()), key=lambda n: int(n[1:].split("_")[0]))
CODE = [p for d in [*STAGES, "plumbing", "harness", "scripts"] for p in sorted((ROOT / d).glob("*.py"))]
MAX_FILE, MAX_FUNCTION = 300, 60


def _floor(name: str) -> int | None:
    """l5_scheduler -> 5; anything else (plumbing, torch, ...) -> None."""
    head = name.split(".")[0]
    return int(head[1:].split("_")[0]) if head in STAGES else None


def higher_floor_imports(path: Path) -> list[str]:
    """The imports of a stage file that reach a stage above its own."""
    own = _floor(path.parent.name)
    if own is None:
        return []
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        bad += [f"{path.relative_to(ROOT)}: imports {n}" for n in names if (_floor(n) or 0) > own]
    return bad


def too_long(path: Path) -> list[str]:
    text = path.read_text()
    out = [f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines"] if text.count("\n") > MAX_FILE else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}() is {n} lines")
    return out


def engine_subclasses(path: Path) -> list[str]:
    """Stage folders only: harness/plain_parts.py's oracle is the scheduler with one method written plainly."""
    if _floor(path.parent.name) is None:
        return []
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
            out += [f"{path.relative_to(ROOT)}: class {node.name}({b})" for b in bases
                    if b in ("LLMEngine", "Scheduler", "LLM") or b.startswith(("Stage5", "Stage6", "Stage7"))]
    return out


CHECKS = {"imports": higher_floor_imports, "length": too_long, "subclasses": engine_subclasses}


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_code_keeps_its_shape(check):
    problems = [p for path in CODE for p in CHECKS[check](path)]
    assert not problems, "\n".join(problems)


PLANTED = {
    "imports": ("l3_paged/planted.py", "from l5_scheduler.scheduler import Scheduler\n"),
    "length": ("scripts/planted.py", "def f():\n" + "    x = 1\n" * 61),
    "subclasses": ("l7_fast/planted.py", "from l5_scheduler import LLMEngine\n\n\nclass Faster(LLMEngine):\n    pass\n"),
}


@pytest.mark.parametrize("check", list(CHECKS))
def test_each_shape_check_fails_on_a_planted_violation(check):
    rel, text = PLANTED[check]
    path = ROOT / rel
    # The check reads a file that is not on disk, as if it lived in that folder.
    fake = type("P", (), {"read_text": lambda self: text, "parent": path.parent,
                          "relative_to": lambda self, root: Path(rel)})()
    assert CHECKS[check](fake), f"the {check} check passed a planted violation"


def test_the_checks_read_every_stage_folder():
    assert STAGES[:7] == ["l1_dense", "l2_gather", "l3_paged", "l4_sampler", "l5_scheduler", "l6_prefix_cache",
                          "l7_fast"]
    assert len(CODE) > 50
