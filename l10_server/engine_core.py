"""The engine core: the one engine loop, in its own process (vLLM v1's EngineCore).

    python process 1 (the server)                       process 2 (this module)
    -----------------------------                       -----------------------
    AsyncLLM.submit ----- ("add", key, i, id, prompt, params) --------->  make_requests, add_group
    Submission.close ---- ("abort", id) ------------------------------->  abort_request
    reader thread  <----- ONE message per step: the new tokens, the rest, the metrics ------  step()

Why a process and not a thread: a step's host work and the server's per-chunk work (JSON, the
socket, detokenizing) both need a Python interpreter. In one process they take turns on one
lock (the GIL), so every chunk written makes every step slower: measured on an H100 with 256
streams, a thread-based server made 44% of the offline throughput. Here the engine never waits
for the server; the server merges what it has not sent yet (submission.py).

The child builds its own ``LLM``, the latest stage's (``l5_scheduler.stages.latest``: whatever its
step order, a step may give a request several tokens), from the flags (CUDA is initialized here,
never in the server), ignores Ctrl-C (the terminal sends it to both processes; the server
decides), and exits when told to stop or when the server's end of the pipe closes.

Failures (lesson 10.7). A request that cannot be admitted, for any reason, is refused in its ack
(``refusal``: a UserError is a 400, anything else a 500) and the core goes on. A step that raises
cannot be pinned on one request (one forward pass and one sampler call serve the whole batch, and
the engine's state is half-updated), so the core reports "dead" and stops: vLLM's EngineDeadError.
"""
from __future__ import annotations

import contextlib
import signal
import time
import traceback
from dataclasses import dataclass

from plumbing.errors import UserError


