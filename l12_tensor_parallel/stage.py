"""Stage 12's contribution to the assembler: five options and three parts.

    slot    part                                                   options it reads
    model   ShardedModel (model.py): rank 0's shard, read from     tensor_parallel_size,
            the checkpoint's slices (shard.py), with its           distributed_backend, model,
            collectives (layers.py; all-reduces: allreduce.py)     disable_custom_all_reduce
            and ranks 1..tp-1 started as
            worker processes, each reading its own (group.py,
            worker.py); every rank's pool the smallest any holds
    runner  on GPUs at tp > 1, stage 7's CUDA graphs captured on   tensor_parallel_size,
            every rank, each replay announced to the workers       enforce_eager,
            (graphs.py); elsewhere stage 7's choice                prefill_graphs
    engine_client  the server's (l10_server/client.py): at         data_parallel_size,
            dp > 1, DataParallel (replicas.py): dp engine cores,   data_parallel_routing
            each a whole engine (and a TP group at tp > 1),
            requests routed to the least loaded (router.py)

The model is the first part the assembler asks for, so everything made after it is made for the
shard: the sizes, the KV cache (this rank's KV heads), fused ops (its projections merged), the
runner (whose every forward pass is ShardedModel's: the inputs go to the workers first). With
``tensor_parallel_size=1`` (the default) the maker returns None: the engine is stage 11's, part for
part. With more, every other part is the earlier stages' too (scheduler, KV manager, runner,
sampler, step order), built once, in this process: only the model is split (and, on GPUs, the
runner's graphs are captured on every rank).

Data parallelism is the server's: ``LLM(data_parallel_size=2)`` is refused in one line that names
``python -m l10_server --data-parallel-size 2``, whose engine client starts the replicas, each an
engine core that builds this same engine with ``data_parallel_size`` left out.
"""
from __future__ import annotations

import sys

import torch

from l1_dense.checkpoint import resolve_model_dir
from l1_dense.config import ModelConfig
from l5_scheduler.assemble import Checkpoint, Stage, engine_config
from l5_scheduler.llm import entry_points
from l11_spec_decode.stage import STAGES as BEFORE
from l7_fast.graphs import GraphRunner
from l7_fast.warmup import warm_up
from plumbing.errors import UserError

from .graphs import GraphsAcrossRanks
from .group import TensorParallel, WorkerSpec
from .layers import install
from .model import ShardedModel
from .options import OPTIONS
from .shard import check_tp, load_shard, shard_model

NAME = "l12_tensor_parallel"
TIMEOUT_S = 60.0              # a collective waits this long for a rank before the engine stops


def backend_for(asked: str, device: str, tp: int) -> str:
    """gloo or nccl, each checked against the device in one line."""
    cuda = device.startswith("cuda")
    if asked == "nccl" and not cuda:
        raise UserError("distributed_backend='nccl' needs CUDA GPUs and this engine runs on the CPU: use gloo "
                        "(or leave it at auto).")
    if cuda and tp > torch.cuda.device_count():
        raise UserError(f"tensor_parallel_size {tp} needs {tp} GPUs (one per rank) and {torch.cuda.device_count()} "
                        "are visible: lower it, or make more visible (CUDA_VISIBLE_DEVICES).")
    return asked if asked != "auto" else "nccl" if cuda else "gloo"


def peers_reach(backend: str, tp: int) -> bool:
    """Whether every GPU can read every other's memory (our all-reduce maps its peers' buffers): decided
    here, once, so that every rank builds the same all-reduce. Where one cannot, NCCL's, said in one line."""
    if backend != "nccl":
        return False
    ok = all(torch.cuda.can_device_access_peer(i, j) for i in range(tp) for j in range(tp) if i != j)
    if not ok:
        print(f"l12_tensor_parallel: GPUs 0..{tp - 1} cannot all reach each other's memory (no peer access): the "
              "all-reduces are NCCL's", file=sys.stderr)
    return ok


