"""What the engine hands back, with vLLM's names: ``RequestOutput.outputs[0].token_ids`` etc."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Logprob:
    """vLLM's: one token's raw logprob, its rank among all V tokens (1 = most likely) and its text."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int                    # which of the prompt's n completions (SamplingParams.n)
    text: str | None              # decoded output (special tokens skipped), cut at a stop string; None without a tokenizer
    token_ids: list[int]
    finish_reason: str | None     # "stop" | "length" | "abort"; None while running
    stop_reason: int | str | None = None   # the stop token id or stop string; None for EOS and length
    logprobs: list[dict[int, Logprob]] | None = None   # per token: the sampled one first, then the top ones
    cumulative_logprob: float | None = None            # sum of the sampled tokens' logprobs (when asked for)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """vLLM's per-request times, in seconds of ``time.monotonic()`` (differences are meaningful, the
    values themselves are not dates); None for what has not happened yet."""
    arrival_time: float                    # added to the engine
    first_scheduled_time: float | None     # first admitted by the scheduler
    first_token_time: float | None         # its first output token joined it
    last_token_time: float | None          # its latest output token joined it
    finished_time: float | None            # a stop condition (or an abort) ended it
    time_in_queue: float | None            # first_scheduled_time - arrival_time


def request_metrics(reqs) -> RequestMetrics:
    """The times of a request's sequences (n > 1: the earliest start, the latest end)."""
    def pick(f, name):
        got = [getattr(r, name) for r in reqs if getattr(r, name) is not None]
        return f(got) if got and (name != "finished_time" or len(got) == len(reqs)) else None
    arrival, first = pick(min, "arrival_time"), pick(min, "first_scheduled_time")
    return RequestMetrics(arrival, first, pick(min, "first_token_time"), pick(max, "last_token_time"),
                          pick(max, "finished_time"), None if first is None else first - arrival)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None   # None for the first token, then one dict a token
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int | None = None  # prompt tokens found computed at its first admission (a KV manager's hit)
    num_preemptions: int = 0      # how often it was preempted and recomputed (not in vLLM's type)


@dataclass
class Metric:
    """One of ``LLM.get_metrics()``: vLLM's metric name, "counter" (since start) or "gauge" (now)."""
    name: str
    kind: str
    value: float
    help: str

    def __str__(self) -> str:
        return f"{self.name} {self.value:g}  ({self.kind}: {self.help})"


def engine_metrics(engine) -> list[Metric]:
    """What the engine counts now, with vLLM's names (its /metrics has more: histograms of times)."""
    sched, kv = engine.scheduler, engine.scheduler.kv
    out = [Metric("vllm:num_requests_running", "gauge", len(sched.running), "requests admitted, not finished"),
           Metric("vllm:num_requests_waiting", "gauge", len(sched.waiting), "requests in the queue"),
           Metric("vllm:kv_cache_usage_perc", "gauge", 1 - kv.num_free / kv.num_blocks, "share of KV blocks held"),
           Metric("vllm:num_preemptions", "counter", sched.num_preemptions, "preemptions since start")]
    return out + [Metric(*m) for m in kv.metrics()]       # the KV manager's own counters, if it keeps any


@dataclass(slots=True)
class ModelRunnerOutput:
    """What one step produced for the requests that sampled (vLLM's name), handed to
    ``Scheduler.update_from_output``: per request, its new tokens in order, and with each token
    its logprobs (where asked for) and its logits (only when the engine keeps them)."""
    reqs: list                                  # the requests that sampled, in batch order
    token_ids: list[list[int]]                  # per request: its new tokens
    logprobs: list[list] | None = None          # per request, per token: TokenLogprobs or None
    logits: list[list] | None = None            # per request, per token: [V] float32 on the CPU


@dataclass(slots=True)      # one per request per step: slots make it cheap to create
class StepOutput:
    """One request's progress in one ``step()``: the tokens it gained (streaming reads these)."""
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None


