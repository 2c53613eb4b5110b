"""bench_dp's per-replica accounting (benchmarks/bench_dp.py ``replica``, bench_dp_report.py
``where_it_goes``): counters are differenced over the timed run, clocks are not, and the engines'
own speed-up is read from the slowest replica. Numbers made up here, so every expected value is
worked by hand."""
from benchmarks.bench_dp import replica
from benchmarks.bench_dp_report import where_it_goes


def counters(tokens, step, send, periods, since, last):
    return {"generation_tokens": tokens, "prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0,
            "engine_step_seconds": step, "engine_send_seconds": send, "engine_busy_periods": periods,
            "engine_busy_since_seconds": since, "engine_last_step_end_seconds": last}


def test_a_replica_differences_its_counters_not_its_clocks():
    before = counters(100, 1.0, 0.1, 3, 50.0, 60.0)            # warm-up's stretch
    after = counters(1100, 5.0, 0.3, 4, 100.5, 104.5)          # one more stretch: 100.5 -> 104.5
    e = replica(before, after, start=100.0, end=105.0)
    assert e["generation_tokens"] == 1000 and e["span_s"] == 4.0 and e["tok_per_s"] == 250.0
    assert e["start_s"] == 0.5 and e["done_before_end_s"] == 0.5
    assert abs(e["send_share"] - 0.05) < 1e-12                 # 0.2 s of 4 s


def test_a_replica_that_went_idle_mid_run_has_no_span():
    e = replica(counters(0, 0, 0, 3, 0, 0), counters(500, 2.0, 0.1, 5, 103.0, 104.0), start=100.0, end=105.0)
    assert e["span_s"] is None and e["tok_per_s"] is None and e["done_before_end_s"] == 1.0


def _row(dp, tok_s, duration, spans):
    return {"workload": "random", "dp": dp, "routing": "-" if dp == 1 else "least_loaded", "output_tok_per_s": tok_s,
            "duration_s": duration, "engines": {str(i): {"span_s": s, "done_before_end_s": None if s is None else duration - s,
                                                         "tok_per_s": 1.0, "send_share": 0.01}
                                                for i, s in enumerate(spans)}}


def test_the_engines_speed_up_is_dp_1s_span_over_the_slowest_replicas():
    lines = where_it_goes([_row(1, 1000.0, 21.0, [20.0]), _row(2, 1800.0, 11.5, [10.0, 11.0])])
    verdict = [ln for ln in lines if ln.startswith("- random, dp 2")]
    assert len(verdict) == 1
    assert "the engines alone give 1.82x dp 1" in verdict[0]      # 20 / 11, not 20 / 10.5
    assert "the client saw 1.80x" in verdict[0] and "differ by 10.0%" in verdict[0]
    assert "| random | 2 | least_loaded | 11.50 | 10.00 / 11.00 | 1.50 / 0.50 |" in "\n".join(lines)


def test_no_verdict_from_a_replica_without_one_stretch():
    lines = where_it_goes([_row(1, 1000.0, 21.0, [20.0]), _row(2, 1800.0, 11.5, [10.0, None])])
    assert not [ln for ln in lines if ln.startswith("- random")]


def test_the_full_stretch_is_where_every_engine_runs_its_peak_and_the_tail_follows_it():
    from benchmarks.bench_dp import full_stretch
    # two engines; peaks 4 and 3. Both full at t = 1 and t = 3 (t = 2 dips but lies inside); one alone
    # at its peak at t = 0 and t = 4 (not the steady state); the tail runs to t = 5
    samples = [(0.0, [(4, 0), (1, 0)]), (1.0, [(4, 10), (3, 5)]), (2.0, [(3, 20), (3, 12)]),
               (3.0, [(4, 30), (3, 20)]), (4.0, [(1, 35), (3, 24)]), (5.0, [(0, 36), (0, 25)])]
    f = full_stretch(samples)
    assert f == dict(seconds=2.0, tok_per_s=17.5, peak=[4, 3], tail_s=2.0)      # (30 + 20 - 10 - 5) / 2
    assert full_stretch(samples[:2] + samples[4:]) is None                      # both full once: no stretch
    assert full_stretch([]) is None


def test_the_report_gives_the_steady_ratio_only_where_both_runs_were_full():
    one, two = _row(1, 1000.0, 21.0, [20.0]), _row(2, 1800.0, 11.5, [10.0, 11.0])
    one["full"] = dict(seconds=15.0, tok_per_s=1200.0, peak=[256], tail_s=4.0)
    two["full"] = dict(seconds=6.0, tok_per_s=2352.0, peak=[256, 256], tail_s=4.5)
    line = [ln for ln in where_it_goes([one, two]) if ln.startswith("- random, dp 2")][0]
    assert "2,352 tok/s against 1,200, 1.96x" in line and "4.5 s against 4.0" in line
    two["full"] = None
    line = [ln for ln in where_it_goes([one, two]) if ln.startswith("- random, dp 2")][0]
    assert "no steady-state ratio" in line


def test_the_sampler_reads_each_engines_running_and_tokens_until_told_to_stop():
    import time
    from types import SimpleNamespace

    from benchmarks.bench_dp import Sampler
    llm = SimpleNamespace(snapshots=[dict(running=3, generation_tokens=7), dict(running=1, generation_tokens=2)])
    s = Sampler(llm, period=0.01)
    s.start()
    time.sleep(0.1)
    llm.snapshots[0] = dict(running=0, generation_tokens=9)           # a step's new snapshot replaces the old
    time.sleep(0.05)
    s.done.set()
    s.join(timeout=5)
    assert not s.is_alive() and len(s.samples) >= 3
    assert s.samples[0][1] == [(3, 7), (1, 2)] and s.samples[-1][1] == [(0, 9), (1, 2)]
