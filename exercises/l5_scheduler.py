"""Lesson 5, build it: reserve blocks, or preempt until they fit.

Replace the stub below with your own ``reserve_or_preempt``, then run

    python scripts/exercise.py l5

which runs the project's tests with ``LESSONS_LEARNER=l5``: the scheduler then calls your
function whenever a running request's blocks cannot hold its next tokens
(``l5_scheduler/scheduler.py``: ``Scheduler._schedule_running`` through ``_reserve_or_preempt``,
step 1 of 5.3).

Contract
    alloc     BlockManager     the scheduler's KV manager (stage 2's BlockAllocator underneath);
                               alloc.reserve(req.kv, n_tokens) grows req's blocks to hold n_tokens
                               tokens, or raises OutOfBlocks and takes nothing
    running   list[Request]    the running requests in admission order (the last is the youngest)
    req       Request          the request being served; it is in `running`
    n         int              its new tokens this step (1 for a decode, a chunk for a prefill)
    preempt   callable         preempt(victim): frees the victim's blocks and requeues it; the
                               victim must already be off `running`
    ->        bool             True when req now has blocks for req.num_computed_tokens + n
                               tokens; False when req itself had to be preempted

The rule (5.5): while the pool is short, the most recently admitted running request goes,
even if that is req itself. Never an older one: the oldest request must always progress.
"""


def reserve_or_preempt(alloc, running, req, n, preempt):
    raise NotImplementedError("reserve_or_preempt: try alloc.reserve; on OutOfBlocks pop the youngest, preempt it, retry")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l5_scheduler.py::test_l5_one_budget_decodes_first_then_chunks_of_new_prompts",
    "tests/test_l5_scheduler.py::test_l5_preemption_takes_the_most_recent_and_sends_it_to_the_front",
    "tests/test_l5_scheduler.py::test_l5_the_youngest_request_preempts_itself_when_nothing_younger_is_left",
    "tests/test_l5_fuzz.py::test_l5_fuzz_free_plus_owned_equals_total",
    "tests/test_l5_fuzz.py::test_l5_fuzz_outputs_equal_solo_however_chunked_or_preempted",
]
