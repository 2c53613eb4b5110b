"""Per-request sampling parameters, with vLLM's names, ranges and meanings.

A request carries one :class:`SamplingParams`. Every field is checked when the object is built
(``__post_init__``), so a bad value fails at the API boundary with a :class:`UserError` that
names the field, its valid range and the value given, never later as a NaN inside a kernel.

    field               valid             off / default   meaning
    temperature         >= 0              1.0             0 (below 1e-5) = greedy
    top_k               -1, 0 or >= 1     0               keep the k most likely tokens
    top_p               (0, 1]            1.0             keep the smallest set with mass >= top_p
    min_p               [0, 1]            0.0             keep tokens with p >= min_p * p_max
    repetition_penalty  > 0               1.0             prompt+output tokens: z>0 -> z/r, else z*r
    presence_penalty    [-2, 2]           0.0             output tokens: z -= presence * (count > 0)
    frequency_penalty   [-2, 2]           0.0             output tokens: z -= frequency * count
    seed                int or None       None            per-request reproducible noise
    max_tokens          None or >= 1      16              output budget (None: the room max_model_len leaves)
    min_tokens          [0, max_tokens]   0               no EOS/stop before this many tokens
    stop_token_ids      list[int >= 0]    []  (None: [])  stop when one is sampled
    stop                str or list[str]  []  (None: [])  stop strings (cut from the text)
    ignore_eos          bool              False           keep going past EOS
    logprobs            None, -1 or >= 0  None            top-n raw logprobs (+ the sampled one); -1: all V
    prompt_logprobs     None, -1 or >= 0  None            the same for every prompt token after the first
    include_stop_str_in_output  bool      False           keep the stop string at the end of the text
    n                   int >= 1          1               completions per prompt (an engine that batches)

Logit processors (processors.py; the engine checks the ids against the vocabulary):

    logit_bias          {token id: bias}  None            added to that token's logit
    allowed_token_ids   non-empty list    None            every other token is banned
    bad_words           list[str]         None (= [])     a word's tokens may not be completed

Text and prompt (the engine applies them):

    detokenize          bool              True            False: CompletionOutput.text is "" (no stop strings)
    skip_special_tokens bool              True            leave special tokens out of the text
    spaces_between_special_tokens  bool   True            (a slow tokenizer's decode option)
    truncate_prompt_tokens  None, -1, >= 1  None          keep the prompt's last k tokens (-1: max_model_len)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from plumbing.errors import UserError

#: A temperature below this is treated as greedy (vLLM's ``_SAMPLING_EPS``): dividing logits by
#: 1e-6 only pushes float32 softmax to a one-hot anyway, with overflow risk on the way.
GREEDY_EPS = 1e-5


def _fail(name: str, valid: str, value) -> UserError:
    return UserError(f"SamplingParams.{name} must be {valid}, got {value!r}")


def _number(name: str, value, valid: str) -> float:
    """An int or float (not a bool, not NaN/inf), returned as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(name, valid, value)
    return float(value)


