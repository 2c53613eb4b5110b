"""Lesson 2, build it: the slot formula.

Replace the stub below with your own ``slot_index``, then run

    python scripts/exercise.py l2

which runs the project's tests with ``LESSONS_LEARNER=l2``: they ask your function for every
position directly, then the block allocator calls it for the first slot of every block it reserves
(``l2_gather/allocator.py``, ``add_blocks``: a block's slots are consecutive), and the pool writes
and gathers K/V at the slots it returns.

Contract
    blocks      list[int]   the request's physical block ids, in logical order
    block_size  int         tokens per block (any positive integer: the tests use 1, 5, 12, 16)
    i           int         a logical position of the request, 0 <= i < len(blocks) * block_size
    ->          int         the flat slot of position i in the pool: row i of the request lives
                            in physical block blocks[...] at some offset inside it

Worked example (lesson 2.2): block_size 4, blocks [7, 2, 5]; positions 0..9 map to
28 29 30 31 | 8 9 10 11 | 20 21.
"""


def slot_index(blocks: list[int], block_size: int, i: int) -> int:
    raise NotImplementedError("slot_index: which logical block holds position i, which physical block is that, and where inside it?")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l2_gather.py::test_slot_index_at_every_position",
    "tests/test_l2_gather.py::test_slot_indices_follow_block_list",
    "tests/test_l2_gather.py::test_random_interleaved_reserve_free_never_shares_a_slot_and_never_leaks",
    "tests/test_l2_gather.py::test_l2_gather_tokens_match_l1_dense_with_scattered_blocks",
]
