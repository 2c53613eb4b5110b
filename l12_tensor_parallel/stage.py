"""Stage 12's contribution to the assembler: two options and one part, the other ranks.

    slot             part                                             options it reads
    tensor_parallel  TensorParallel (group.py): ranks 1..tp-1 as      tensor_parallel_size,
                     worker processes, each loading its shard         distributed_backend
                     (shard.py); this rank's model made shard 0,
                     its collectives installed (layers.py)
    kv_cache         None: the earlier stages' cache, asked for       tensor_parallel_size
                     after this rank's model has become its shard,
                     so it holds this rank's KV heads

With ``tensor_parallel_size=1`` (the default) neither maker does anything: the engine is stage 11's,
part for part. With more, every other part is the earlier stages' too (scheduler, KV manager,
runner, sampler, step order), built once, in this process: only the model is split.
"""
from __future__ import annotations

import torch

from l1_dense.checkpoint import resolve_model_dir
from l1_dense.config import ModelConfig
from l5_scheduler.assemble import Stage
from l5_scheduler.llm import entry_points
from l11_spec_decode.stage import STAGES as BEFORE
from plumbing.errors import UserError

from .group import TensorParallel, WorkerSpec
from .options import OPTIONS
from .shard import check_tp

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


def tensor_parallel(a):
    """TensorParallel: the other ranks started, each with its shard; this rank's model made shard 0."""
    tp, model = a.args.tensor_parallel_size, a.model
    device, dtype = str(a.device), next(model.parameters()).dtype
    backend = backend_for(a.args.distributed_backend, device, tp)
    check_tp(model.cfg, tp)
    path = resolve_model_dir(a.args.model)
    if ModelConfig.from_dir(path) != model.cfg:
        raise UserError(f"tensor_parallel_size {tp}: the other ranks load {path}, which is not this model's "
                        "checkpoint: pass the checkpoint as model=... (LLM(model, ...) does).")
    mine = {o.name for o in OPTIONS}
    spec = WorkerSpec(str(path), device, dtype, a.config, {k: v for k, v in a.args.given.items() if k not in mine},
                      a.args.impl, tuple(s.name for s in a.stages if s.name != NAME), backend, TIMEOUT_S)
    return TensorParallel(model, spec, tp)


def kv_cache(a):
    """(the shard first): None, the earlier stages' cache, made after this rank's model has become its shard."""
    if a.args.tensor_parallel_size > 1:
        a.part("tensor_parallel")
    return None


STAGES = BEFORE + (Stage(NAME, OPTIONS, dict(tensor_parallel=tensor_parallel, kv_cache=kv_cache)),)
LLM, build_engine = entry_points(STAGES)