def model(a):
    """ShardedModel: the other ranks started, each loading its shard; this rank's shard, joined to them."""
    refuse_data_parallel(a.args)
    tp = a.args.tensor_parallel_size
    if tp == 1:
        return None
    given = a.given
    path = given.path if isinstance(given, Checkpoint) else resolve_model_dir(a.args.model)
    cfg = ModelConfig.from_dir(path)
    if not isinstance(given, Checkpoint) and given.cfg != cfg:
        raise UserError(f"tensor_parallel_size {tp}: the other ranks load {path}, which is not this model's "
                        "checkpoint: pass the checkpoint as model=... (LLM(model, ...) does).")
    device, dtype = (given.device, given.dtype) if isinstance(given, Checkpoint) else \
        (str(next(given.parameters()).device), next(given.parameters()).dtype)
    backend = backend_for(a.args.distributed_backend, device, tp)
    check_tp(cfg, tp)
    mine = {o.name for o in OPTIONS}
    spec = WorkerSpec(str(path), device, dtype, a.given_config, {k: v for k, v in a.args.given.items()
                                                                  if k not in mine},
                      a.args.impl, tuple(s.name for s in a.stages if s.name != NAME), backend, TIMEOUT_S,
                      custom_all_reduce=not a.args.disable_custom_all_reduce and peers_reach(backend, tp))
    if a.args.given.get("disable_custom_all_reduce") is not None and backend != "nccl":
        print(f"l12_tensor_parallel: disable_custom_all_reduce is ignored: {backend} has only its own all-reduce "
              "(ours runs between GPUs, over NCCL's group)", file=sys.stderr)
    if isinstance(given, Checkpoint):                # LLM's: this rank reads its slices only, as every rank does
        shard = load_shard(path, device, dtype, 0, tp)
    else:                                            # a model loaded whole (build_engine's caller): sliced in place
        shard = shard_model(given, 0, tp)
    group = TensorParallel(spec, tp)                 # each worker loads its own shard, sizes its pool
    try:
        mine = a.given_config or engine_config(a.args, shard, device, dtype)
        a.config = group.agree(mine)                 # the smallest pool any rank holds, on every rank
    except BaseException:
        group.stop_now()
        raise
    install(shard, group.comm)
    return ShardedModel(shard, group)


def runner(a):
    """On GPUs at tp > 1: stage 7's choice (its CUDA graphs after the warm-up, or the eager runner
    with enforce_eager), each graph captured on every rank and each replay announced to the workers
    (graphs.py). Speculation's verify steps then run eagerly, and the engine says so in one line."""
    if a.args.tensor_parallel_size == 1 or a.device.type != "cuda":
        return None
    r = a.part("eager_runner")
    r.warmup_report = warm_up(r, progress=True)                # nothing compiles after start-up (every rank)
    print(r.warmup_report.line(), file=sys.stderr)
    if a.args.enforce_eager or a.args.impl != "triton":        # the torch reference cannot be captured
        return r
    if a.args.speculative_config is not None:
        print(f"l12_tensor_parallel: tensor_parallel_size {a.args.tensor_parallel_size} runs speculation's verify "
              "steps eagerly: its verify graphs are not captured across ranks yet", file=sys.stderr)
    return GraphsAcrossRanks(a.model.tensor_parallel, lambda: GraphRunner(r, prefill=a.args.prefill_graphs))


def refuse_data_parallel(args) -> None:
    """One engine (LLM, build_engine) has no replicas: the server runs them."""
    dp = args.data_parallel_size
    if dp > 1 or "data_parallel_routing" in args.given:
        raise UserError(f"data_parallel_size {dp}: LLM(...) runs one engine; replicas run behind the server, one "
                        f"engine core each: python -m l10_server --data-parallel-size {max(dp, 2)}.")


def engine_client(a):
    """DataParallel: at data_parallel_size > 1, that many engine cores (replicas.py), loaded at once,
    behind one router; at 1, None (stage 10's one engine core), and a routing asked for is refused."""
    if a.args.data_parallel_size == 1:
        if "data_parallel_routing" in a.args.given:
            raise UserError("data_parallel_routing chooses among replicas and data_parallel_size is 1: give "
                            "--data-parallel-size 2 (or more) with it, or leave it out.")
        return None
    from .replicas import start
    return start(a.args)


STAGES = BEFORE + (Stage(NAME, OPTIONS, dict(model=model, runner=runner, engine_client=engine_client)),)
LLM, build_engine = entry_points(STAGES)