def _integer(name: str, value, valid: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, valid, value)
    return value


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: list[int] | None = field(default_factory=list)
    stop: list[str] | str | None = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        # Each check reads "valid range" in words, then tests the value against exactly that.
        # Comparisons are written so that NaN fails them (NaN is already refused by _number).
        self._check_sampling()
        self._check_stopping()
        self._check_processors()
        self._check_text()

    def _check_sampling(self) -> None:
        """The fields that shape the distribution: temperature, truncation, penalties, seed."""
        v = "a number >= 0 (0 = greedy)"
        self.temperature = _number("temperature", self.temperature, v)
        if not self.temperature >= 0:
            raise _fail("temperature", v, self.temperature)

        v = "an int: -1 or 0 (off) or >= 1"
        if not _integer("top_k", self.top_k, v) >= -1:
            raise _fail("top_k", v, self.top_k)

        v = "a number in (0, 1] (1 = off)"
        self.top_p = _number("top_p", self.top_p, v)
        if not 0 < self.top_p <= 1:
            raise _fail("top_p", v, self.top_p)

        v = "a number in [0, 1] (0 = off)"
        self.min_p = _number("min_p", self.min_p, v)
        if not 0 <= self.min_p <= 1:
            raise _fail("min_p", v, self.min_p)

        v = "a number > 0 (1 = off)"
        self.repetition_penalty = _number("repetition_penalty", self.repetition_penalty, v)
        if not self.repetition_penalty > 0:
            raise _fail("repetition_penalty", v, self.repetition_penalty)

        for name in ("presence_penalty", "frequency_penalty"):
            v = "a number in [-2, 2] (0 = off)"
            value = _number(name, getattr(self, name), v)
            if not -2 <= value <= 2:
                raise _fail(name, v, value)
            setattr(self, name, value)

        if self.seed is not None:
            _integer("seed", self.seed, "an int or None")

    def _check_stopping(self) -> None:
        """The fields that end a request, and what it returns: lengths, stops, logprobs."""
        v = "None (the room max_model_len leaves) or an int >= 1"
        if self.max_tokens is not None and not _integer("max_tokens", self.max_tokens, v) >= 1:
            raise _fail("max_tokens", v, self.max_tokens)

        top = "" if self.max_tokens is None else f", max_tokens={self.max_tokens}"
        v = f"an int in [0{top}]"
        if not 0 <= _integer("min_tokens", self.min_tokens, v) <= (self.max_tokens or self.min_tokens):
            raise _fail("min_tokens", v, self.min_tokens)

        v = "None or a list of token ids (ints >= 0)"
        ids = [] if self.stop_token_ids is None else self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or any(
                isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            raise _fail("stop_token_ids", v, ids)
        self.stop_token_ids = list(ids)

        v = "None, a non-empty string or a list of non-empty strings"
        stop = [self.stop] if isinstance(self.stop, str) else [] if self.stop is None else self.stop
        if not isinstance(stop, (list, tuple)) or any(
                not isinstance(s, str) or s == "" for s in stop):
            raise _fail("stop", v, self.stop)
        self.stop = list(stop)

        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, "a bool", getattr(self, name))

        for name in ("logprobs", "prompt_logprobs"):
            v, value = "None, -1 (the whole vocabulary) or an int >= 0", getattr(self, name)
            if value is not None and not _integer(name, value, v) >= -1:
                raise _fail(name, v, value)

        v = "an int >= 1"
        if not _integer("n", self.n, v) >= 1:
            raise _fail("n", v, self.n)

    def _check_processors(self) -> None:
        """logit_bias, allowed_token_ids, bad_words (their ids are checked against V by the engine)."""
        bias = self.logit_bias
        if bias is not None:
            v = "None or a dict {token id (an int >= 0, or its digits as a str): a finite number}"
            if not isinstance(bias, dict):
                raise _fail("logit_bias", v, bias)
            out = {}
            for k, b in bias.items():
                tid = int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k   # JSON keys are strings
                if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                    raise _fail("logit_bias", v + f"; key {k!r} is not a token id", bias)
                if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b):
                    raise _fail("logit_bias", v + f"; the bias of {k!r} is not a finite number", bias)
                out[tid] = float(b)
            self.logit_bias = out or None
        v = "None or a non-empty list of token ids (ints >= 0)"
        ids = self.allowed_token_ids
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not ids or any(
                    isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                raise _fail("allowed_token_ids", v, ids)
            self.allowed_token_ids = list(ids)
        v = "None or a list of non-empty strings"
        words = [] if self.bad_words is None else self.bad_words
        if not isinstance(words, (list, tuple)) or any(not isinstance(w, str) or w.strip() == "" for w in words):
            raise _fail("bad_words", v, self.bad_words)
        self.bad_words = list(dict.fromkeys(words))

    def _check_text(self) -> None:
        """detokenize, the special-token options, truncate_prompt_tokens."""
        for name in ("detokenize", "skip_special_tokens", "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, "a bool", getattr(self, name))
        if self.stop and not self.detokenize:
            raise UserError(f"SamplingParams.stop {self.stop!r} needs the text, and detokenize=False leaves it out: "
                            "set detokenize=True, or stop on token ids (stop_token_ids).")
        v = "None, -1 (max_model_len) or an int >= 1"
        k = self.truncate_prompt_tokens
        if k is not None and (_integer("truncate_prompt_tokens", k, v) == 0 or k < -1):
            raise _fail("truncate_prompt_tokens", v, k)

    @property
    def has_processors(self) -> bool:
        """Does a logit processor (bias, allowed ids, bad words) change this row's logits?"""
        return bool(self.logit_bias or self.allowed_token_ids or self.bad_words)

    @property
    def greedy(self) -> bool:
        """True when the answer is argmax of the penalised logits: temperature ~0, or top_k == 1."""
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
