"""The shape of the code, checked (tests/structure.py: what each check means): one engine loop
given its parts, each stage folder one idea, earlier stages knowing nothing of later ones.

Each check is run once on a planted violation, so none passes over nothing.
"""
from pathlib import Path

import pytest

from structure import CHECKS, CODE, ROOT, STAGES, class_index


@pytest.mark.parametrize("check", list(CHECKS))
def test_the_code_keeps_its_shape(check):
    problems = [p for path in CODE for p in CHECKS[check](path)]
    assert not problems, "\n".join(problems)


PLANTED = {
    "imports": ("l3_paged/planted.py", "from l5_scheduler.scheduler import Scheduler\n"),
    "plumbing": ("plumbing/planted.py", "def f():\n    from l1_dense.model import CausalLM\n"),
    "length": ("scripts/planted.py", "def f():\n" + "    x = 1\n" * 61),
    "subclasses": ("l7_fast/planted.py", "from l5_scheduler import LLMEngine\n\n\nclass Faster(LLMEngine):\n    pass\n"),
    "depth": ("l9_fp8_kv/planted.py", "from l7_fast.cache import FastKVCache\n\n\nclass Fp8Cache(FastKVCache):\n    pass\n"),
    "later names": ("l5_scheduler/planted.py", "x = 1   # the drafts of lesson 11\n"),
    "runtime first": ("l7_fast/planted.py", "import triton\nimport plumbing.runtime\n"),
    "builders": ("l8_sliding_window/planted.py", "from l7_fast.stage import build_engine\n"),
    "rebinding": ("l12_tensor_parallel/planted.py", "class Group:\n    def forward(self, *a):\n        pass\n\n\n"
                  "def part(a, group):\n    a.model.forward = group.forward\n"),
}


def _fake(rel: str, text: str):
    """A file that is not on disk, read as if it lived in that folder."""
    path = ROOT / rel
    return type("P", (), {"read_text": lambda self: text, "parent": path.parent,
                          "relative_to": lambda self, root: Path(rel)})()


@pytest.mark.parametrize("check", list(CHECKS))
def test_each_shape_check_fails_on_a_planted_violation(check):
    assert CHECKS[check](_fake(*PLANTED[check])), f"the {check} check passed a planted violation"


def test_the_depth_check_counts_levels_through_the_project():
    """Three levels in one folder (A <- B <- C <- D) is one too many; two pass."""
    three = "class A:\n    pass\n\n\nclass B(A):\n    pass\n\n\nclass C(B):\n    pass\n\n\nclass D(C):\n    pass\n"
    assert CHECKS["depth"](_fake("l6_prefix_cache/planted.py", three))
    assert not CHECKS["depth"](_fake("l6_prefix_cache/planted.py", three.rsplit("\n\n\nclass D", 1)[0] + "\n"))


def test_a_refusal_may_name_the_stage_that_does_what_it_refuses():
    text = 'def f():\n    raise ValueError("run it with stage 8 (l8_sliding_window)")\n'
    assert not CHECKS["later names"](_fake("l3_paged/planted.py", text))
    assert CHECKS["later names"](_fake("l3_paged/planted.py", 'X = "run it with stage 8"\n'))


def test_the_rebinding_check_sees_each_way_to_replace_a_method_and_passes_a_callback_slot():
    planted = {"setattr(model, 'forward', f)\n": True, "runner.execute = lambda out: None\n": True,
               "def f(x):\n    pass\n\n\nengine.step = f\n": True,
               "server.on_stop = lambda: None\n": False, "self.forward = f\n": False}
    for text, caught in planted.items():
        assert bool(CHECKS["rebinding"](_fake("l9_fp8_kv/planted.py", text))) == caught, text


def test_the_checks_read_every_stage_folder():
    assert STAGES[:7] == ["l1_dense", "l2_gather", "l3_paged", "l4_sampler", "l5_scheduler", "l6_prefix_cache",
                          "l7_fast"]
    assert len(CODE) > 50 and len(class_index(CODE)) > 40
