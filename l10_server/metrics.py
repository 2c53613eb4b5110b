"""``/metrics``: vLLM's metric names and types, in Prometheus' text format, through ``prometheus_client``.

Two sources, as in vLLM:

* **the engine core's state**, sent with every step's outputs (``EngineCore.snapshot``): gauges
  (running, waiting, KV cache usage) and counters (tokens, prefix-cache queries and hits,
  preemptions). ``EngineCollector`` reads the latest snapshot when Prometheus scrapes, so nothing
  is copied per step; the counters are the engine core's own running totals.
* **each request's timeline**, seen where the tokens arrive (``RequestTimer``, one per prompt,
  driven by submission.py): time to first token, the gap between token-bearing updates
  (inter-token latency: a step that brings several tokens is one gap, as in vLLM), the
  end-to-end latency, and the queue time the engine core measured (arrival to first scheduled).
  These are histograms with vLLM's buckets.

Every series has vLLM's labels ``model_name`` and ``engine``: each engine core's series carry its
index (``engine="0"``, ``"1"``, ... when a later stage runs several: sum over ``engine`` for the
server's total, as with vLLM's data parallelism); the per-request histograms and
``tll:num_requests_pending``, measured in the server over every core, carry ``engine="0"``.

A dashboard built for vLLM (its Grafana JSON queries ``vllm:...{model_name="$model_name"}``) reads
this server unchanged. The
engine core's own timing counters keep the ``tll:`` prefix: vLLM has no such series.
"""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LABELS = ("model_name", "engine")
#: vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def one_two_five(top: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``top`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(m * scale)
        scale *= 10


#: (vLLM name, kind, help, how to read it from a snapshot)
ENGINE_SERIES = (
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", lambda s: s["running"]),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", lambda s: s["waiting"]),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
     lambda s: (s["kv_blocks_total"] - s["kv_blocks_free"]) / max(s["kv_blocks_total"], 1)),
    ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.",
     lambda s: s["prefix_cache_queries"]),
    ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.",
     lambda s: s["prefix_cache_hits"]),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.",
     lambda s: s["num_preemptions"]),
    ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", lambda s: s["prompt_tokens"]),
    ("vllm:generation_tokens", "counter", "Number of generation tokens processed.", lambda s: s["generation_tokens"]),
)
#: the engine core's own series (no vLLM equivalent): its loop's time, for bench_serve.py's timeline
OWN_SERIES = (
    ("tll:num_requests_pending", "gauge", "Sequences (prompts x n) submitted to the server, not finished.", None),
    ("tll:num_requests_running_max", "gauge", "Most requests running in one step so far.", "max_running"),
    ("tll:kv_blocks_free", "gauge", "KV cache blocks free.", "kv_blocks_free"),
    ("tll:kv_blocks_used", "gauge", "KV cache blocks held by requests or by the prefix cache.",
     lambda s: s["kv_blocks_total"] - s["kv_blocks_free"]),
    ("tll:engine_steps", "counter", "Engine steps run.", "engine_steps"),
    ("tll:engine_step_seconds", "counter", "Seconds in step(), outputs built.", "engine_step_seconds"),
    ("tll:engine_send_seconds", "counter", "Seconds handing outputs to the server.", "engine_send_seconds"),
    ("tll:engine_take_seconds", "counter", "Seconds taking requests in between steps.", "engine_take_seconds"),
    ("tll:engine_busy_periods", "counter", "Times the core went from idle to stepping.", "engine_busy_periods"),
    ("tll:engine_busy_since_seconds", "gauge", "Monotonic clock: the core last woke with work.", "engine_busy_since"),
    ("tll:engine_last_step_end_seconds", "gauge", "Monotonic clock: the last step ended.", "engine_last_step_end"),
    ("tll:engine_last_add_seconds", "gauge", "Monotonic clock: the core last took a request.", "engine_last_add"),
)


class EngineCollector:
    """The engine core's latest snapshot as metric families, read at scrape time."""

    def __init__(self, source, model_name: str):
        self.source, self.model_name = source, model_name     # source() -> (snapshots, pending)

    def collect(self):
        snaps, pending = self.source()
        for name, kind, doc, read in ENGINE_SERIES + OWN_SERIES:
            family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=LABELS)
            if read is None:                         # the server's own count: one series
                family.add_metric((self.model_name, "0"), pending)
            for engine, snap in enumerate(snaps if read is not None else ()):
                family.add_metric((self.model_name, str(engine)), read(snap) if callable(read) else snap[read])
            yield family


class Metrics:
    """The server's registry (its own, not prometheus_client's global one: two servers in one
    process, as in the tests, never share series)."""

    def __init__(self, model_name: str, max_model_len: int, source):
        disable_created_metrics()          # no "_created" twin beside each counter and histogram
        self.registry = CollectorRegistry()
        lv = (model_name, "0")
        self.registry.register(EngineCollector(source, model_name))

        def hist(name, doc, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(*lv)
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                          REQUEST_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for "
                              "request.", REQUEST_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for "
                            "request.", REQUEST_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                           REQUEST_BUCKETS)
        counts = one_two_five(max_model_len)
        self.prompt_len = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", counts)
        self.output_len = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", counts)
        self.params_n = hist("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20))
        self.params_max_tokens = hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request "
                                      "parameter.", counts)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.",
                               LABELS + ("finished_reason",), registry=self.registry)
        self.lv = lv

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def timer(self) -> "RequestTimer":
        return RequestTimer(self)


class RequestTimer:
    """One prompt's timeline, from its submission to its last token (all its choices together)."""

    def __init__(self, metrics: Metrics, clock=time.monotonic):
        self.m, self.clock = metrics, clock
        self.arrival = self.last = clock()
        self.first: float | None = None
        self.tokens = 0
        self.prompt_tokens: int | None = None          # set when the engine core takes the prompt

    def tokens_arrived(self, n: int) -> None:
        """An update from the engine core that brought ``n`` new tokens (one step's, for this prompt)."""
        if n <= 0:
            return
        now = self.clock()
        if self.first is None:
            self.first = now
            self.m.ttft.observe(now - self.arrival)
        else:
            self.m.itl.observe(now - self.last)
        self.last, self.tokens = now, self.tokens + n

    def finished(self, reason: str, n: int, stats: dict | None) -> None:
        """The prompt's last choice finished (``reason``: "stop", "length" or "abort"); ``stats``: the
        engine core's ``request_stats`` (None for an abort: the engine forgot the request)."""
        m = self.m
        m.e2e.observe(self.clock() - self.arrival)
        m.prompt_len.observe(self.prompt_tokens or 0)
        m.output_len.observe(self.tokens)
        m.params_n.observe(n)
        if stats is not None:
            m.params_max_tokens.observe(stats["max_tokens"])
            for hist, key in ((m.queue, "queue"), (m.prefill, "prefill"), (m.decode, "decode"),
                              (m.inference, "inference")):
                if stats.get(key) is not None:
                    hist.observe(stats[key])
        m.success.labels(*m.lv, reason).inc()
