"""A draft model: a smaller checkpoint with the target's tokenizer guesses k tokens by greedy decoding.

It runs on the engine's own parts, stage 5's: a ``BlockManager`` for its KV blocks and a
``ModelRunner`` (stage 3's paged attention) for its forward passes, with one ``DraftSeq`` per
request standing in for the request (the calls a runner makes: ``kv``, ``num_computed_tokens``,
``tokens``). Per propose call, for the requests that decode next:

    sync      the draft cache holds K/V for the tokens it saw last time, its own guesses
              included; keep the longest prefix that still matches the request's tokens (the
              guesses the target refused are rolled back: cur_len drops, the slots are reused)
    round 0   compute the tokens it has not seen (the new ones; a whole prompt the first time),
              argmax -> guess 1
    round j   compute guess j, argmax -> guess j + 1        (k forward passes in all, batched)

Its blocks are freed when the request leaves the running set (``retain``). If its pool runs out
a request simply gets no guesses that step.
"""
from __future__ import annotations

import numpy as np

from l1_dense.checkpoint import load_model, resolve_model_dir
from l2_gather.allocator import OutOfBlocks
from l5_scheduler.kv_manager import BlockManager
from l5_scheduler.request import KVBlocks
from l5_scheduler.runner import ModelRunner
from l5_scheduler.scheduler import SchedulerOutput
from plumbing.errors import UserError


class DraftSeq:
    """One request, as the draft model's runner sees it."""

    def __init__(self, request_id: str):
        self.request_id, self.kv, self.ids = request_id, KVBlocks(request_id), []

    @property
    def num_computed_tokens(self) -> int:
        return self.kv.cur_len

    def tokens(self, start: int, n: int) -> list[int]:
        return self.ids[start:start + n]


class DraftModelDrafter:
    def __init__(self, path: str, target, config, *, impl: str = "triton"):
        p = next(target.parameters())
        self.model = load_model(resolve_model_dir(path), p.device, p.dtype)
        dc, tc = self.model.cfg, target.cfg
        if dc.vocab_size != tc.vocab_size or set(dc.eos_token_ids) != set(tc.eos_token_ids):
            raise UserError(f"draft model {path!r} has vocab {dc.vocab_size} and EOS {dc.eos_token_ids}, the target "
                            f"{tc.vocab_size} and {tc.eos_token_ids}: a draft model must share the target's tokenizer.")
        self.kv = BlockManager(config.num_blocks, config.block_size)
        self.runner = ModelRunner(self.model, config, impl=impl)
        self.seqs: dict[str, DraftSeq] = {}
        self.forward_passes = 0

    def retain(self, ids) -> None:
        for rid in [r for r in self.seqs if r not in ids]:
            self.kv.free(self.seqs.pop(rid).kv)

    def _sync(self, req, k: int) -> DraftSeq | None:
        """The request's draft state, rolled back to what still matches and with room for k guesses."""
        seq = self.seqs.get(req.request_id)
        if seq is None:
            seq = self.seqs[req.request_id] = DraftSeq(req.request_id)
        toks = req.prompt_ids + req.output_ids
        n = min(len(seq.ids), len(toks))
        a, b = np.asarray(seq.ids[:n]), np.asarray(toks[:n])
        same = n if n == 0 or (a == b).all() else int(np.argmin(a == b))
        seq.kv.cur_len = min(seq.kv.cur_len, same, len(toks) - 1)   # at least the last token is computed again
        seq.ids = toks
        try:
            self.kv.reserve(seq.kv, len(toks) + k)
        except OutOfBlocks:
            return None
        return seq

    def propose(self, reqs, ks: list[int]) -> list[list[int]]:
        seqs = [self._sync(req, k) if k else None for req, k in zip(reqs, ks)]
        guesses: list[list[int]] = [[] for _ in reqs]
        for j in range(max(ks, default=0)):
            live = [i for i, s in enumerate(seqs) if s is not None and ks[i] > j]
            if not live:
                break
            out = SchedulerOutput(scheduled=[(seqs[i], len(seqs[i].ids) - seqs[i].kv.cur_len) for i in live],
                                  sample=[True] * len(live))
            logits = self.runner.execute(out).logits          # [len(live), V]
            self.forward_passes += 1
            for i, t in zip(live, logits.argmax(-1).tolist()):
                s = seqs[i]
                s.kv.cur_len = len(s.ids)                     # the tokens just computed
                s.ids.append(t)
                guesses[i].append(t)
        return guesses
