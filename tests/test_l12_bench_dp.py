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
