"""Lesson 10's quoted wall verdict is what scripts/l10_wall.py prints (CPU, tiny Qwen3)."""
import contextlib
import io
from pathlib import Path

import pytest

pytestmark = pytest.mark.lessons

ROOT = Path(__file__).resolve().parent.parent


def test_lesson10_wall_verdict_is_what_the_script_prints():
    import l10_wall
    text = (ROOT / "lessons" / "l10_server.md").read_text()
    quoted = next(line for line in text.splitlines() if line.startswith("verdict: OK, offline user B"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = l10_wall.main([])
    assert rc == 0 and quoted in out.getvalue().splitlines(), out.getvalue()
