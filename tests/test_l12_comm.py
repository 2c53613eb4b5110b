"""Stage 12's step transport, without processes: the structure/tensor split of a step's inputs
(comm.py) gives back the same tensors, bit for bit, and the graph runner across ranks (graphs.py)
numbers its graphs as the workers do and announces each replay before it happens."""
from dataclasses import dataclass, field

import pytest
import torch

from l12_tensor_parallel.comm import ALIGN, flatten, pack, unpack
from l12_tensor_parallel.graphs import GraphsAcrossRanks


@dataclass
class Meta:                                   # shaped like stage 8's GroupMeta: tensors, lists of them, ints
    positions: torch.Tensor
    table: torch.Tensor
    slots: list = field(default_factory=list)
    max_seqlen_kv: int = 0
    pdl: bool = False


def test_a_step_split_into_structure_and_one_buffer_comes_back_bit_for_bit():
    ids = torch.tensor([3, 1 << 40, -7])
    m = Meta(positions=torch.arange(5), table=torch.arange(12, dtype=torch.int32).view(3, 4),
             slots=[ids, torch.empty(0, dtype=torch.int64), torch.tensor([0.5, -2.0], dtype=torch.bfloat16)],
             max_seqlen_kv=17, pdl=True)
    head, tensors, nbytes = pack(ids, m, torch.tensor(True))
    assert len(tensors) == 6 and nbytes % ALIGN == 0          # ids once, though it appears twice
    flat = flatten(tensors, nbytes, "cpu")
    got_ids, got, flag = unpack(head, flat.clone())          # (a copy: as the broadcast delivers it)
    assert got_ids.tolist() == ids.tolist() == got.slots[0].tolist()
    assert torch.equal(got.table, m.table) and got.table.dtype == torch.int32 and got.table.shape == (3, 4)
    assert torch.equal(got.positions, m.positions) and got.slots[1].numel() == 0
    assert got.slots[2].view(torch.int16).tolist() == m.slots[2].view(torch.int16).tolist()
    assert (got.max_seqlen_kv, got.pdl, bool(flag)) == (17, True, True)
    assert all(t.data_ptr() % ALIGN == 0 for t in (got.positions, got.table, got.slots[2]))


class FakeGroup:
    def __init__(self, captured):
        self.captured, self.said, self.stopped, self.failed = captured, [], False, []

    def failure(self, e):                          # TensorParallel's: every worker stopped, the error to raise
        self.failed.append(e)
        self.stopped = True
        return e

    def stop_now(self):
        self.stopped = True

    def replay(self, index):
        self.said.append(index)

    def hold_graphs(self, graphs):
        self.held = graphs


class FakeGraphRunner:
    """Captures as stage 7's does: one ShardedModel capture per key, in dict order."""

    def __init__(self, group, keys, told=None):
        self.graphs = {k: None for k in keys}
        group.captured += len(keys) if told is None else told
        self.group, self.ran = group, []

    def execute(self, out):
        if out == "broken":
            raise RuntimeError("no block-table row left (a bug)")
        self.ran.append((out, list(self.group.said)))
        return out

    def replay_bucket(self, out):
        return (1, 1) if out == "broken" else out if out in self.graphs else None


def test_each_replay_is_announced_first_with_the_index_the_workers_captured_it_under():
    group = FakeGroup(captured=3)                  # three captures before (another part's): indices 3, 4, 5
    r = GraphsAcrossRanks(group, lambda: FakeGraphRunner(group, [(16, 1), (1, 1), ("prefill", 32)]))
    for step in [(1, 1), "mixed", ("prefill", 32), (16, 1)]:
        r.execute(step)
    assert group.said == [4, 5, 3]
    assert r.inner.ran[0] == ((1, 1), [4])         # told before rank 0 replayed
    assert r.inner.ran[1] == ("mixed", [4])        # an eager step: nothing announced


def test_a_capture_the_workers_did_not_hear_of_is_a_bug_said_at_once():
    group = FakeGroup(captured=0)
    with pytest.raises(RuntimeError, match="would not agree"):
        GraphsAcrossRanks(group, lambda: FakeGraphRunner(group, [(1, 1), (2, 1)], told=1))


def test_an_error_after_a_replay_was_announced_stops_the_workers_it_left_waiting():
    group = FakeGroup(captured=0)
    r = GraphsAcrossRanks(group, lambda: FakeGraphRunner(group, [(1, 1)]))
    with pytest.raises(RuntimeError, match="no block-table row"):
        r.execute("broken")
    assert group.said == [0] and group.stopped and len(group.failed) == 1


def test_a_capture_that_fails_on_rank_0_stops_the_workers_that_captured():
    group = FakeGroup(captured=0)

    def capture():
        group.captured += 1
        raise torch.cuda.OutOfMemoryError("CUDA out of memory") if hasattr(torch.cuda, "OutOfMemoryError") \
            else RuntimeError("CUDA out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        GraphsAcrossRanks(group, capture)
    assert group.stopped
