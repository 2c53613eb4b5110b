"""Our peer all-reduce (l12_tensor_parallel/allreduce.py) against NCCL on one host's GPUs: equality,
then time. One process per GPU (spawn), an NCCL group made like comm.py's, multicast off in each.

    PYTHONPATH=$PWD python -m benchmarks.probe_allreduce [--world 2]

Phases (each with a hard time limit, watched by this parent process: a rank stuck past it, or dead,
stops the run with one line and exit 1):
  setup      NCCL group, our buffers exchanged through the store
  compile    our kernel's first launches
  check      ours == NCCL (bitwise at 2 ranks, else within (W-1) 2^-8 sum|x|) for bf16 [batch, hidden],
             batch 1..256, hidden 1024 and 4096, plus odd sizes: 3 calls back to back per shape, then
             every shape back to back in a shuffled order (the split changes call to call)
  skew       the same with the last rank late: a host sleep before its calls, and a GPU sleep before
             every other call (rank 0 runs a call ahead)
  graphs     20 calls of mixed sizes captured in one CUDA graph, replayed 3 times on new data (2 of
             them with the last rank late on its GPU)
  timing     µs per all-reduce: NCCL eager, NCCL in a CUDA graph, ours eager, ours in a CUDA graph
             (graphs of 20 calls, replayed); the signalling cost (ours on 1 element, in a graph)
  spin       rank 0 alone, a peer that never comes: what one poll costs (the spin limit in seconds)
  bandwidth  rank 0: a peer-to-peer copy (the floor: signalling + bytes x (W-1) / this bandwidth)
Writes benchmarks/results/probe_allreduce/<W>x<gpu>.{json,md,png}; exit 1 if ours != NCCL anywhere.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from benchmarks.probe_allreduce_checks import Checks

ENV = dict(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
LIMIT_S = dict(setup=90, compile=60, check=45, skew=30, graphs=30, timing=60, spin=20, bandwidth=20, exit=20)
TOTAL_S = 175
HIDDENS, BATCHES, ODD = (1024, 4096), (1, 2, 4, 8, 16, 32, 64, 128, 256), (7, 1000, 12345)
GRAPH_REPS, REPLAYS, ITERS = 20, 10, 100


def _rank(rank: int, world: int, port: int, q) -> None:
    os.environ.update(ENV)
    code = 0
    try:
        _run(rank, world, port, q)
    except BaseException as e:                                  # noqa: BLE001  (told to the parent, one line)
        q.put(("error", rank, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"))
        code = 1
    q.close()
    q.join_thread()                                             # the last message sent before we go
    os._exit(code)                                              # no NCCL teardown: it can hang after graphs


def _run(rank, world, port, q):
    import datetime

    import torch
    import torch.distributed as dist

    from l12_tensor_parallel.allreduce import PeerAllReduce, store_exchange
    from l12_tensor_parallel.comm import process_group
    say = lambda phase: q.put(("phase", rank, phase))                                     # noqa: E731
    say("setup")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    pg = process_group("nccl", store, rank, world, 60.0)
    nccl = lambda t: pg.allreduce([t]).wait()                                             # noqa: E731
    nccl(torch.ones(1, device=dev))
    ar = PeerAllReduce(rank, world, store_exchange(store, rank, world), fallback=nccl)
    c = Checks(torch, rank, world, nccl, ar, dev, HIDDENS, BATCHES, ODD, GRAPH_REPS)
    say("compile")
    for b, h in c.shapes:
        ar(torch.ones(b, h, dtype=torch.bfloat16, device=dev))
    torch.cuda.synchronize()
    for phase in ("check", "skew", "graphs"):
        say(phase)
        getattr(c, {"check": "calls"}.get(phase, phase))()
    out = c.out
    say("timing")
    out["rows"] = [_time(torch, nccl, ar, dev, n) for n in [2] + SIZES]       # 2 bytes: the signalling alone
    if rank == 0:
        say("spin")
        out["spin_us"] = _spin(torch, dev)
        out["device"], out["nccl"] = torch.cuda.get_device_name(), ".".join(map(str, torch.cuda.nccl.version()))
        out["torch"] = torch.__version__
        say("bandwidth")
        out["p2p_GBps"] = _p2p(torch) if world > 1 else None
    say("exit")
    store_exchange(store, rank, world, "probe_done")(True)     # every rank past its last launch: free
    ar.close()
    q.put(("result", rank, out))


SIZES = sorted({2 * h * b for h in HIDDENS for b in BATCHES})   # 2 KB .. 2 MB


def _line_up(torch, nccl, dev):
    nccl(torch.ones(1, device=dev))
    torch.cuda.synchronize()


def _time(torch, nccl, ar, dev, nbytes):
    """µs per call, NCCL's and ours: eager (ITERS back to back) and replayed from a graph of GRAPH_REPS calls."""
    from benchmarks.timing import collective_us
    x = torch.zeros(max(nbytes // 2, 1), dtype=torch.bfloat16, device=dev)
    row = dict(bytes=nbytes)
    for name, fn in (("nccl", nccl), ("ours", ar)):
        t = collective_us(fn, x, lambda: _line_up(torch, nccl, dev), ITERS, GRAPH_REPS, REPLAYS)
        if "graph_error" in t:
            raise RuntimeError(f"{name} in a CUDA graph: {t['graph_error']}")
        row.update({f"{name}_{k}": v for k, v in t.items()})
    return row


def _spin(torch, dev):
    """µs per poll of a wait that never ends, up to its limit (rank 0's GPU alone)."""
    from l12_tensor_parallel.allreduce import PeerAllReduce
    polls = 1 << 16
    r0, _ = PeerAllReduce.local(2, device=dev, spin_limit=polls)
    x = torch.ones(4096, dtype=torch.bfloat16, device=dev)
    r0(x)                                                       # compile (and one timed-out call)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    r0(x)
    b.record()
    torch.cuda.synchronize()
    if not int(r0.status.item()):
        raise RuntimeError("the spin limit did not trip with no peer")
    return a.elapsed_time(b) * 1e3 / polls


def _p2p(torch):
    """GB/s of a 64 MB copy from GPU 1 to GPU 0 (one direction of the link)."""
    src = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:1")
    dst = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    dst.copy_(src)
    torch.cuda.synchronize(0), torch.cuda.synchronize(1)
    t = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize(0), torch.cuda.synchronize(1)
    return 10 * src.numel() / (time.perf_counter() - t) / 1e9


def _watch(procs, q, world):
    """Results of every rank; exits 1 with one line if a rank dies, errs, or outstays its phase."""
    import queue
    start, results = time.monotonic(), {}
    phase = {r: ("start", start) for r in range(world)}

    def stop(line):
        for p in procs:
            if p.is_alive():
                p.kill()
        sys.exit(f"probe_allreduce: {line}")
    while len(results) < world:
        try:
            kind, r, what = q.get(timeout=0.5)
            if kind == "phase":
                phase[r] = (what, time.monotonic())
                if r == 0:
                    print(f"probe_allreduce: {what} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
            elif kind == "error":
                stop(f"rank {r} failed in {phase[r][0]}: {what}")
            else:
                results[r] = what
        except queue.Empty:
            pass
        now = time.monotonic()
        for r, (name, since) in phase.items():
            if r not in results and now - since > LIMIT_S.get(name, 60):
                stop(f"rank {r} stuck in phase {name} for {now - since:.0f} s (limit {LIMIT_S.get(name, 60)} s)")
        if now - start > TOTAL_S:
            stop(f"over the {TOTAL_S} s limit (phases: {', '.join(f'{r}: {p[0]}' for r, p in phase.items())})")
        dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead and dead[0][0] not in results:
            time.sleep(0.5)                                     # its error line may still be in the queue
            stop(f"rank {dead[0][0]} exited ({dead[0][1]}) in phase {phase[dead[0][0]][0]}")
    for p in procs:                                             # shutdown is part of the design: timed too
        p.join(max(0.0, LIMIT_S["exit"] - (time.monotonic() - phase[0][1])))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for r in hung:
        procs[r].kill()
    return results, hung


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="GPUs, one process each")
    a = ap.parse_args(argv)
    os.environ.update(ENV)                                      # inherited by the spawned ranks too
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < max(a.world, 2):
        sys.exit(f"probe_allreduce: needs {max(a.world, 2)} GPUs, {torch.cuda.device_count()} visible")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, a.world, port, q), daemon=True) for r in range(a.world)]
    for p in procs:
        p.start()
    results, hung = _watch(procs, q, a.world)
    from benchmarks.outputs import RESULTS, gpu_slug
    from benchmarks.probe_allreduce_report import report, save
    from l12_tensor_parallel.allreduce import SPIN_LIMIT
    res = dict(results[0], world=a.world, spin_limit=SPIN_LIMIT, env=ENV, graph_reps=GRAPH_REPS,
               checked=sum(r["checked"] for r in results.values()),
               mismatches=[dict(m, rank=k) for k, r in results.items() for m in r["mismatches"]])
    text = report(res, a.world)
    print(text)
    save(str(RESULTS / "probe_allreduce" / f"{a.world}x{gpu_slug(res['device'])}"), res, text, a.world)
    if hung:
        sys.exit(f"probe_allreduce: FAILED: ranks {hung} did not exit within {LIMIT_S['exit']} s of their results")
    if res["mismatches"]:
        m = res["mismatches"][0]
        sys.exit(f"probe_allreduce: FAILED: ours != NCCL in {len(res['mismatches'])} all-reduces; first: {m}")


if __name__ == "__main__":
    main()
