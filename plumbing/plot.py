"""matplotlib for the scripts that draw a figure, and an honest line about what was written.

matplotlib is optional (``pip install -e ".[bench]"``): without it a script still writes its JSON
and markdown, says once that the PNG was skipped, and never claims it wrote one."""
from __future__ import annotations

import os
import time

_STARTED = int(time.time())          # a file modified since this process imported the module was written by it


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None (and a note) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the PNG (pip install matplotlib)")
        return None
    return plt


def shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (shorter to read), else as given."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def wrote(*paths: str) -> str:
    """'wrote a, b' for the paths this run wrote (a PNG skipped for want of matplotlib is left out, and
    so is an older file of that name)."""
    done = [shown(p) for p in paths if p and os.path.exists(p) and int(os.path.getmtime(p)) >= _STARTED]
    return "wrote " + ", ".join(done) if done else "wrote nothing"
