"""Stage 4 sampler: logits [B, V] -> one token id per row, each row with its own SamplingParams.

This torch reference is the spec. Every step works on a float32 copy of the logits; B rows, V vocab.

    raw logprobs     log_softmax(logits), before anything else (vLLM v1 default 'raw_logprobs')
    0. processors    allowed_token_ids, bad_words, logit_bias (processors.py), for rows that have them
       min_tokens    while len(output) < min_tokens: EOS (unless ignore_eos) and stop ids -> -inf
    1. penalties     repetition (prompt + output tokens), then frequency and presence (output only)
    2. greedy        greedy rows (temperature < 1e-5, or top_k == 1) take argmax here and are done
    3. temperature   z / T
    4. min_p         drop tokens with softmax(z / T) < min_p * max(softmax(z / T))
    5. top-k, top-p  one stable descending sort: keep ranks < k, then the nucleus of what is left
    6. sample        probs = softmax(z); token = argmax(probs / q), q ~ Exp(1)  ("exponential race")

All greedy. When every row is *plain* greedy (temperature ~0 or top_k 1, no processors, no
penalties, no min_tokens, no logprobs), steps 0-1 change nothing and step 2 is the whole answer: the sampler
takes ``logits.argmax(-1)`` and skips the rest, including its per-row checks. The ids are the
ones the full pipeline gives (the same argmax of the same float32 values); a batch with one
other row takes the full pipeline. (vLLM's Sampler has the same ``all_greedy`` branch.)

Ties. Greedy is torch.argmax: the lowest token id among equal maxima. top-k and top-p rank tokens
with a *stable* descending sort, so equal logits are ranked by token id too. top-k keeps exactly
k tokens; top-p keeps a token when the mass strictly before it (in that order) is < top_p. So when
equal-probability tokens straddle the top-p boundary, the lower ids get in, one at a time, until
the mass reaches top_p, and the rest are cut: the nucleus is the smallest set, not "all ties".
(vLLM uses an unstable sort, so which tied token it keeps is unspecified.)

Randomness. Unseeded rows share one generator (seeded by ``Sampler(seed=...)``). A seeded row
gets a fresh torch.Generator per step, seeded with ``noise_seed(seed, position)``, so its token
depends only on (seed, absolute position, logits) and never on its batch slot or neighbours.

Memory traffic. Each step reads and writes B*V floats (B=64, V=151,936: 39 MB); the sort in
step 5 costs O(B*V log V) and dominates. Steps a batch does not use are skipped on the host.

Host syncs. Parameters are copied host -> device without waiting (pinned memory), no step
branches on a device value, and the one sync is ``Sampled.result()`` (``launch`` returns before it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from plumbing.errors import UserError
from plumbing.exercise import learner_can_replace

from .params import SamplingParams
from .logprobs import TokenLogprobs, logprob_tensors, token_logprobs
from .processors import apply_processors

NEG_INF = float("-inf")
MASK64 = (1 << 64) - 1


@dataclass
class RowState:
    """What the sampler needs to know about one request this step."""
    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]          # tokens sampled so far (not the one being sampled now)
    eos_token_ids: tuple[int, ...] = ()   # the model's EOS ids (Qwen3: <|im_end|>, <|endoftext|>)
    bad_words_ids: list = ()       # params.bad_words as token sequences (processors.bad_words_ids)

    def __post_init__(self):
        # Greedy with nothing that reads the history or the raw logprobs: every step of the
        # pipeline before the argmax is a no-op for this row, whatever it has sampled so far.
        p = self.params
        self.plain_greedy = (p.greedy and not p.has_penalties and p.min_tokens == 0 and p.logprobs is None
                             and not p.has_processors)

    @property
    def position(self) -> int:
        """Absolute position of the token being sampled now (0-based)."""
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor        # [B] int64, on the logits' device (feed it to the next step)
    token_ids_list: list[int]      # the same ids on the host (for stop checks)
    logprobs: list[TokenLogprobs | None] | None   # per row; None when no row asked


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def noise_seed(seed: int, position: int) -> int:
    """Generator seed for the token at ``position`` of a request seeded with ``seed``.

    ``splitmix64(splitmix64(seed) + position)``: a 64-bit hash, so nearby (seed, position) pairs
    get unrelated streams. CUDA's Philox uses all 64 bits; the CPU's mt19937 keeps only the low 32,
    so on a CPU two of ~65k distinct pairs share a stream with probability ~1/2 (birthday bound).
    """
    return _splitmix64((_splitmix64(seed & MASK64) + position) & MASK64)


def to_device(data: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Host list -> device tensor without making the host wait for the GPU's queued work."""
    t = torch.tensor(data, dtype=dtype)
    if device.type == "cuda":
        t = t.pin_memory()         # a copy from pageable memory would block the host
    return t.to(device, non_blocking=True)


