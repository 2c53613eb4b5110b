"""The speculator: it proposes guesses after a step and verifies them in the next (step.py runs it).

    step N     ... tokens appended ...      propose(running): each decoding request gets up to k
                                            guesses in ``drafts[request_id]`` (the drafter's)
    step N+1   scheduler, then step.py      the request runs 1 + k tokens: its last known token and
                                            its k guesses, in the budget the plan left
               runner                       ONE forward pass, logits at all 1 + k positions
               verify(logits, reqs, drafts) per request: the guesses the target agrees with, then
                                            one token of the target's own (below)
               scheduler                    keeps the K/V of the tokens kept, refuses the rest

Verification. Position j of a request is scored as if guesses 1..j were already its outputs (a
stage 4 ``RowState`` whose output ids include them), so processors (bad words), penalties,
min_tokens and seeds see what they would see without speculation.

    greedy rows     stage 4's Sampler on every position gives the target's token t_j; keep guesses
                    while guess j+1 == t_j, then emit t_j at the first mismatch (or after the last
                    guess: the bonus). Token for token what plain decoding emits.
    sampling rows   rejection.py: keep guess x with probability p(x) (the drafters' guesses are
                    deterministic, q = one-hot); at a refusal sample the target without x; after
                    the last guess sample the target. The output has the target's distribution.

Randomness: a seeded row draws its acceptance uniforms and its noise from generators seeded by
(seed, absolute position), as stage 4 does, so a seeded request repeats exactly; it does not draw
the same tokens as the same seed without speculation (the draws are used differently).

Uniform steps. A request always gets exactly k guesses (the drafter's, then its last token
repeated: a filler is verified like any guess, and kept only if the target agrees), so a verify
step has the same shape every time and replays one CUDA graph per batch bucket (graphs.py:
``VerifyGraphs``, with stage 7's capture). Near its length limit a request gets
fewer; a step whose requests all verify the same smaller number replays that number's graph (one
is captured for each of 1..k guesses), a step that mixes counts runs eagerly.

When it pays (``disable_by_batch_size``, vLLM's name). A decode step reads every weight once for
B tokens; with guesses it computes B(k+1) tokens for about the same time while that stays
memory-bound. Past that, the verified tokens cost compute the guesses may not repay, so the
speculator proposes nothing for a step with more than ``disable_by_batch_size`` decoding requests.
"""
from __future__ import annotations

import itertools

import torch

from l4_sampler.processors import apply_processors
from l4_sampler.sampler import (RowState, Sampled, apply_min_p, apply_min_tokens, apply_penalties,
                                apply_temperature, apply_top_k_top_p, noise_seed)

from .rejection import rejection_sample

ACCEPT_SALT = 0x5EC0DE                      # a seeded row's acceptance uniforms: another stream than its noise


