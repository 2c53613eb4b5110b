"""Stop conditions: after each new token, has this request finished, and why?

One :class:`StopChecker` per request. After the sampler's token is appended to ``output_ids``,
``checker.update(output_ids)`` runs these checks in this order; the first that fires wins:

    gate            len(output) < min_tokens: skip 1-3 (no EOS, stop-id or stop-string stop yet)
    1. EOS          token in eos_token_ids, unless ignore_eos   -> "stop",   stop_reason None
    2. stop id      token in params.stop_token_ids              -> "stop",   stop_reason the id
    3. stop string  a params.stop string now in the text        -> "stop",   stop_reason the string
                    (the text is cut where the string starts, or where it ends with
                    include_stop_str_in_output=True)
    4. max_tokens   len(output) == max_tokens                   -> "length", stop_reason None
    5. context      len(prompt) + len(output) == max_model_len  -> "length", stop_reason None

finish_reason / stop_reason follow vLLM's RequestOutput (EOS reports stop_reason None there too).
Content stops come before budget stops: when the last token is both EOS and the max_tokens-th
token, the sequence did end naturally ("stop"), and a stop string must be cut whatever else
fired. Current vLLM (v1's ``check_stop``) orders them the same way: EOS and stop ids first, then
the length limits.

The cheap pre-check. Without stop strings, a token can end its request only if it is in
``stop_ids`` (EOS unless ignore_eos, and the stop ids) or the request (prompt + output) has
reached ``stop_len`` tokens (max_tokens, or the context). For any other token ``update()``
returns None and changes nothing, so a caller with many requests may skip it:
``token in stop_ids or len(prompt) + len(output) >= stop_len`` decides whether to ask. With stop
strings ``stop_len`` is 0: every token is asked, because the text must be decoded at every step.

Text. Stop strings live in text, not tokens, and can span tokens ("\\n" + "\\n"). Each step we
decode the whole output (``decode(ids) -> str``; simple, O(len) per step) and search only where a
match could be new: from ``start - len(s) + 1``, where ``start`` is the first character that
changed. Usually ``start = len(old text)``; it is earlier when a token completes a multi-byte
character that the previous decode showed as U+FFFD. A string completed while the min_tokens gate
was closed is therefore never found later (as in vLLM).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from plumbing.errors import UserError

from .params import SamplingParams


@dataclass
class Finish:
    finish_reason: str               # "stop" | "length"
    stop_reason: int | str | None    # the stop token id or stop string; None for EOS and length
    label: str                       # for humans: "EOS token 151645", "stop string '\\n\\n'", ...


class StopChecker:
    """Per-request stop state. ``text`` is the decoded output so far (cut at a stop string)."""

    def __init__(self, params: SamplingParams, prompt_len: int, max_model_len: int | None = None,
                 eos_token_ids: tuple[int, ...] | list[int] = (),
                 decode: Callable[[list[int]], str] | None = None):
        if params.stop and decode is None:
            raise UserError(f"stop strings {params.stop!r} need a decode(ids) -> str callable")
        self.params = params
        self.prompt_len = prompt_len
        self.max_model_len = max_model_len
        self.eos_token_ids = set(eos_token_ids)
        self.decode = decode
        self.text = ""
        self.finish: Finish | None = None
        # The pre-check (module docstring): only these tokens, or this many, can end the request.
        self.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(eos_token_ids))
        self.max_tokens = params.max_tokens                            # None: the room the context leaves
        if self.max_tokens is None:
            if max_model_len is None:
                raise UserError("SamplingParams.max_tokens=None means the room max_model_len leaves, and there is no "
                                "max_model_len here: give max_tokens a number.")
            self.max_tokens = max_model_len - prompt_len
        limit = self.max_tokens if max_model_len is None else min(self.max_tokens, max_model_len - prompt_len)
        self.max_len = prompt_len + limit                              # prompt + output: ends by length
        self.stop_len = 0 if params.stop else self.max_len

    def update(self, output_ids: list[int]) -> Finish | None:
        """Call once per new token, with all output ids so far. Returns a Finish or None."""
        if self.finish is not None:
            raise UserError(f"request already finished ({self.finish.label}); stop sampling it")
        if not output_ids:
            raise UserError("update() needs the output ids including the new token, got []")
        self.finish = self._check(output_ids)
        return self.finish

    def _check(self, output_ids: list[int]) -> Finish | None:
        p, n, token = self.params, len(output_ids), output_ids[-1]
        start = self._advance_text(output_ids)  # decode every step, even behind the gate
        if n >= p.min_tokens:
            if not p.ignore_eos and token in self.eos_token_ids:
                return Finish("stop", None, f"EOS token {token}")
            if token in p.stop_token_ids:
                return Finish("stop", token, f"stop token {token}")
            hit = self._find_stop_string(start)
            if hit is not None:
                at, s = hit                     # drop anything after the stop string, and the string
                self.text = self.text[:at + len(s) if p.include_stop_str_in_output else at]   # unless asked
                return Finish("stop", s, f"stop string {s!r}")
        if n >= self.max_tokens:
            return Finish("length", None, f"max_tokens={self.max_tokens} reached")
        if self.max_model_len is not None and self.prompt_len + n >= self.max_model_len:
            return Finish("length", None, f"context full (max_model_len={self.max_model_len})")
        return None

    def _advance_text(self, output_ids: list[int]) -> int:
        """Re-decode; return the index of the first character that differs from the old text."""
        if self.decode is None:
            return 0
        old, new = self.text, self.decode(output_ids)
        start = len(old) if new.startswith(old) else len(os.path.commonprefix([old, new]))
        self.text = new
        return start

    def _find_stop_string(self, start: int) -> tuple[int, str] | None:
        """Earliest stop string that ends in the new text; ties -> the one listed first."""
        best = None
        for s in self.params.stop:
            at = self.text.find(s, max(0, start - len(s) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        return best
