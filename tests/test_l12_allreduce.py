"""Our peer all-reduce (l12_tensor_parallel/allreduce.py) on a CPU: eligibility and the fallback, the
pad layout, and the kernel itself under the Triton interpreter, two ranks in one process. The
interpreter runs one launch at a time, so a test plays the peer's first half of a call (its copy
and its flags) by hand with ``publish``, then runs the peer's real launch later: rank 0 can be a
whole call ahead, which is what the double buffer and the parity-indexed flags are for."""
import pytest
import torch

from l12_tensor_parallel.allreduce import PeerAllReduce, eligible, pad_bytes, pad_slot
from plumbing.runtime import INTERPRET

interpreted = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the interpreter (GPUs: probe_allreduce.py)")

KW = dict(programs=4, block=64, max_bytes=4096, spin_limit=2000)     # a wrong protocol fails, never hangs


def publish(ranks, src: int, x: torch.Tensor, epoch: int) -> None:
    """What rank ``src``'s launch number ``epoch`` does before it waits: its x into its data half
    epoch & 1, then epoch into its slot of every peer's pad for each program that has chunks."""
    a = ranks[src]
    off, par, n = pad_bytes(a.world, a.programs), epoch & 1, x.numel()
    half = a.max_bytes // x.element_size()
    a.regions[src][off:].view(x.dtype)[par * half:par * half + n] = x
    for p in range(min(a.programs, -(-n // a.block))):
        for d in range(a.world):
            if d != src:
                a.regions[d][:off].view(torch.int64)[pad_slot(par, p, src, a.world, a.programs)] = epoch


def test_eligible_and_fallback():
    x = torch.ones(8, dtype=torch.bfloat16)
    assert eligible(x, "cpu", 16) and not eligible(x, "cpu", 15)             # 16 bytes: the threshold is inclusive
    assert not eligible(x, "cuda:0", 1 << 20)                               # a CPU tensor is never a GPU rank's
    assert not eligible(x.to(torch.int32), "cpu", 1 << 20)                  # a dtype we do not sum
    assert not eligible(torch.ones(4, 4)[:, :2], "cpu", 1 << 20)            # not contiguous
    assert not eligible(torch.ones(0), "cpu", 1 << 20)                      # nothing to send: no launch
    assert not eligible(torch.ones(9)[1:], "cpu", 1 << 20)                  # 4 bytes past 16-byte alignment
    seen = []
    a = PeerAllReduce(0, 2, None, fallback=lambda t: seen.append(t) or t.mul_(2), device="cuda:0")
    t = torch.ones(3)
    assert a(t) is t and seen == [t] and t.tolist() == [2.0, 2.0, 2.0]     # in place, through the fallback


def test_fallback_is_gloo_for_cpu_tensors():
    import torch.distributed as dist

    from l12_tensor_parallel.comm import process_group
    store = dist.HashStore()
    pg = process_group("gloo", store, 0, 1, 10.0)
    a = PeerAllReduce(0, 1, None, fallback=lambda t: pg.allreduce([t]).wait(), device="cuda:0")
    t = torch.full((5,), 3.0)
    assert a(t) is t and t.tolist() == [3.0] * 5


def test_pad_layout_is_disjoint():
    world, programs = 3, 5
    slots = {pad_slot(h, p, s, world, programs) for h in (0, 1) for p in range(programs) for s in range(world)}
    assert slots == set(range(2 * programs * world))
    assert pad_bytes(world, programs) % 256 == 0 and pad_bytes(world, programs) >= 8 * len(slots)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])     # (the interpreter truncates fp32 -> bf16)
def test_two_ranks_one_call_ahead(dtype):
    r0, r1 = PeerAllReduce.local(2, **KW)
    g = torch.Generator().manual_seed(0)
    xs = {(r, e): torch.randn(300, generator=g).to(dtype) for r in (0, 1) for e in (1, 2)}
    want = {e: (xs[0, e].float() + xs[1, e].float()).to(dtype) for e in (1, 2)}
    publish([r0, r1], 1, xs[1, 1], 1)
    out01 = r0(xs[0, 1].clone())                    # call 1: in place
    publish([r0, r1], 1, xs[1, 2], 2)
    out02 = r0.all_reduce(xs[0, 2], out=torch.empty_like(xs[0, 2]))        # call 2: rank 0 a call ahead
    out11 = r1(xs[1, 1].clone())                    # rank 1's call 1 reads rank 0's half 1, untouched by call 2
    out12 = r1(xs[1, 2].clone())
    for got, e in ((out01, 1), (out02, 2), (out11, 1), (out12, 2)):
        assert torch.equal(got, want[e]), e
    r0.check(), r1.check()
    assert torch.equal(r0.calls, torch.full((4,), 2)) and torch.equal(r1.calls, r0.calls)


@interpreted
def test_sizes_change_between_calls():
    r0, r1 = PeerAllReduce.local(2, **KW)
    for e, n in enumerate((300, 17, 1024), 1):          # 5, 1 and 16 chunks: other programs idle, counters agree
        a, b = torch.randn(n), torch.randn(n)
        publish([r0, r1], 1, b, e)
        assert torch.equal(r0(a.clone()), a + b)
        assert torch.equal(r1(b.clone()), a + b)
    r0.check(), r1.check()
    assert r0.calls.tolist() == [3] * 4


@interpreted
def test_a_missing_peer_times_out_and_check_raises():
    r0, _ = PeerAllReduce.local(2, **dict(KW, spin_limit=3))
    r0(torch.ones(10))                                  # nobody published: the wait gives up
    with pytest.raises(RuntimeError, match="out of step"):
        r0.check()
