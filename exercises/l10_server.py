"""Lesson 10, build it: one step of incremental detokenization.

Replace the stub below with your own ``decode_step``, then run

    python scripts/exercise.py l10

which runs the project's tests with ``LESSONS_LEARNER=l10``: the server's IncrementalDetokenizer
(l10_server/detok.py) then calls your function every time a request gains tokens, in the
detokenizer's property test and in a served stream with stop strings and multi-byte text.

Contract
    decode  ids -> str (the tokenizer's decode, special tokens skipped)
    ids     all of the request's output ids so far (the new ones at the end)
    prefix, read   ids[prefix:read] were decoded before and serve as context; ids[read:] are new
    ->      (new_text, prefix', read')

Decode ids[prefix:read] and ids[prefix:]. If the second is longer and does not end in "\\ufffd"
(U+FFFD: bytes of a character still missing), the new text is what it adds, and the offsets move
to (read, len(ids)). Otherwise return ("", prefix, read): wait for more ids. Example with a
byte-level tokenizer where "é" is two tokens [195, 169]:
    decode_step(decode, [97, 195], 0, 1)       -> ("", 0, 1)          "a\\ufffd": wait
    decode_step(decode, [97, 195, 169], 0, 1)  -> ("é", 1, 3)
"""


def decode_step(decode, ids, prefix, read):
    raise NotImplementedError("decode_step: decode ids[prefix:read] and ids[prefix:]; the difference is new text "
                              "unless it ends in U+FFFD")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l10_detok.py",
    "tests/test_l10_server.py::test_stop_strings_and_utf8_streamed_text_equals_whole_text",
]
