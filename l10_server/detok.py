"""Text deltas for a stream: each step's new token ids in, the text that may be sent now out.

Two things must never reach a client, because nothing sent can be taken back:

* **half a character.** A byte-level tokenizer splits a multi-byte UTF-8 character over tokens;
  decoding a prefix that ends inside one gives U+FFFD. The decoder keeps two offsets into the ids
  (the Hugging Face / vLLM "prefix" and "read" offsets) and only accepts new text once it no longer
  ends in U+FFFD, so each step decodes a few tokens, not the whole output:

      ids      ... | prefix ........ read | new ids
      text     decode(ids[prefix:]) minus decode(ids[prefix:read]) = the new characters

* **a stop string's first characters.** With ``stop=["\\n\\n"]`` a "\\n" may be the start of a
  stop string that the next token completes, and the engine then cuts it from the text. So while
  the request runs, the last ``max(len(s)) - 1`` characters are held back (none with
  ``include_stop_str_in_output``). When it finishes, the engine's text (stage 4's StopChecker: cut
  at the stop string) is the truth, and the last delta is what of it was not sent yet.

The invariant, tested: the deltas concatenated equal the non-streamed text, for every request.
"""
from __future__ import annotations

from plumbing.exercise import learner_can_replace


@learner_can_replace  # lesson 10's build-it exercise: exercises/l10_server.py
def decode_step(decode, ids: list[int], prefix: int, read: int) -> tuple[str, int, int]:
    """The whole characters that the ids past ``read`` add, and the new offsets: decode the ids from
    ``prefix`` with and without the new ones (the earlier ids are context: a byte-level tokenizer
    decodes a token differently at a word start); the difference is new text, unless it ends in
    U+FFFD (a character not complete yet): then nothing, offsets unchanged, and the next call tries
    again with more ids. On success the old ``read`` becomes the new ``prefix``."""
    before = decode(ids[prefix:read])
    after = decode(ids[prefix:])
    if len(after) > len(before) and not after.endswith("\ufffd"):
        return after[len(before):], read, len(ids)
    return "", prefix, read


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop=(), include_stop_str_in_output: bool = False, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        # the engine's decoder, so that the deltas add up to its text; imported here, since importing
        # l10_server must not load torch (the CLI checks its flags first)
        from l5_scheduler.request import decoder
        self._decode = decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self.ids: list[int] = []
        self.prefix = self.read = 0           # ids[prefix:read] were decoded already, as context
        self.text = ""                        # whole characters decoded so far
        self.sent = 0                         # characters of the text already sent
        self.hold = 0 if include_stop_str_in_output or not stop else max(len(s) for s in stop) - 1

    def add(self, new_ids: list[int]) -> None:
        """New token ids of the request (one step's)."""
        self.ids += new_ids
        new, self.prefix, self.read = decode_step(self._decode, self.ids, self.prefix, self.read)
        self.text += new

    def delta(self, final_text: str | None = None) -> str:
        """The text to send now. ``final_text``: the request finished and this is its whole text
        (the engine's ``CompletionOutput.text``): send the rest of it."""
        if final_text is not None:
            if not final_text.startswith(self.text[:self.sent]):
                raise RuntimeError(f"sent {self.text[:self.sent]!r}, but the final text is {final_text!r}: "
                                   "text went out that the engine later removed (a bug)")
            out, self.sent = final_text[self.sent:], len(final_text)
            return out
        ready = len(self.text) - self.hold
        if ready <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:ready], ready
        return out
