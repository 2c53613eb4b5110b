"""What bench_tp.py runs in a process of its own (so that each engine's GPU memory is free for the
next): one engine's measurements, or the all-reduce probe over the host's GPUs. Each prints one
line of JSON last; bench_tp.py reads it."""
from __future__ import annotations

import json
import os
import sys
import time

import torch

from benchmarks.bench_common import sync, workload

GRAPH_REPS = 20                  # all-reduces captured in one CUDA graph
ITERS = 200                      # eager all-reduces timed back to back


def engine(spec: dict) -> dict:
    """Start-up, single-stream ms/token, e2e tok/s, and (tokens=True) greedy tokens and their logits."""
    from l4_sampler.params import SamplingParams
    from l12_tensor_parallel import LLM
    t0 = time.perf_counter()
    llm = LLM(spec["path"], device=spec["device"], dtype=getattr(torch, spec["dtype"]), seed=0,
              tensor_parallel_size=spec["tp"], enforce_eager=spec["eager"], keep_logits=spec["tokens"],
              **({"disable_custom_all_reduce": True} if spec.get("nccl_only") else {}),
              **({"num_gpu_blocks_override": 64} if spec["device"] == "cpu" else {}))
    eng = llm.llm_engine
    out = dict(start_s=time.perf_counter() - t0, num_blocks=eng.config.num_blocks,
               modes=sorted(set(getattr(eng.runner, "mode_log", []))))
    vocab = llm.model.cfg.vocab_size

    def gen(prompts, n):
        """Seconds to generate n tokens (an int for all, or one per prompt) after each prompt, synced."""
        p = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in
             (n if isinstance(n, list) else [n] * len(prompts))]
        sync()
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": q} for q in prompts], p, use_tqdm=False)
        sync()
        return time.perf_counter() - t

    if spec["tokens"]:                               # greedy tokens and each token's logits, for tp 2 vs tp 1
        prompts = [w for w, _ in workload(spec["token_prompts"], 16, 64, vocab, 7)]
        ids = [eng.add_request({"prompt_token_ids": q}, SamplingParams(temperature=0, max_tokens=spec["token_steps"],
                                                                       ignore_eos=True)) for q in prompts]
        while eng.has_unfinished_requests():
            eng.step()
        torch.save([(eng.requests[i].output_ids, torch.stack(eng.requests[i].logits).float().cpu()) for i in ids],
                   spec["tokens_file"])
    else:
        prompt, n = workload(1, 64, 64, vocab, 3)[0][0], spec["stream_tokens"]
        gen([prompt], 4)                             # warm: the first call's host work
        t1 = min(gen([prompt], 1) for _ in range(2))
        tn = min(gen([prompt], n + 1) for _ in range(2))
        out["ms_per_token"] = (tn - t1) / n * 1e3
        work = workload(spec["requests"], spec["min_len"], spec["max_len"], vocab, 0)
        gen([p for p, _ in workload(8, spec["min_len"], spec["max_len"], vocab, 1)], 8)   # warm-up, other prompts
        out["e2e_s"] = gen([q for q, _ in work], [m for _, m in work])
        out["e2e_tok_s"] = sum(m for _, m in work) / out["e2e_s"]
    group = getattr(eng.model, "tensor_parallel", None)
    if group is not None:
        out["sent"] = str(group.sent)
        out["send_cpu_us"] = group.sent.cpu_s / max(group.sent.steps, 1) * 1e6          # a forward pass sent
        if group.sent.replays:                                                           # a replay announced
            out["replay_cpu_us"] = group.sent.replay_cpu_s / group.sent.replays * 1e6
        group.close()
    return out


def _rank(rank: int, size: int, port: int, sizes: list, path: str) -> None:
    """One rank of the all-reduce probe: NCCL and ours (allreduce.py), eager and graph-replayed, at each size."""
    import datetime

    import torch.distributed as dist

    from benchmarks.timing import collective_us
    from l12_tensor_parallel.allreduce import PeerAllReduce, store_exchange
    from l12_tensor_parallel.comm import process_group
    torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    pg = process_group("nccl", store, rank, size, 60.0)
    ours = PeerAllReduce(rank, size, store_exchange(store, rank, size))

    def line_up():                                   # the ranks start each timing together
        pg.allreduce([torch.ones(1, device="cuda")]).wait()
        torch.cuda.synchronize()
    res = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        row = dict(bytes=nbytes, **collective_us(lambda t: pg.allreduce([t]).wait(), x, line_up, ITERS, GRAPH_REPS))
        if ours.eligible(x):
            t = collective_us(ours.all_reduce, x, line_up, ITERS, GRAPH_REPS)
            row.update({f"ours_{k}": v for k, v in t.items()})
        res.append(row)
    ours.check()
    if rank == 0:
        with open(path, "w") as f:
            json.dump(res, f)
    torch.cuda.synchronize()
    os._exit(0)                                      # no destroy_process_group: it can hang after graph capture


def allreduce(spec: dict) -> dict:
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = spec["path"]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, spec["size"], port, spec["sizes"], path)) for r in range(spec["size"])]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
    with open(path) as f:
        return dict(rows=json.load(f))


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = (allreduce if spec["kind"] == "allreduce" else engine)(spec)
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)                                      # workers are closed; skip NCCL's teardown at exit
