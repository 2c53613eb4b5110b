"""Stage 4 stop conditions: each one fires, in the documented order, with vLLM's
finish_reason / stop_reason, and stop strings are found across token boundaries and cut."""
import pytest
import torch

from plumbing.errors import UserError
from l4_sampler import RowState, Sampler, SamplingParams, StopChecker

VOCAB = ["<eos>", "a", "b", "c", "d", "He", "l", "lo", " wor", "ld", "\n", "abcd"]
EOS = 0


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def run(tokens, prompt_len=3, max_model_len=None, **kw):
    """Feed tokens one at a time; return (number of tokens taken, Finish or None, text)."""
    checker = StopChecker(SamplingParams(**kw), prompt_len, max_model_len, (EOS,), decode)
    out = []
    for t in tokens:
        out.append(t)
        finish = checker.update(out)
        if finish:
            return len(out), finish, checker.text
    return len(out), None, checker.text


def reasons(finish):
    return finish.finish_reason, finish.stop_reason


# ---- each condition fires -----------------------------------------------------------------------
def test_eos_stops_with_stop_reason_none():
    n, f, text = run([1, 2, EOS, 3])
    assert (n, reasons(f), text) == (3, ("stop", None), "ab<eos>")
    assert "EOS" in f.label


def test_ignore_eos_runs_past_eos_to_max_tokens():
    n, f, _ = run([1, EOS, 2, EOS, 3], ignore_eos=True, max_tokens=4)
    assert (n, reasons(f)) == (4, ("length", None))


def test_stop_token_id_reports_the_id():
    n, f, _ = run([1, 2, 3, 4], stop_token_ids=[3])
    assert (n, reasons(f)) == (3, ("stop", 3))


def test_max_tokens_is_length():
    n, f, _ = run([1] * 10, max_tokens=5)
    assert (n, reasons(f)) == (5, ("length", None)) and "max_tokens" in f.label


def test_context_limit_is_length():
    n, f, _ = run([1] * 10, prompt_len=6, max_model_len=10)   # 6 + 4 == 10
    assert (n, reasons(f)) == (4, ("length", None)) and "max_model_len" in f.label


def test_stop_string_spanning_tokens_is_cut():
    # "He" "l" "lo" " wor" "ld": text "Hello world"; "lo w" starts in token 3, ends in token 4
    n, f, text = run([5, 6, 7, 8, 9], stop=["lo w"])
    assert (n, reasons(f), text) == (4, ("stop", "lo w"), "Hel")


def test_single_stop_string_and_earliest_match_wins():
    n, f, text = run([10, 10, 1], stop="\n\n")              # a str is a list of one
    assert (n, reasons(f), text) == (2, ("stop", "\n\n"), "")
    # one token "abcd" holds "cd" at 2 and "bc" at 1: the earliest wins, whatever the list order
    _, f, text = run([11], stop=["cd", "bc"])
    assert (reasons(f), text) == (("stop", "bc"), "a")


def test_stop_string_across_a_multibyte_character():
    # bytes decoded with errors="replace": the first half of "é" shows as U+FFFD, then changes
    pieces = [b"x", b"\xc3", b"\xa9!"]

    def dec(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    checker = StopChecker(SamplingParams(stop=["é"]), 1, None, (), dec)
    assert checker.update([0]) is None and checker.update([0, 1]) is None
    assert checker.text == "x\ufffd"
    # "é" sits at index 1, before the old text's end: found only because the search restarts
    # at the first changed character, not at len(old text)
    assert reasons(checker.update([0, 1, 2])) == ("stop", "é") and checker.text == "x"


# ---- order --------------------------------------------------------------------------------------
def test_eos_that_is_also_a_stop_id_reports_eos():
    _, f, _ = run([1, EOS], stop_token_ids=[EOS])
    assert reasons(f) == ("stop", None)


def test_stop_beats_length_on_the_same_token():
    assert reasons(run([1, EOS], max_tokens=2)[1]) == ("stop", None)
    assert reasons(run([1, 3], max_tokens=2, stop_token_ids=[3])[1]) == ("stop", 3)
    _, f, text = run([1, 2], max_tokens=2, stop="b")
    assert (reasons(f), text) == (("stop", "b"), "a")     # and the text is still cut


def test_stop_id_beats_stop_string_on_the_same_token():
    _, f, _ = run([1, 2], stop_token_ids=[2], stop="ab")
    assert reasons(f) == ("stop", 2)


# ---- min_tokens holds every stop back, but not the budget ---------------------------------------
def test_min_tokens_holds_back_eos_stop_ids_and_stop_strings():
    n, f, _ = run([EOS, 3, 1, 2, EOS], min_tokens=4, stop_token_ids=[3], stop="ab")
    # EOS at 1, stop id at 2, "ab" completed at 4 (>= min_tokens: fires)
    assert (n, reasons(f)) == (4, ("stop", "ab"))
    n, f, _ = run([EOS, 3, EOS], min_tokens=3, stop_token_ids=[3])
    assert (n, reasons(f)) == (3, ("stop", None))


def test_stop_string_completed_behind_the_gate_is_not_found_later():
    n, f, text = run([1, 2, 3, 4], min_tokens=3, stop="ab")   # "ab" done at token 2
    assert (n, f, text) == (4, None, "abcd")


def test_min_tokens_does_not_block_max_tokens_or_context():
    n, f, _ = run([EOS, EOS, 1, 1], min_tokens=3, max_tokens=3)   # EOS held back twice
    assert (n, reasons(f)) == (3, ("length", None))
    n, f, _ = run([1] * 10, prompt_len=8, max_model_len=10, min_tokens=5)
    assert (n, reasons(f)) == (2, ("length", None))


# ---- misuse -------------------------------------------------------------------------------------
def test_misuse_rejected():
    with pytest.raises(UserError, match="decode"):
        StopChecker(SamplingParams(stop="x"), 3)
    checker = StopChecker(SamplingParams(max_tokens=1), 3)
    checker.update([1])
    with pytest.raises(UserError, match="already finished"):
        checker.update([1, 2])


# ---- the generate-loop contract (the usage example of the report) -------------------------------
def test_two_rows_different_params_sample_then_check_stops():
    V, eos = len(VOCAB), (EOS,)
    logits = torch.full((2, V), -5.0)
    logits[:, 3] = 5.0                                     # both rows want "c"
    reqs = [RowState(SamplingParams(temperature=0, stop_token_ids=[3]), [1, 2], [], eos),
            RowState(SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=1),
                     [4], [], eos)]
    checkers = [StopChecker(r.params, len(r.prompt_ids), 4096, eos, decode) for r in reqs]
    out = Sampler(seed=0)(logits, reqs)
    for r, c, t in zip(reqs, checkers, out.token_ids_list):
        r.output_ids.append(t)
    finishes = [c.update(r.output_ids) for r, c in zip(reqs, checkers)]
    assert out.token_ids_list == [3, 3]
    assert [reasons(f) for f in finishes] == [("stop", 3), ("length", None)]
