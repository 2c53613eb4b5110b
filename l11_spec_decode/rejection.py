"""The acceptance rule: keep a draft token x with probability min(1, p(x) / q(x)); at the first
refusal, sample from the leftover mass normalize(max(0, p - q)); if every draft is kept, sample
one more token from the last position's p (the bonus).

    p [R, k+1, V]   the target's distribution at each verified position (stage 4's processors
                    applied: penalties, temperature, min_p, top-k/top-p), position j conditioned
                    on the request's tokens plus drafts 1..j
    drafts [R, k]   the drafter's guesses;  q [R, k, V] the distributions they were drawn from,
                    or None: a deterministic drafter (n-gram lookup, a greedy draft model), q = one-hot
    u [R, k]        uniforms in [0, 1) for the acceptance tests
    e [R, k+1, V]   Exp(1) noise for the races (stage 4's sampling: argmax(weights / e))

Why it is exact (one position; Leviathan et al. 2023, Chen et al. 2023). The emitted token y is x
accepted, or a draw from the residual after a refusal:

    P(y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x q(x) min(1, p(x)/q(x))) * max(0, p(y) - q(y)) / Z
         = min(q(y), p(y))        + (1 - sum_x min(q(x), p(x)))       * max(0, p(y) - q(y)) / Z

and Z = sum_y max(0, p(y) - q(y)) = 1 - sum_x min(p(x), q(x)), so the second term is
max(0, p(y) - q(y)) and P(y) = min(p, q) + max(0, p - q) = p(y). Position j + 1 is reached only
if every earlier draft was kept, and its p is conditioned on exactly those tokens: by induction
every emitted token has the target's distribution given the tokens before it.

Rows may have fewer than k drafts (``valid``): past its own drafts a row's ratio is 0 (refused)
and its residual is p itself, so the token there is the bonus. Everything is one batch of tensor
ops and one host copy.
"""
from __future__ import annotations

import torch

from plumbing.exercise import learner_can_replace


def acceptance_ratio(p_x: torch.Tensor, q_x: torch.Tensor | None) -> torch.Tensor:
    """The probability of keeping each draft token x: min(1, p(x) / q(x)) (u < ratio keeps it, so
    values above 1 need no clamp). ``q_x`` None: a deterministic draft, q(x) = 1."""
    return p_x if q_x is None else p_x / q_x.clamp_min(1e-30)


@learner_can_replace  # lesson 11's build-it exercise: exercises/l11_spec_decode.py
def rejection_sample(p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor,
                     e: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[list[int], list[list[int]]]:
    """Returns (accepted count per row, candidate token per row and position): row r emits
    ``drafts[r, :a] + [cand[r][a]]`` with ``a = accepted[r]``."""
    R, k1, V = p.shape
    k = k1 - 1
    valid = torch.ones(R, k, dtype=torch.bool, device=p.device) if valid is None else valid
    idx = drafts.clamp(0, V - 1)[..., None]                          # [R, k, 1]
    p_x = p[:, :k].gather(-1, idx)[..., 0]                           # [R, k] p(x) at each draft
    ratio = acceptance_ratio(p_x, None if q is None else q.gather(-1, idx)[..., 0])
    keep = (u < ratio) & valid                                       # [R, k]
    accepted = keep.to(torch.int32).cumprod(-1).sum(-1)              # leading run of kept drafts
    if q is None:                                                    # one-hot q: drop the draft's mass
        res = p[:, :k].scatter(-1, idx, torch.where(valid, 0.0, p_x)[..., None])
    else:
        res = torch.where(valid[..., None], (p[:, :k] - q).clamp_min(0), p[:, :k])
    empty = res.sum(-1, keepdim=True) <= 0                           # p == q there: nothing left over
    res = torch.where(empty, p[:, :k], res)                          # (a refusal is then impossible)
    weights = torch.cat([res, p[:, k:]], dim=1)                      # [R, k+1, V]: the bonus is p_k
    cand = (weights / e.clamp_min(torch.finfo(torch.float32).tiny)).argmax(-1)   # [R, k+1]
    both = torch.cat([accepted[:, None].to(torch.int64), cand], dim=1).tolist()  # one host copy
    return [row[0] for row in both], [row[1:] for row in both]
