"""Lesson 7, build it: the batch sizes the runner captures CUDA graphs for.

Replace the stub below with your own ``graph_buckets``, then run

    python scripts/exercise.py l7

which runs the project's tests with ``LESSONS_LEARNER=l7``: the fast runner then captures one
graph per size your function returns (``l7_fast/runner.py``, ``FastRunner.__init__``; the lesson's
chapter: lessons/l7_fast/3_inputs_and_graphs.md), and every decode step of n requests replays the
smallest bucket >= n.

Contract
    max_num_seqs  int >= 1      the most requests that can run in one step
    ->            list[int]     strictly increasing, first 1, last max_num_seqs:
                                1, 2, 4, 8 (those below max_num_seqs), then every multiple of 16
                                below max_num_seqs, then max_num_seqs itself

Examples: 256 -> [1, 2, 4, 8, 16, 32, ..., 240, 256] (20 sizes); 40 -> [1, 2, 4, 8, 16, 32, 40];
6 -> [1, 2, 4, 6]; 1 -> [1]. Why these: small batches are where padding costs the most (a step of
3 replays 4 rows), and past 16 a padded row costs little next to the weights every step reads.
"""


def graph_buckets(max_num_seqs):
    raise NotImplementedError("graph_buckets: [1, 2, 4, 8] below max_num_seqs, then multiples of 16 below it, "
                              "then max_num_seqs")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l7_engine.py::test_graph_buckets",
    "tests/test_l7_engine.py::test_l7_tokens_equal_stage6_through_preemption_hits_and_chunks",
    "tests/test_l7_engine.py::test_l7_padding_rows_touch_only_the_pad_block",
]