def token_counts(id_lists: list[list[int]], V: int, device: torch.device) -> torch.Tensor:
    """[B, V] float32: how many times each token id occurs in each row's list."""
    L = max(1, max(len(ids) for ids in id_lists))
    padded = [ids + [V] * (L - len(ids)) for ids in id_lists]   # pad id V: a spare column
    ids = to_device(padded, torch.int64, device)                # [B, L]
    counts = torch.zeros(len(id_lists), V + 1, device=device)    # [B, V+1]
    counts.scatter_add_(1, ids, torch.ones(ids.shape, device=device))
    return counts[:, :V]                                         # [B, V]


def apply_min_tokens(z: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """Step 0, in place: a row still short of min_tokens cannot sample EOS or a stop id."""
    V = z.shape[1]
    flat = [i * V + t for i, r in enumerate(rows) if len(r.output_ids) < r.params.min_tokens
            for t in (*(() if r.params.ignore_eos else r.eos_token_ids), *r.params.stop_token_ids)]
    if flat:   # flat index row * V + token: index_fill_ does not sync (z[rows, tokens] = x does)
        z.view(-1).index_fill_(0, to_device(flat, torch.int64, z.device), NEG_INF)
    return z


def apply_penalties(z: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """Step 1. z: [B, V] float32. Rows with default penalties come out bit-identical."""
    if not any(r.params.has_penalties for r in rows):
        return z
    V = z.shape[1]
    rep = to_device([r.params.repetition_penalty for r in rows], torch.float32, z.device)[:, None]
    freq = to_device([r.params.frequency_penalty for r in rows], torch.float32, z.device)[:, None]
    pres = to_device([r.params.presence_penalty for r in rows], torch.float32, z.device)[:, None]
    out = token_counts([r.output_ids if r.params.has_penalties else [] for r in rows], V, z.device)
    in_prompt = token_counts([r.prompt_ids if r.params.repetition_penalty != 1.0 else []
                              for r in rows], V, z.device) > 0  # [B, V] bool
    # Repetition: any token seen in prompt or output; r > 1 pushes z toward 0 whatever its sign.
    seen = in_prompt | (out > 0)
    z = torch.where(seen, torch.where(z > 0, z / rep, z * rep), z)
    # Frequency and presence: output tokens only.
    return z - freq * out - pres * (out > 0).float()


def apply_temperature(z: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """Step 3. Greedy rows are divided by 1 (their argmax was already taken)."""
    t = [1.0 if r.params.greedy else r.params.temperature for r in rows]
    return z / to_device(t, torch.float32, z.device)[:, None]      # [B, V]


def apply_min_p(z: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """Step 4. Keep exactly the tokens with p >= min_p * p_max, p = softmax(z) after temperature."""
    if all(r.params.min_p == 0.0 for r in rows):
        return z
    min_p = to_device([r.params.min_p for r in rows], torch.float32, z.device)
    probs = z.softmax(-1)                                            # [B, V]
    threshold = min_p[:, None] * probs.amax(-1, keepdim=True)        # [B, 1]
    return z.masked_fill(probs < threshold, NEG_INF)


@learner_can_replace  # lesson 4's build-it exercise: exercises/l4_sampler.py
def top_p_keep(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """probs [B, V] sorted descending per row, top_p [B, 1] -> keep [B, V] bool: a token is kept
    when the mass strictly before it is < top_p (so rank 0 always is); top_p >= 1 keeps all."""
    mass_before = probs.cumsum(-1) - probs                           # exclusive prefix sum
    # p == 1 is "off": float cumsum can pass 1.0 early and would cut real tail tokens.
    return (mass_before < top_p) | (top_p >= 1.0)                    # rank 0 has mass 0: kept


def apply_top_k_top_p(z: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
    """Step 5. top-k by rank, then top-p on the renormalised top-k (vLLM's order)."""
    B, V = z.shape
    ks = [r.params.top_k if 0 < r.params.top_k < V else V for r in rows]
    ps = [r.params.top_p for r in rows]
    if all(k == V for k in ks) and all(p == 1.0 for p in ps):
        return z
    k = to_device(ks, torch.int64, z.device)[:, None]               # [B, 1]
    p = to_device(ps, torch.float32, z.device)[:, None]             # [B, 1]
    sorted_z, order = z.sort(dim=-1, descending=True, stable=True)   # [B, V] each; O(BV log V)
    rank = torch.arange(V, device=z.device)[None, :]                 # [1, V]
    keep = rank < k                                                  # top-k: exactly k ranks
    probs = sorted_z.masked_fill(~keep, NEG_INF).softmax(-1)         # [B, V] renormalised
    keep &= top_p_keep(probs, p)                                     # [B, V] nucleus, sorted order
    keep = torch.empty_like(keep).scatter_(1, order, keep)           # back to token order
    return z.masked_fill(~keep, NEG_INF)


def _check(logits: torch.Tensor, rows: list[RowState]) -> tuple[int, int]:
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise UserError(f"logits must be a 2-D float tensor [B, V], got {logits.dtype} "
                        f"{tuple(logits.shape)}")
    B, V = logits.shape
    if len(rows) != B:
        raise UserError(f"need one RowState per logits row: rows has {len(rows)}, logits has {B}")
    for i, r in enumerate(rows):
        p = r.params
        bad = [t for t in (*r.eos_token_ids, *p.stop_token_ids, *(p.logit_bias or ()), *(p.allowed_token_ids or ()),
                           *[t for w in r.bad_words_ids for t in w]) if not 0 <= t < V]
        if bad:
            raise UserError(f"row {i}: token ids (eos, stop, logit_bias, allowed, bad words) must be in [0, V={V}), "
                            f"got {bad}")
    return B, V


class Sampler:
    """``Sampler(seed)(logits [B, V], rows) -> SamplerOutput``. One RowState per row."""

    def __init__(self, seed: int | None = None):
        self.seed = seed                         # for the shared generator of unseeded rows
        self._shared: dict[str, torch.Generator] = {}

    def shared_generator(self, device: torch.device) -> torch.Generator:
        if str(device) not in self._shared:
            g = torch.Generator(device=device)
            if self.seed is not None:
                g.manual_seed(self.seed)
            else:
                g.seed()                         # non-deterministic
            self._shared[str(device)] = g
        return self._shared[str(device)]

    def __call__(self, logits: torch.Tensor, rows: list[RowState], argmax: torch.Tensor | None = None) -> SamplerOutput:
        """``argmax``: ``logits.argmax(-1)`` if the caller has it already; all-greedy reads it."""
        return self.launch(logits, rows, argmax).result()

    def launch(self, logits: torch.Tensor, rows: list[RowState], argmax: torch.Tensor | None = None) -> "Sampled":
        """``__call__``'s first half: queue the GPU work and the ids' copy to the host, return at once;
        ``.result()`` waits (a caller may do host work in between)."""
        if logits.dim() == 2 and len(rows) == logits.shape[0] and not [r for r in rows if not r.plain_greedy]:
            ids = logits.argmax(-1) if argmax is None else argmax   # [B]: the all-greedy branch (read BV)
            return Sampled(ids, None, rows)
        B, V = _check(logits, rows)
        z = logits.to(torch.float32, copy=True)          # [B, V]; read + write BV
        want_lp = any(r.params.logprobs is not None for r in rows)
        raw = z.log_softmax(-1) if want_lp else None     # [B, V] raw logprobs
        z = apply_penalties(apply_min_tokens(apply_processors(z, rows), rows), rows)
        ids = z.argmax(-1)                               # [B] greedy answer, every row
        greedy = [r.params.greedy for r in rows]
        if not all(greedy):
            z = apply_top_k_top_p(apply_min_p(apply_temperature(z, rows), rows), rows)
            sampled = self._race(z.softmax(-1), rows)    # [B]
            ids = sampled if not any(greedy) else torch.where(
                to_device(greedy, torch.bool, z.device), ids, sampled)
        return Sampled(ids, raw, rows)

    def _race(self, probs: torch.Tensor, rows: list[RowState]) -> torch.Tensor:
        """argmax(probs / q), q ~ Exp(1) i.i.d.: picks token i with probability probs[i]."""
        q = torch.empty_like(probs)                                 # [B, V]
        q.exponential_(generator=self.shared_generator(probs.device))
        for i, r in enumerate(rows):                                # seeded rows: own stream
            if r.params.seed is not None and not r.params.greedy:
                g = torch.Generator(device=probs.device)
                g.manual_seed(noise_seed(r.params.seed, r.position))
                q[i].exponential_(generator=g)                      # [V]
        q.clamp_(min=torch.finfo(torch.float32).tiny)  # exponential_ can return 0.0 -> 0/0 = NaN
        return (probs / q).argmax(-1)                               # [B]


class Sampled:
    """A sampler call in flight: ids (and logprobs) on the device, on their way to pinned memory."""

    def __init__(self, ids: torch.Tensor, raw: torch.Tensor | None, rows: list[RowState]):
        self.ids, self.rows, self.done = ids, rows, None
        parts = [ids] + (logprob_tensors(raw, ids, rows) if raw is not None else [])
        if ids.device.type == "cuda":            # copies that do not make the host wait
            parts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in parts]
            self.done = torch.cuda.Event()
            self.done.record()
        self.host = parts

    def result(self) -> SamplerOutput:
        # The step's one host sync: it waits for everything queued before the copies. It cannot
        # go: stops are checked on host ints, and the scheduler must know who finished.
        if self.done is not None:
            self.done.synchronize()
        ids_list = self.host[0].tolist()
        lps = token_logprobs(ids_list, self.rows, *[t.tolist() for t in self.host[1:]]) if len(self.host) > 1 else None
        return SamplerOutput(self.ids, ids_list, lps)