class Speculator:
    def __init__(self, drafter, num_speculative_tokens: int, max_model_len: int, disable_by_batch_size: int,
                 seed: int | None = None):
        self.drafter, self.k, self.max_model_len = drafter, num_speculative_tokens, max_model_len
        self.disable_by_batch_size, self.seed = disable_by_batch_size, seed
        self.drafts: dict[str, list[int]] = {}                   # request id -> its guesses for the next step
        self._shared: dict[str, torch.Generator] = {}            # unseeded rows' draws (as stage 4's Sampler)
        self.drafted = self.accepted = self.verify_steps = self.off_steps = self.filled = 0   # for people

    # ---- after a step: guesses for the next one -----------------------------------------------
    def propose(self, running) -> None:
        ids = {req.request_id for req in running}
        self.drafter.retain(ids)
        self.drafts = {rid: d for rid, d in self.drafts.items() if rid in ids}   # preempted, finished: gone
        dec = [req for req in running if req.kv.cur_len == req.num_tokens - 1]   # it decodes next
        if not dec:
            return
        if len(dec) > self.disable_by_batch_size:
            self.off_steps += 1                                  # a big batch: guesses would not pay, and a
            self.drafts.clear()                                  # leftover one would make the step eager
            return
        ks = [self._room(req) for req in dec]
        for req, k, d in zip(dec, ks, self.drafter.propose(dec, ks)):
            d = list(d[:k])
            fill = k - len(d)                                    # too few guesses: repeat the last token
            self.drafts[req.request_id] = d + [d[-1] if d else (req.output_ids or req.prompt_ids)[-1]] * fill
            self.filled += fill

    def _room(self, req) -> int:
        """Guesses that can still be emitted: the step emits up to 1 + k tokens, never past the length limit."""
        p = req.params
        left = min(p.max_tokens, self.max_model_len - len(req.prompt_ids)) - len(req.output_ids)
        return max(0, min(self.k, left - 1))

    # ---- the step: verify ---------------------------------------------------------------------
    def verify(self, logits: torch.Tensor, reqs, drafts: list[list[int]], sampler, argmax: torch.Tensor | None = None):
        """logits [sum(1 + k_i), V] -> (new tokens per request, their TokenLogprobs or None, their logits
        rows). ``drafts[i]``: request i's guesses this step (maybe none); ``argmax``: the rows' argmax,
        if the runner computed it (lesson 7's graphs do)."""
        counts = [1 + len(d) for d in drafts]
        if logits.shape[0] != sum(counts):
            raise RuntimeError(f"the runner returned {logits.shape[0]} logits rows for {sum(counts)} verified positions: "
                               "it must score the last known token and every draft (lesson 11)")
        rows = [req.row if j == 0 else RowState(req.params, req.prompt_ids, req.output_ids + d[:j],
                                                req.row.eos_token_ids, req.row.bad_words_ids)
                for req, d in zip(reqs, drafts) for j in range(len(d) + 1)]
        so = sampler(logits, rows, argmax)                       # stage 4 at every position
        ids, starts = so.token_ids_list, [0, *itertools.accumulate(counts)][:-1]
        sampled = [i for i, req in enumerate(reqs) if drafts[i] and not req.params.greedy]
        rejected = self._reject(logits, rows, reqs, drafts, sampled, starts) if sampled else {}
        new, where = [], []
        for i, req in enumerate(reqs):
            d, s = drafts[i], starts[i]
            if i in rejected:
                a, cand = rejected[i]
                toks = d[:a] + [cand[a]]
            else:                                                # greedy, or no drafts: stage 4's tokens
                a = 0
                while a < len(d) and d[a] == ids[s + a]:
                    a += 1
                toks = d[:a] + [ids[s + a]]
            new.append(toks)
            where.append(list(range(s, s + len(toks))))
            if d:
                self.drafted, self.accepted, self.verify_steps = self.drafted + len(d), self.accepted + a, self.verify_steps + 1
        return new, self._logprobs(logits, rows, new, where, so), where

    def _reject(self, logits, rows, reqs, drafts, sampled: list[int], starts: list[int]) -> dict:
        """The acceptance rule for the sampling rows with drafts, in one batch padded to the longest:
        stage 4's processors on all their positions at once, then rejection.py."""
        ns = [len(drafts[i]) + 1 for i in sampled]
        R, k, V, dev = len(sampled), max(ns) - 1, logits.shape[1], logits.device
        src = [starts[i] + j for i, n in zip(sampled, ns) for j in range(n)]       # logits rows
        dst = [r * (k + 1) + j for r, n in enumerate(ns) for j in range(n)]        # (request, position)
        sub = [rows[w] for w in src]
        z = apply_penalties(apply_min_tokens(apply_processors(logits[src].to(torch.float32), sub), sub), sub)
        p = torch.zeros(R * (k + 1), V, device=dev)
        p[torch.tensor(dst, device=dev)] = apply_top_k_top_p(apply_min_p(apply_temperature(z, sub), sub), sub).softmax(-1)
        guesses = torch.zeros(R, k, dtype=torch.int64)
        valid = torch.zeros(R, k, dtype=torch.bool)
        for r, i in enumerate(sampled):
            guesses[r, :ns[r] - 1] = torch.tensor(drafts[i])
            valid[r, :ns[r] - 1] = True
        u = torch.rand(R, k, generator=self._generator("cpu"))
        e = torch.empty(R, k + 1, V, device=dev).exponential_(generator=self._generator(dev))
        for r, i in enumerate(sampled):
            if reqs[i].params.seed is not None:                  # its own streams, by absolute position
                self._seeded_noise(reqs[i].params.seed, rows[starts[i]:starts[i] + ns[r]], u[r], e[r])
        acc, cand = rejection_sample(p.view(R, k + 1, V), guesses.to(dev), None, u.to(dev), e, valid.to(dev))
        return {i: (acc[r], cand[r]) for r, i in enumerate(sampled)}

    def _generator(self, device) -> torch.Generator:
        if str(device) not in self._shared:
            g = self._shared[str(device)] = torch.Generator(device=device)
            g.manual_seed(self.seed) if self.seed is not None else g.seed()
        return self._shared[str(device)]

    @staticmethod
    def _seeded_noise(seed: int, sub, u: torch.Tensor, e: torch.Tensor) -> None:
        """A seeded request's uniforms and Exp(1) noise: one generator per absolute position, as stage 4."""
        for j, row in enumerate(sub):
            g = torch.Generator(device=e.device)
            g.manual_seed(noise_seed(seed, row.position))
            e[j].exponential_(generator=g)
            if j < len(sub) - 1:
                gu = torch.Generator()
                gu.manual_seed(noise_seed(seed ^ ACCEPT_SALT, row.position))
                u[j] = torch.rand((), generator=gu)

    def _logprobs(self, logits, rows, new, where, so):
        """Stage 4's logprobs of the tokens emitted (a sampling row's may differ from stage 4's draw)."""
        if so.logprobs is None:
            return None
        flat_rows = [w for ws in where for w in ws]
        flat_ids = [t for toks in new for t in toks]
        raw = logits[flat_rows].to(torch.float32).log_softmax(-1)
        ids = torch.tensor(flat_ids, device=logits.device)
        lp = Sampled(ids, raw, [rows[w] for w in flat_rows]).result().logprobs
        out, o = [], 0
        for toks in new:
            out.append(lp[o:o + len(toks)])
            o += len(toks)
        return out

    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None