def run_engine_core(model, llm_kwargs: dict, inbox, outbox) -> None:
    """The child process's entry point: load, say "ready" (with what the server shows), serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from l5_scheduler.stages import latest
        from .serve import describe
        stage = latest("stage")                             # the whole engine: every stage's parts
        llm = stage.LLM(model, **llm_kwargs)
        if llm.tokenizer is None:
            raise UserError("this checkpoint has no tokenizer, and a server sends text: serve one that ships "
                            "tokenizer.json / tokenizer_config.json.")
    except BaseException as e:                       # a bad flag or checkpoint: the server says why and exits
        outbox.send(("failed", str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"))
        return
    core = EngineCore(llm.llm_engine, outbox)
    cfg = llm.llm_engine.config
    outbox.send(("ready", dict(describe=describe(llm, model or "tiny-qwen3", stage.__name__.split(".")[0]),
                               max_model_len=cfg.max_model_len, tokenizer_path=str(llm.tokenizer.name_or_path),
                               snapshot=core.snapshot())))
    core.run(inbox)


NO_TOKENS = ((), (), ())      # a message with no one-token updates


def request_stats(out, max_tokens: int) -> dict:
    """What /metrics' per-request histograms need from the engine, for a finished request: its
    max_tokens as the engine ran it (the server may have left it to the engine: the room left), and
    vLLM's phases from its ``RequestOutput.metrics`` (one monotonic clock in both processes):
    queued (arrival to first scheduled), prefill (to its first token), decode (to its last token),
    inference (first scheduled to last token)."""
    m = out.metrics
    return {"max_tokens": max_tokens, "queue": m.time_in_queue,
            "prefill": m.first_token_time - m.first_scheduled_time,
            "decode": m.last_token_time - m.first_token_time,
            "inference": m.last_token_time - m.first_scheduled_time}


class RequestFailed(RuntimeError):
    """One request met an error that is not its input's fault (a bug it found): the server answers 500,
    and the engine core goes on serving the others."""


def refusal(e: Exception) -> Exception:
    """A request that could not be admitted, as the server answers it: a UserError (its input: a bad
    prompt, too long, ...) as it is, a 400; anything else as RequestFailed, a 500, with the traceback
    in the core's log. Both go back in the request's ack (vLLM: the error is that request's output)."""
    if isinstance(e, UserError):
        return e
    traceback.print_exc()
    return RequestFailed(f"the engine could not take this request: {type(e).__name__}: {str(e)[:200]}")


@dataclass
class _Track:
    """The engine core's record of one prompt in flight."""
    key: int                               # its submission's key in the server
    i: int                                 # the prompt's index in its submission
    rid: str                               # its engine request id
    left: int                              # choices not finished
    logprobs: bool
    simple: bool                           # one choice, no logprobs: its tokens take the fast path
    sids: list[str]                        # its sequences' ids (n of them), by choice index
    prompt_lps: bool = False               # prompt_logprobs asked and not sent yet (they go with its first update)


class EngineCore:
    def __init__(self, engine, outbox):
        self.engine, self.outbox = engine, outbox
        engine.keep_stats = False                  # no per-step record: a server runs for days
        self._tracks: dict[str, _Track] = {}       # request id -> its prompt
        self._seq: dict[str, tuple[_Track, int]] = {}    # sequence id -> (its prompt, its choice index)
        self.counts = {"prompt_tokens": 0, "generation_tokens": 0, "max_running": 0,
                       "engine_steps": 0, "engine_step_seconds": 0.0, "engine_send_seconds": 0.0,
                       "engine_take_seconds": 0.0,   # taking adds and aborts in, between steps
                       "engine_busy_periods": 0,     # times the core went from idle to stepping
                       # times on the monotonic clock (time.perf_counter, one clock for every process
                       # of a Linux machine): when the core last woke from idle with work to step, its
                       # last step ended, it last took a request in. A benchmark's timeline (bench_serve.py).
                       "engine_busy_since": 0.0, "engine_last_step_end": 0.0, "engine_last_add": 0.0}

    def run(self, inbox) -> None:
        eng, c, clock = self.engine, self.counts, time.perf_counter
        idle = True
        try:
            while True:
                block = not eng.has_unfinished_requests()
                idle = idle or block                   # nothing to step: the next step starts a stretch
                if not self._drain(inbox, block=block):
                    return
                if not eng.has_unfinished_requests():
                    continue
                if idle:                               # the stretch begins where the core woke with work
                    c["engine_busy_since"], idle = self._drain_start, False
                    c["engine_busy_periods"] += 1
                t0 = clock()
                fast, out = self._emit(eng.step())
                t1 = clock()
                c["engine_steps"] += 1                 # counted before the snapshot goes out with the step
                c["engine_step_seconds"] += t1 - t0
                c["engine_last_step_end"] = t1
                self.outbox.send((fast, out, self.snapshot()))
                c["engine_send_seconds"] += clock() - t1    # (in /metrics from the next message on)
        except (EOFError, BrokenPipeError, OSError):    # the server is gone: nothing left to serve
            return
        except BaseException as e:                 # a step raised: no request to blame, the engine's state
            traceback.print_exc()                  # unknown (half a step applied): the core dies, the server
            with contextlib.suppress(OSError):     # answers everyone in flight and exits (serve.py)
                self.outbox.send(("dead", f"the engine stopped after an error: {type(e).__name__}: {str(e)[:200]}"))

    def _drain(self, inbox, block: bool) -> bool:
        """Take what the server sent (waiting for it when idle); False on "stop"."""
        items = [inbox.recv()] if block else []
        t0 = self._drain_start = time.perf_counter()   # awake, with what came
        while inbox.poll():
            items.append(inbox.recv())
        out = []
        for op, *args in items:
            if op == "add":
                out.append(self._add(*args))
            elif op == "abort":
                out.extend(self._abort(args[0]))
            else:                                  # stop: abort everything, and say so to each stream
                out.extend(x for rid in list(self._tracks) for x in self._abort(rid))
                self.outbox.send((NO_TOKENS, out, self.snapshot()))
                return False
        if items:
            t1 = time.perf_counter()
            self.counts["engine_take_seconds"] += t1 - t0
            if any(op == "add" for op, *_ in items):
                self.counts["engine_last_add"] = t1
        if out:
            self.outbox.send((NO_TOKENS, out, self.snapshot()))
        return True

    def _add(self, key: int, i: int, rid: str, prompt, params):
        try:
            params, reqs = self._admit(rid, prompt, params)
        except Exception as e:                     # ANY error: this request's, never the core's
            return key, "ack", i, refusal(e)
        lp, plp = params.logprobs is not None, params.prompt_logprobs is not None
        sids = [req.request_id for req in reqs]
        track = self._tracks[rid] = _Track(key, i, rid, len(reqs), lp, len(reqs) == 1 and not (lp or plp), sids, plp)
        for k, req in enumerate(reqs):
            self._seq[req.request_id] = (track, k)
        self.counts["prompt_tokens"] += len(reqs[0].prompt_ids)
        return key, "ack", i, list(reqs[0].prompt_ids)

    def _admit(self, rid: str, prompt, params):
        """Check the prompt and add its sequences; whatever of it got in leaves again if this raises."""
        eng = self.engine
        rid, reqs = eng.make_requests(prompt, params, rid)
        try:
            eng.add_group(rid, reqs)
        except BaseException:
            eng.abort_request(rid)                 # its blocks (if any) back to the pool
            raise
        return params, reqs

    def _abort(self, rid: str) -> list:
        track = self._tracks.pop(rid, None)
        if track is None:                          # finished meanwhile, or refused: nothing to do
            return []
        self.engine.abort_request(rid)
        ends = [(self._seq.pop(sid)[1], [], None, "abort", None, None) for sid in track.sids if sid in self._seq]
        return [(track.key, "out", track.i, (ends, True, None))]

    def _emit(self, outs) -> tuple[tuple, list]:
        """One step's outputs, in two forms. Most are the new tokens (usually one; a step order may
        give several) of a running request with one choice and no logprobs: those go as three flat
        lists (submission key, prompt index, token: one entry per token, in order), which pickle in
        microseconds. The rest (a choice that finished, n > 1, logprobs) go as one tuple per prompt
        of a Choice's fields; a prompt that asked for prompt_logprobs sends them once, with its first update
        (its prompt was computed by then: stage 4's TokenLogprobs, which the server decodes into vLLM's
        dicts). This is on every step's critical path."""
        eng, seq, keys, idx, toks, updates, plps = self.engine, self._seq, [], [], [], {}, []
        generated = 0
        for o in outs:
            track, k = seq[o.request_id]
            ids = o.new_token_ids
            generated += len(ids)
            if track.simple and not o.finished:
                if len(ids) == 1:                                        # the common case: one token a step
                    keys.append(track.key)
                    idx.append(track.i)
                    toks.append(ids[0])
                else:
                    keys += [track.key] * len(ids)
                    idx += [track.i] * len(ids)
                    toks += ids
                continue
            lps = eng.requests[o.request_id].logprobs[-len(ids):] if track.logprobs else None
            ch = (k, ids, lps, None, None, None)
            if o.finished:
                final = eng.output(track.rid).outputs[k]                 # the engine's text: cut at a stop string
                ch = (k, ids, lps, final.finish_reason, final.stop_reason, final.text)
                track.left -= 1
                del seq[o.request_id]
            if track.rid not in updates:
                updates[track.rid] = (track, [])
                if track.prompt_lps:               # (never on the fast path: such a track is not simple)
                    track.prompt_lps = False
                    plps.append((track.key, "prompt_logprobs", track.i, eng.requests[o.request_id].prompt_logprobs))
            updates[track.rid][1].append(ch)
        self.counts["generation_tokens"] += generated              # tokens, not sequences: a step may give several
        out = plps                                                 # before the updates they go with
        for rid, (track, chs) in updates.items():
            stats = None
            if track.left == 0:                                    # the engine forgets it now
                max_tokens = eng.requests[track.sids[0]].params.max_tokens
                stats = request_stats(eng.release(rid), max_tokens)
                del self._tracks[rid]
            out.append((track.key, "out", track.i, (chs, track.left == 0, stats)))
        return (keys, idx, toks), out

    def snapshot(self) -> dict:
        """What /metrics reports, sent with every step's outputs."""
        sched = self.engine.scheduler
        kv = sched.kv
        self.counts["max_running"] = max(self.counts["max_running"], len(sched.running))
        own = {name: value for name, _, value, _ in kv.metrics()}   # the KV manager's counters (a prefix cache's)
        return dict(self.counts, running=len(sched.running), waiting=len(sched.waiting),
                    kv_blocks_total=kv.num_blocks, kv_blocks_free=kv.num_free, num_preemptions=sched.num_preemptions,
                    prefix_cache_queries=own.get("vllm:prefix_cache_queries", 0),
                    prefix_cache_hits=own.get("vllm:prefix_cache_hits", 0))
