"""Stage 5 scheduler, scenario by scenario (no model): budget, chunking, admission, preemption."""
import pytest

from l2_gather.allocator import OutOfBlocks
from l4_sampler.params import SamplingParams
from l5_scheduler.kv_manager import BlockManager
from l5_scheduler.request import Request, RequestStatus
from l5_scheduler.scheduler import Scheduler


def _req(name, prompt_len, max_tokens=8, arrival=0):
    return Request(name, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens), arrival)


def _step(sched, sampled=7):
    """schedule, pretend the forward ran, append a token to every row that samples."""
    out = sched.schedule()
    sched.advance(out)
    for (req, _), s in zip(out.scheduled, out.sample):
        if s:
            req.append_output(sampled)
    return out


def _plan(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_l5_one_budget_decodes_first_then_chunks_of_new_prompts():
    s = Scheduler(BlockManager(64, 4), max_num_batched_tokens=10, max_num_seqs=8)
    a, b, c = _req("a", 3), _req("b", 12), _req("c", 5)
    for r in (a, b, c):
        s.add(r)
    out = _step(s)
    assert _plan(out) == [("a", 3), ("b", 7)] and out.sample == [True, False]   # b chunked: 7 of 12
    assert out.prefill == [True, True] and [r.request_id for r in out.admitted] == ["a", "b"]
    out = _step(s)
    assert _plan(out) == [("a", 1), ("b", 5), ("c", 4)]      # a decodes, b finishes its prompt, c starts
    assert out.sample == [True, True, False] and out.prefill == [False, True, True]
    out = _step(s)
    assert _plan(out) == [("a", 1), ("b", 1), ("c", 1)] and out.sample == [True, True, True]


def test_l5_several_requests_can_be_mid_prefill_at_once():
    s = Scheduler(BlockManager(64, 4), max_num_batched_tokens=8, max_num_seqs=8)
    a, b = _req("a", 20), _req("b", 20)
    s.add(a)
    s.add(b)
    assert _plan(_step(s)) == [("a", 8)]
    s.max_num_batched_tokens = 16
    out = _step(s)
    assert _plan(out) == [("a", 12), ("b", 4)] and out.sample == [True, False]
    s.max_num_batched_tokens = 6
    assert _plan(_step(s)) == [("a", 1), ("b", 5)]            # b is mid-prefill while a decodes


def test_l5_max_num_seqs_caps_running_and_admission_is_first_come_first_served():
    s = Scheduler(BlockManager(64, 4), max_num_batched_tokens=100, max_num_seqs=2)
    reqs = [_req(n, 2, max_tokens=1, arrival=i) for i, n in enumerate("abc")]
    for r in reqs:
        s.add(r)
    out = _step(s)
    assert [r.request_id for r in out.admitted] == ["a", "b"] and len(s.waiting) == 1
    for r in list(s.running):
        s.finish(r, "length")
    assert [r.request_id for r in _step(s).admitted] == ["c"]


def test_l5_preemption_takes_the_most_recent_and_sends_it_to_the_front():
    # 6 blocks of 2 tokens. a (3 tokens) and b (5 tokens) fill 2 + 3 blocks; c waits.
    s = Scheduler(BlockManager(6, 2), max_num_batched_tokens=16, max_num_seqs=4)
    a, b, c = (_req("a", 3, 4, arrival=0), _req("b", 5, 4, arrival=1), _req("c", 2, 4, arrival=2))
    for r in (a, b, c):
        s.add(r)
    out = _step(s)
    assert _plan(out) == [("a", 3), ("b", 5), ("c", 2)] and s.kv.num_free == 0
    out = _step(s)     # a's 4th token fits its 2nd block; b's 6th too; c needs a 2nd block: none free
    assert [r.request_id for r in out.preempted] == ["c"] and _plan(out) == [("a", 1), ("b", 1)]
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 0 and c.blocks == []
    assert c.num_preemptions == 1 and list(s.waiting) == [c] and c.output_ids == [7]
    d = _req("d", 1, 4, arrival=3)
    s.add(d)
    out = _step(s)     # a needs a 3rd block: b (most recent running) is preempted; no admission
    assert [r.request_id for r in out.preempted] == ["b"] and _plan(out) == [("a", 1)]
    assert out.admitted == [] and [r.request_id for r in s.waiting] == ["b", "c", "d"]


def test_l5_the_youngest_request_preempts_itself_when_nothing_younger_is_left():
    s = Scheduler(BlockManager(4, 2), max_num_batched_tokens=8, max_num_seqs=2)
    a, b = _req("a", 3, 4, arrival=0), _req("b", 4, 4, arrival=1)
    s.add(a)
    s.add(b)
    _step(s)                                              # 2 + 2 blocks: pool full
    out = s.schedule()                                    # a's decode fits its block; b needs a 3rd
    assert _plan(out) == [("a", 1)] and out.preempted == [b] and list(s.waiting) == [b]


def test_l5_recompute_after_preemption_feeds_prompt_plus_outputs_then_samples_once():
    s = Scheduler(BlockManager(64, 4), max_num_batched_tokens=4, max_num_seqs=2)
    a = _req("a", 6)
    s.add(a)
    _step(s), _step(s)                                    # 4 + 2 prompt tokens, then sample
    _step(s)                                              # decode: a has 2 outputs now
    assert a.output_ids == [7, 7] and a.num_computed_tokens == 7
    s.running.remove(a)
    s._preempt(a)
    assert a.num_computed_tokens == 0 and a.num_tokens == 8
    out = _step(s)
    assert _plan(out) == [("a", 4)] and out.sample == [False] and out.prefill == [True]
    assert a.tokens(0, 4) == [1, 2, 3, 4]
    out = _step(s)
    assert _plan(out) == [("a", 4)] and out.sample == [True]  # 8 tokens recomputed: sample the 3rd output
    assert a.tokens(4, 4) == [5, 6, 7, 7] and a.output_ids == [7, 7, 7]


def test_l5_a_request_larger_than_the_pool_is_rejected_at_add():
    s = Scheduler(BlockManager(4, 4), max_num_batched_tokens=8, max_num_seqs=2)
    with pytest.raises(OutOfBlocks, match=r"= 17 tokens exceeds the whole KV pool of 16 tokens"):
        s.add(_req("big", 9, max_tokens=8))
    s.add(_req("ok", 8, max_tokens=8))
    assert len(s.waiting) == 1


def test_l5_tokens_slices_prompt_and_output_without_concatenating():
    r = _req("a", 5)
    for t in (10, 11, 12):
        r.append_output(t)
    whole = r.prompt_ids + r.output_ids
    for start in range(8):
        for n in range(0, 9 - start):
            assert r.tokens(start, n) == whole[start:start + n], (start, n)