@dataclass
class StepStats:
    """What one step did, for ``--trace`` and the benchmark's roofline."""
    step: int
    prefill_tokens: int
    decode_tokens: int
    chunks: list[tuple[str, int, int, int]] = field(default_factory=list)  # (id, start, n, prefill_len) per prefill
    preempted: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    running: int = 0
    waiting: int = 0
    blocks_used: int = 0
    blocks_total: int = 0
    kv_tokens: int = 0            # sum of seq_lens_kv: keys attention reads this step
    sampled: int = 0
    hits: list[tuple[str, int]] = field(default_factory=list)   # per admission: (id, tokens found computed)
    t: float = 0.0                # the host's clock (perf_counter) when the record was made: bench_e2e's phases

    def line(self) -> str:
        chunks = " ".join(f"{r}[{s}:{s + n}/{p}]" for r, s, n, p in self.chunks) or "-"
        parts = [f"step {self.step:3d}", f"prefill {self.prefill_tokens:3d} tok", f"decode {self.decode_tokens:2d}",
                 f"chunks {chunks}"]
        if self.admitted:
            parts.append("admit " + ",".join(self.admitted))
        if self.preempted:
            parts.append("PREEMPT " + ",".join(self.preempted))
        if self.finished:
            parts.append("done " + ",".join(self.finished))
        hits = [f"{r}+{n}" for r, n in self.hits if n]        # tokens found computed at admission
        if hits:
            parts.append("hit " + ",".join(hits))
        parts += [f"running {self.running}", f"waiting {self.waiting}",
                  f"blocks {self.blocks_used}/{self.blocks_total}"]
        return " | ".join(parts)


def step_stats(engine, out, running: int, waiting: int, sampled: int, finished: list[str]) -> StepStats:
    """What the step did, for people (--trace, benchmarks); no code reads it to decide."""
    kv, scheduled = engine.scheduler.kv, out.scheduled
    chunks = [(req.request_id, req.kv.cur_len - n, n, req.prefill_len)
              for (req, n), pre in zip(scheduled, out.prefill) if pre] if any(out.prefill) else []
    prefill = sum([c[2] for c in chunks])
    admitted = scheduled[len(scheduled) - len(out.admitted):]      # admissions come last
    return StepStats(step=len(engine.stats), prefill_tokens=prefill, decode_tokens=out.num_tokens - prefill,
                     chunks=chunks, preempted=[r.request_id for r in out.preempted],
                     admitted=[r.request_id for r in out.admitted], finished=finished, running=running,
                     waiting=waiting, blocks_used=kv.num_blocks - kv.num_free, blocks_total=kv.num_blocks,
                     kv_tokens=sum([req.kv.cur_len for req, _ in scheduled]), sampled=sampled,
                     hits=[(req.request_id, req.kv.cur_len - n) for req, n in admitted], t=time.perf_counter())


def completion(index: int, req, decode) -> CompletionOutput:
    """A request's CompletionOutput; ``decode(ids) -> str``, or None (no tokenizer, or detokenize=False)."""
    if not req.params.detokenize:
        text = ""                                        # vLLM: no text when asked for none
    elif decode is None:
        text = None
    elif req.params.stop:
        text = req.stops.text                            # decoded every step, cut at the stop string
    else:
        text = decode(req.output_ids)
    asked = req.params.logprobs is not None
    return CompletionOutput(index, text, list(req.output_ids), req.finish_reason, req.stop_reason,
                            [logprob_dict(lp, decode) for lp in req.logprobs] if asked else None,
                            req.cumulative_logprob if asked else None)


def logprob_dict(lp, decode) -> dict[int, Logprob]:
    """vLLM's shape for one position: the sampled token first (its rank), then the top ones (1..k)."""
    text = (lambda t: decode([t])) if decode is not None else (lambda t: None)
    d = {lp.token_id: Logprob(lp.logprob, lp.rank, text(lp.token_id))}
    for r, (tid, v) in enumerate(lp.top, 1):
        d.setdefault(tid, Logprob(v, r, text(tid)))
    return d


def prompt_logprobs(req, decode) -> list | None:
    """vLLM's ``RequestOutput.prompt_logprobs`` of a request, or None when it asked for none."""
    if req.params.prompt_logprobs is None:
        return None
    return prompt_logprob_dicts(req.prompt_logprobs or (), decode)


def prompt_logprob_dicts(lps, decode) -> list:
    """Stage 4's TokenLogprobs of the prompt -> vLLM's list: None for the first prompt token (nothing
    predicts it), then per prompt token a dict with that token first (its rank), then the top ones."""
    return [None] + [logprob_dict(lp, decode) for lp in lps]
