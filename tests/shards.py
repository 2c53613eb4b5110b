"""``pytest --shard I/N``: split a tier into N parts that take about the same time, by whole files.

A file stays in one shard, so its module fixtures (a tiny model loaded, an engine started) are
built once; only the files in SPLIT are shared out test by test (test_chain.py: one stage's chain
per test, a minute of interpreter each for stages 7-9; test_matrix.py: one combination of features
per test). Units are placed longest first on the least-loaded shard, by the seconds in
``shard_weights.json`` for the tier being run (the ``-m`` expression names it); a unit not listed
there counts one second per selected test. The weights only balance the shards: a wrong one makes
a run slower, never different. ``scripts/run_tests.py --record`` re-measures them.
"""
from __future__ import annotations

import json
from pathlib import Path

WEIGHTS = Path(__file__).with_name("shard_weights.json")
#: files shared out test by test (their units are node ids, not the file)
SPLIT = {"tests/test_chain.py", "tests/test_matrix.py"}
#: make's -m expressions (Makefile) -> the tier's name in shard_weights.json
TIERS = {"not lessons and not deep": "test", "lessons": "test-lessons", "deep or fuzz": "test-deep"}


def parse(spec: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in spec.split("/"))
    except ValueError:
        i, n = -1, 0
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec!r}: expected I/N with 0 <= I < N, e.g. --shard 0/2")
    return i, n


def plan(seconds: dict[str, float], n: int) -> list[list[str]]:
    """Files, longest first, each onto the shard with the least time so far (ties: the lower index)."""
    shards, load = [[] for _ in range(n)], [0.0] * n
    for f in sorted(seconds, key=lambda f: (-seconds[f], f)):
        j = load.index(min(load))
        shards[j].append(f)
        load[j] += seconds[f]
    return shards


def unit(nodeid: str) -> str:
    """What a test is placed with: its file, or itself in a SPLIT file."""
    f = nodeid.split("::")[0]
    return nodeid if f in SPLIT else f


def keep_shard(config, items) -> None:
    i, n = parse(config.getoption("--shard"))
    tier = TIERS.get((config.option.markexpr or "").strip())
    known = json.loads(WEIGHTS.read_text()).get(tier, {}) if WEIGHTS.exists() else {}
    counts: dict[str, int] = {}
    for item in items:
        u = unit(item.nodeid)
        counts[u] = counts.get(u, 0) + 1
    mine = set(plan({u: known.get(u, float(c)) for u, c in counts.items()}, n)[i])
    other = [item for item in items if unit(item.nodeid) not in mine]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if unit(item.nodeid) in mine]
