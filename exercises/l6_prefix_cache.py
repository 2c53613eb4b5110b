"""Lesson 6, build it: find the longest cached prefix of a request.

Replace the stub below with your own ``longest_cached_prefix``, then run

    python scripts/exercise.py l6

which runs the project's tests with ``LESSONS_LEARNER=l6``: the prefix-caching KV manager then
calls your function for every request the scheduler admits (``l6_prefix_cache/kv_manager.py``,
``KVCacheManager.admit``, 6.3 of the lesson).

Contract
    hashes      list[bytes]     the request's hash chain, one per *full* block of its tokens, in order
                                (hashes[i] names tokens 0 .. (i+1)*block_size - 1)
    cached      dict            hash -> block, the blocks whose K/V are in the cache
    num_tokens  int             the request's tokens (prompt, plus outputs after a preemption)
    block_size  int
    ->          list            the cached blocks of the longest run hashes[0], hashes[1], ... that
                                are all in `cached`, in order

Two rules (6.3):
    stop at the first hash that is not cached: block i is useless without blocks 0 .. i-1;
    take at most (num_tokens - 1) // block_size blocks, so at least one token is computed and
    its logits exist. Example, block_size 8: a 32-token prompt whose 4 blocks are all cached
    takes 3 of them and computes tokens 24..31; a 33-token prompt takes all 4.
"""


def longest_cached_prefix(hashes, cached, num_tokens, block_size):
    raise NotImplementedError("longest_cached_prefix: walk hashes in order while cached.get(h) finds a block; "
                              "stop at (num_tokens - 1) // block_size blocks")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l6_prefix_cache.py::test_l6_lookup_stops_at_the_first_miss_and_leaves_a_token_to_compute",
    "tests/test_l6_engine.py::test_l6_full_prompt_hit_still_computes_the_last_block",
    "tests/test_l6_engine.py::test_l6_greedy_tokens_with_the_cache_equal_tokens_without_it",
    "tests/test_l6_fuzz.py::test_l6_fuzz_outputs_equal_solo_with_the_cache_however_chunked_or_preempted",
]
