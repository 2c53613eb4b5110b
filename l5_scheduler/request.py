"""A request in flight: everything stage 5 tracks between ``add_request`` and the last token.

    add_request ──► WAITING ──admit──► RUNNING ──stop check fires──► FINISHED (blocks freed)
                       ▲                  │
                       └──── preempted ───┘   (blocks freed, num_computed_tokens = 0,
                            (front of queue)   prompt + outputs recomputed on readmission)

The tokens of a request are ``prompt_ids + output_ids`` (``num_tokens`` of them, a plain int
that ``append_output`` keeps: the scheduler reads it for every running request every step). Of
these, ``num_computed_tokens`` have their K/V in the cache. Every step the scheduler gives a running request its next
``num_tokens - num_computed_tokens`` tokens, or a chunk of them:

    fresh prompt of 300, budget 128:   chunk 128, chunk 128, chunk 44 -> sample    (chunked prefill)
    decode:                            1 token (the last sampled one)  -> sample
    readmitted after preemption with 300 prompt + 7 output tokens:
                                       307 tokens recomputed in chunks  -> sample the 8th output

A step samples for a request exactly when it computes the request's last known token, so a
mid-prefill chunk samples nothing and a recompute never re-samples a token it already has.

The KV side is stage 2's allocator ``Request`` (``kv``): its block list, the slot of every
position, and ``cur_len`` = ``num_computed_tokens``. Preemption throws that handle away and
starts a fresh one, so a preempted request can never touch the blocks it gave back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from l2_gather.allocator import Request as KVBlocks
from plumbing.errors import UserError


class RequestStatus(str, Enum):
    WAITING = "waiting"       # in the queue: new, or preempted and waiting to be recomputed
    RUNNING = "running"       # admitted: holds blocks, gets tokens every step (budget allowing)
    FINISHED = "finished"     # a stop condition fired; its blocks are back in the pool


@dataclass(eq=False)          # identity equality: two requests are never "the same"
class Request:
    request_id: str
    prompt_ids: list[int]
    params: object                      # l4_sampler.SamplingParams (max_tokens, seed, stops, ...)
    arrival: int                        # arrival order: first come, first served
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    kv: KVBlocks = None                 # stage 2's view: blocks, slot_indices, cur_len
    prefill_len: int = 0                # tokens to (re)compute, fixed at each admission
    num_preemptions: int = 0
    finish_reason: str | None = None    # "stop" | "length" (vLLM's names)
    stop_reason: int | str | None = None
    row: object = None                  # l4_sampler.RowState: what the sampler sees
    stops: object = None                # l4_sampler.StopChecker: has it finished, and why
    logprobs: list = field(default_factory=list)    # l4_sampler.TokenLogprobs per token, when asked for
    cumulative_logprob: float = 0.0
    logits: list = field(default_factory=list)   # [V] per sampled token, only when the engine keeps them
    prompt_logprobs: list | None = None  # prompt_logprobs asked: None, then one dict per prompt token computed
    num_cached_tokens: int | None = None   # tokens found computed at its first admission (the KV manager's hit)
    # Times (time.monotonic(); outputs.RequestMetrics): the engine sets arrival_time when the request is
    # added, the scheduler the rest, once per event (the token times once per step that gave it tokens).
    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    def __post_init__(self):
        if self.kv is None:
            self.kv = KVBlocks(self.request_id)
        self.num_tokens = len(self.prompt_ids) + len(self.output_ids)   # kept by append_output

    def append_output(self, token: int) -> None:
        """A sampled token joins the request (the sampler's RowState shares ``output_ids``)."""
        self.output_ids.append(token)
        self.num_tokens += 1

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose K/V are in the cache (vLLM's name for stage 2's ``cur_len``)."""
        return self.kv.cur_len

    @property
    def blocks(self) -> list[int]:
        return self.kv.blocks

    @property
    def prompt_logits_owed(self) -> bool:
        """A request still owed prompt logprobs computes its prompt: a KV manager that could find some of
        it computed already must not read it."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_ids) - 1

    def prompt_logits_rows(self, start: int, n: int) -> int:
        """prompt_logprobs: how many positions of the chunk ``start .. start+n-1`` still need their
        logits (position p's score prompt token p + 1): the chunk's last ones before a sampling row."""
        if self.prompt_logprobs is None:
            return 0
        return max(0, min(start + n, len(self.prompt_ids) - 1) - max(start, len(self.prompt_logprobs)))

    def tokens(self, start: int, n: int) -> list[int]:
        """Token ids at positions ``start .. start+n-1`` of prompt + output, without concatenating
        (fewer if the request has fewer)."""
        P = len(self.prompt_ids)
        head = self.prompt_ids[start:start + n] if start < P else []
        end = start + n - P                                   # end position within output_ids
        return head + (self.output_ids[max(0, start - P):end] if end > 0 else [])


def check_encodable(text: str, what: str = "the prompt") -> None:
    """A UserError if ``text`` holds a surrogate code point (U+D800..U+DFFF): one half of a UTF-16
    pair, alone (a JSON "\\ud800" escape is valid JSON). No UTF-8 encodes it, so no tokenizer can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{what} has an unpaired surrogate U+{ord(text[e.start]):04X} at character {e.start}: UTF-8 "
                        "cannot encode it, so no tokenizer can: remove it, or give both halves of the pair "
                        '(JSON "\\ud83d\\ude00" is one character).') from None


def encode(tokenizer, text: str) -> list[int]:
    """A text prompt -> ids. Whatever the tokenizer cannot encode is the prompt's fault: a UserError that
    says why, never the tokenizer's own TypeError (which, raised in a server's engine core, stopped it)."""
    try:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception as e:
        check_encodable(text)
        raise UserError(f"the tokenizer cannot encode this prompt ({type(e).__name__}: {str(e)[:200]}): check the "
                        "prompt's text, or send {\"prompt_token_ids\": [...]}.") from None


def decoder(tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True):
    """``decode(ids) -> str`` with a request's special-token options (fast tokenizers ignore the
    second): the engine's text and the server's streamed deltas both decode with it."""
    if skip_special_tokens and spaces_between_special_tokens:
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                        spaces_between_special_tokens=spaces_between_special_tokens)


def prompt_token_ids(prompt, tokenizer, V: int) -> list[int]:
    """A string (needs a tokenizer) or ``{"prompt_token_ids": [...]}`` -> checked ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise UserError("this checkpoint has no tokenizer, so a text prompt cannot be encoded: "
                            'pass {"prompt_token_ids": [...]}.')
        ids = encode(tokenizer, prompt)
    elif isinstance(prompt, dict) and set(prompt) == {"prompt_token_ids"}:
        ids = prompt["prompt_token_ids"]
    else:
        raise UserError(f'a prompt must be a string or {{"prompt_token_ids": [...]}}, got {str(prompt)[:60]!r}.')
    if not isinstance(ids, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise UserError(f"prompt_token_ids must be a list of ints, got {str(ids)[:60]!r}.")
    if len(ids) == 0:
        raise UserError("the prompt is empty: give at least one token.")
    bad = [t for t in ids if not 0 <= t < V]
    if bad:
        raise UserError(f"token ids {bad[:5]} are outside the vocabulary [0, {V}): use ids from this model's tokenizer.")
    return list(ids)
