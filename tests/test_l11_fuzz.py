"""Property-based fuzz of speculative decoding in the real engine loop, with a fake model and a fake
drafter (tests/l11_fake.py): stage 5's scheduler, stage 6's prefix cache, stage 4's sampler and
stage 11's speculative step order, on workloads that share prefixes, chunk and preempt, with guesses right 0-100%
of the time. After every step the driver checks that no refused guess is read or counted as
computed, and at the end that every output equals the solo run and every block is back.

Tiers as in tests/test_l6_fuzz.py: ``make test`` runs every invariant at once on derandomized
examples and each planted bug on its pinned workload; ``make test-deep`` searches for each from
scratch.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l5_fake import breaks, finds
from l11_fake import Workload, run
from l11_spec_decode.speculator import Speculator
from l11_spec_decode.step import SpeculativeStep


@st.composite
def workloads(draw, max_requests=8):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    budget = draw(st.integers(1, 48))
    reqs = draw(st.lists(st.tuples(st.sampled_from([0, 0, 1]), st.integers(0, 60), st.integers(0, 20),
                                   st.integers(1, 30), st.integers(0, 15)), min_size=1, max_size=max_requests))
    return Workload(block_size, draw(st.integers(2, 64)), budget, draw(st.integers(1, min(budget, 6))), reqs,
                    k=draw(st.integers(1, 5)), rate=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
                    seed=draw(st.integers(0, 3)))


@pytest.mark.fuzz
@given(workloads())
def test_l11_fuzz_refused_guesses_are_never_read_or_counted_and_outputs_equal_solo(w):
    run(w)   # every invariant at once


PINNED = Workload(4, 18, 16, 3, [(0, 40, 3, 20, 0), (0, 40, 5, 12, 0), (0, 30, 0, 16, 2), (1, 20, 3, 25, 4)], k=4,
                  rate=0.6)


def test_l11_fuzz_workloads_really_accept_refuse_share_and_preempt():
    s = run(PINNED)
    assert 0 < s["accepted"] < s["drafted"] and s["hits"] > 0 and s["preemptions"] > 0, s


# ---- every invariant can fail: planted bugs --------------------------------------------------
class CountsRefusedGuesses(SpeculativeStep):   # every scheduled token's K/V counts, refused guesses included
    @staticmethod
    def computed(out, reqs, drafts, new):
        return [(req, n) for req, (_, n) in zip(reqs, out.scheduled)]


class KeepsTheRefusedGuess(Speculator):         # at a mismatch, emits the guess instead of the target's token
    def verify(self, logits, reqs, drafts, sampler, argmax=None):
        new, lps, where = super().verify(logits, reqs, drafts, sampler, argmax)
        for toks, d in zip(new, drafts):
            a = len(toks) - 1
            if a < len(d):
                toks[-1] = d[a]
        return new, lps, where


PLANTED = [
    ("no refused guess is counted as computed: num_computed_tokens <= num_tokens after every step",
     dict(step_cls=CountsRefusedGuesses)),
    ("outputs equal the solo run, however chunked, preempted, prefix-hit or speculated",
     dict(speculator_cls=KeepsTheRefusedGuess)),
]


@pytest.mark.parametrize("invariant,plant", PLANTED, ids=["counts-refused", "keeps-refused"])
def test_l11_fuzz_each_planted_bug_breaks_its_invariant_on_the_pinned_workload(invariant, plant):
    assert breaks(invariant, lambda w: run(w, **plant), PINNED)


@pytest.mark.deep
@pytest.mark.fuzz
@pytest.mark.parametrize("invariant,plant", PLANTED, ids=["counts-refused", "keeps-refused"])
def test_l11_fuzz_search_finds_each_planted_bug_from_scratch(invariant, plant):
    assert finds(invariant, lambda w: run(w, **plant), workloads())
