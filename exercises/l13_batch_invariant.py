"""Lesson 13, build it: how many programs a decode step's attention runs per sequence.

Replace the stub below with your own ``splits_for``, then run

    python scripts/exercise.py l13

which runs the project's tests with ``LESSONS_LEARNER=l13``: batch-invariant attention
(l13_batch_invariant/attention.py) then plans each decode step's launch with your function, and the
tests compare a query's row from that launch with the fold launch's, bit for bit.

The cut points of a sequence's keys are fixed: multiples of ``split_keys`` (positions, never a count
chosen from the batch, lesson 13.2). What the host still chooses is the launch: one program per
sequence and KV head that walks every split (the fold), or one program per split and a merge that
folds them in the same order (the split launch), for decode steps too small to fill the GPU. Both
give the same bits, as long as the split launch has a program for every split of the longest
sequence.

Contract
    num_seqs      int   sequences in the decode step
    num_kv_heads  int   KV heads (programs per sequence in the fold launch)
    max_kv_len    int   keys of the longest sequence
    num_sms       int   the GPU's SMs (16 under the interpreter)
    split_keys    int   keys per split (the cut points' spacing)
    ->            int   1 for the fold launch, else programs per sequence: at least
                        cdiv(max_kv_len, split_keys), at most 65535
The reference splits when the fold grid (num_seqs x num_kv_heads programs) leaves SMs idle.
Example: splits_for(1, 2, 200, 16, 64) -> 4; splits_for(8, 2, 200, 16, 64) -> 1.
"""


def splits_for(num_seqs, num_kv_heads, max_kv_len, num_sms, split_keys=256):
    raise NotImplementedError("splits_for: 1 when the fold launch fills the SMs, else a program for every split of "
                              "the longest sequence")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l13_invariance.py::test_l13_a_split_launch_splits_for_plans_gives_the_fold_launchs_bits",
]
