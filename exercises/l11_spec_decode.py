"""Lesson 11, build it: the acceptance rule of speculative sampling, for a batch of requests.

Replace the stub below with your own ``rejection_sample``, then run

    python scripts/exercise.py l11

which runs the project's tests with ``LESSONS_LEARNER=l11``: the speculator
(l11_spec_decode/speculator.py) then calls your function for every sampling request with guesses,
in the distribution test (200,000 draws against a deliberately bad draft) and in seeded runs.

Contract (R requests, k guesses each at most, V tokens)
    p       [R, k+1, V] float   the target's distribution at each verified position; position j is
                                the one after guess j (position k: after the last guess)
    drafts  [R, k] int64        the guesses
    q       [R, k, V] or None   the distributions the guesses were drawn from (None: one-hot, q(x) = 1)
    u       [R, k]              uniforms in [0, 1): keep guess j when u[r, j] < p(x) / q(x)
    e       [R, k+1, V]         Exp(1) noise: sample from weights w as argmax(w / e)
    valid   [R, k] bool or None which guesses exist (a row may have fewer than k; None: all)
    ->      (accepted, cand): accepted[r] = how many leading guesses were kept (a Python int per
            row); cand[r][j] (Python ints) = the token sampled at position j from the leftover mass
            max(0, p - q) there (p itself past the row's own guesses: the bonus). Row r then emits
            drafts[r, :accepted[r]] + [cand[r][accepted[r]]].

Watch for: a residual that is all zero (p == q at that position; use p), and rows shorter than k.
"""


def rejection_sample(p, drafts, q, u, e, valid=None):
    raise NotImplementedError("rejection_sample: keep guess x while u < p(x) / q(x); at the first refusal sample "
                              "max(0, p - q); after the last guess sample p")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l11_rejection.py::test_l11_rejection_sampling_emits_the_targets_distribution_with_a_bad_draft",
    "tests/test_l11_rejection.py::test_l11_deterministic_drafts_and_short_rows",
    "tests/test_l11_rejection.py::test_l11_speculator_sampling_rows_follow_the_processed_target",
    "tests/test_l11_spec.py::test_l11_seeded_sampling_repeats_and_logprobs_follow_the_emitted_tokens",
]
