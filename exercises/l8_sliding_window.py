"""Lesson 8, build it: which blocks a sliding window will never read again.

Replace the stub below with your own ``dead_blocks``, then run

    python scripts/exercise.py l8

which runs the project's tests with ``LESSONS_LEARNER=l8``: stage 8's KV manager then calls your
function after every step of every windowed group (``l8_sliding_window/group_managers.py``,
``remove_skipped_blocks``, which frees the blocks you call dead) and at every prefix-cache lookup
(``first_needed``: the blocks below are not taken).

Contract
    cur_len     int     tokens whose K/V are cached; the next query sits at position cur_len
    window      int     W >= 1: the query at position p sees keys p - W < j <= p (W keys, itself included)
    block_size  int
    ->          int     how many leading blocks (0, 1, ...) no query at position >= cur_len reads

Block i holds keys i * block_size .. (i + 1) * block_size - 1; it is dead when even its last key is
out of the window of the query at cur_len. Examples, block_size 16, W 20:
    cur_len 53 -> 2    the query at 53 sees 34..53: blocks 0 (0..15) and 1 (16..31) are dead
    cur_len 51 -> 2    it sees 32..51: key 31, block 1's last, just left the window
    cur_len 50 -> 1    it sees 31..50: block 1 is still read
    cur_len 10 -> 0
"""


def dead_blocks(cur_len, window, block_size):
    raise NotImplementedError("dead_blocks: the query at cur_len sees keys > cur_len - window; count the leading "
                              "blocks whose last key is not among them")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l8_fuzz.py::test_l8_dead_blocks_examples",
    "tests/test_l8_fuzz.py::test_l8_fuzz_windows_free_blocks_never_read_and_outputs_equal_solo",
    "tests/test_l8_fuzz.py::test_l8_fuzz_workloads_really_free_share_and_preempt",
    "tests/test_l8_engine.py::test_l8_a_windowed_group_holds_at_most_the_window_plus_one_block",
]
