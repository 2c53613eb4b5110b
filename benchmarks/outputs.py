"""Where a benchmark writes its JSON, markdown and PNG.

* a full run on a GPU: ``benchmarks/results/<benchmark>/<gpu>.*`` (tracked: the latest run per GPU
  kind, what docs/benchmarks.md quotes), gpu a short slug of the device's name (``h100``, ``h200``);
* ``--quick`` or a CPU run (a smoke test of the script, not a measurement): ``out/<benchmark>/``,
  which git ignores;
* ``--out DIR``: ``DIR/<benchmark>.*``.

Large scratch files (the random-weight checkpoints) always go under ``out/<benchmark>/``, never
into the results folder.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def gpu_slug(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-40GB' -> 'a100'."""
    words = [w for w in re.split(r"[^a-z0-9]+", device_name.lower()) if w and w not in ("nvidia", "geforce", "tesla")]
    model = next((w for w in words if re.fullmatch(r"[a-z]+\d+[a-z]*", w)), None)
    return model or "-".join(words) or "gpu"


def scratch_dir(benchmark: str) -> str:
    """``out/<benchmark>/``, made: for checkpoints and other files nobody tracks."""
    path = ROOT / "out" / benchmark
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def output_stem(benchmark: str, out: str | None, quick: bool, device: str) -> str:
    """The path prefix of this run's ``.json``, ``.md`` and ``.png`` (see the module's docstring); makes
    its folder."""
    if out is not None:
        folder, stem = Path(out), benchmark
    elif device == "cuda" and not quick:
        import torch
        folder, stem = RESULTS / benchmark, gpu_slug(torch.cuda.get_device_name())
    else:
        folder, stem = ROOT / "out" / benchmark, benchmark
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder / stem)


def save_results(stem: str, data: dict, text: str, draw=None) -> list[str]:
    """``stem``.json (``data``), ``stem``.md (``text``) and, where matplotlib is installed and ``draw``
    is given, ``stem``.png (``draw(plt, path)``); makes the folder. Returns the paths written."""
    import json
    import os

    from plumbing.plot import pyplot
    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(data, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(text + "\n")
    written = [stem + ".json", stem + ".md"]
    plt = pyplot() if draw is not None else None
    if plt is not None:
        draw(plt, stem + ".png")
        written.append(stem + ".png")
    return written


def out_help(benchmark: str) -> str:
    return (f"folder for {benchmark}.{{json,md,png}} (default: benchmarks/results/{benchmark}/<gpu>.* for a full "
            f"GPU run, out/{benchmark}/ for --quick or a CPU)")
