"""bench_e2e's "where the time went": each interval of the host's clock between step records goes
to the step it timed (in the async order, the record before it) and that step's kind. Synthetic
records with known times; the floor is the per-step roofline, summed the same way."""
import pytest

from benchmarks.bench_e2e_report import phases, roofline, step_floor
from l1_dense.config import PRESETS
from l5_scheduler.outputs import StepStats

CFG = PRESETS["Qwen/Qwen3-0.6B"]


def _records():
    """A prefill step, three decode steps of 200, two of 3; step k's record made at t = 10 k."""
    kinds = [(512, 0, [("r0", 0, 512, 512)])] + [(0, 200, [])] * 3 + [(0, 3, [])] * 2
    return [StepStats(step=k, prefill_tokens=p, decode_tokens=d, chunks=c, kv_tokens=1000 * (d or 1), sampled=d or 1,
                      t=10.0 * k) for k, (p, d, c) in enumerate(kinds)]


@pytest.mark.parametrize("overlapped", [False, True])
def test_each_interval_goes_to_the_step_it_timed(overlapped):
    st = _records()
    got = {r["phase"]: r for r in phases(st, CFG, 3000.0, 700.0, overlapped)}
    # intervals end at records 1..5; plain order: they time steps 1..5, async: steps 0..4
    timed = st[0:5] if overlapped else st[1:6]
    want = {"steps with a prefill chunk": 1 if overlapped else 0, "decode, >= 128 running": 3,
            "decode, 1-7 running": 1 if overlapped else 2}
    for name, n in want.items():
        assert got[name]["steps"] == n and got[name]["seconds"] == pytest.approx(10.0 * n), (name, got[name])
    assert got["decode, 32-127 running"]["steps"] == got["decode, 8-31 running"]["steps"] == 0
    floors = sum(step_floor(s, CFG, 3000.0, 700.0)[1] for s in timed)
    assert sum(r["floor_s"] for r in got.values()) == pytest.approx(floors)
    assert roofline(st, CFG, 3000.0, 700.0, overlapped)["phases"] == list(got.values())
    assert "phases" not in roofline(st, CFG, 3000.0, 700.0)
