"""Which slice of each weight a rank holds (Megatron's split), and a rank's model built from them.

For rank r of tp ranks, one decoder layer (weights in PyTorch's ``[out, in]`` layout):

    weight                 split                 rank r holds
    q_proj   [H_q*D, h]    column-parallel, dim 0   query heads r*H_q/tp .. (r+1)*H_q/tp
    k_proj, v_proj         column-parallel, dim 0   KV heads (r*H_kv)//tp .. + max(1, H_kv/tp)
                                                    (H_kv < tp: each KV head on tp/H_kv ranks)
    o_proj   [h, H_q*D]    row-parallel, dim 1      the columns of its query heads (bias: rank 0)
    gate, up [I, h]        column-parallel, dim 0   rows r*I/tp .. (r+1)*I/tp
    down     [h, I]        row-parallel, dim 1      the same columns
    norms, q/k norms       replicated
    embed, lm_head [V, h]  vocab-parallel, dim 0    rows r*V'/tp .. (V' = V rounded up to tp; the
                                                    rows past V are zeros)

A query head h reads KV head h // (H_q / H_kv), so the KV heads a rank holds are exactly those its
query heads read: attention needs nothing from another rank. The two row-parallel matmuls each end
in a partial sum (layers.py adds the all-reduce).

``load_shard`` builds a rank's model from the safetensors files, reading only its slices (every
rank's, rank 0's too, when the engine is given a checkpoint: ``LLM``); ``shard_model`` turns a
model already loaded whole (one given to ``build_engine``) into rank 0's shard in place.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from safetensors import safe_open

from l1_dense.checkpoint import _weight_files
from l1_dense.config import ModelConfig
from l1_dense.model import CausalLM, rope_inv_freq
from plumbing.errors import UserError
from plumbing.exercise import learner_can_replace

from .layers import ParallelLMHead, VocabParallelEmbedding

COLUMN = re.compile(r"self_attn\.[qkv]_proj\.(weight|bias)$|mlp\.(gate|up)_proj\.weight$")
ROW = re.compile(r"self_attn\.o_proj\.weight$|mlp\.down_proj\.weight$")
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


class Slice(NamedTuple):
    dim: int
    start: int
    stop: int          # may pass the tensor's end (vocab rows): the rows past it are zeros
    size: int          # the shard's length along dim


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """The sizes a tp split needs, each refused in one line."""
    if cfg.num_heads % tp:
        raise UserError(f"tensor_parallel_size {tp} does not divide the model's {cfg.num_heads} query heads: use a "
                        f"divisor of {cfg.num_heads}.")
    if cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
        raise UserError(f"tensor_parallel_size {tp} and the model's {cfg.num_kv_heads} KV heads do not divide one "
                        "another (each rank holds H_kv / tp heads, or each head sits on tp / H_kv ranks).")
    if cfg.intermediate_size % tp:
        raise UserError(f"tensor_parallel_size {tp} does not divide the MLP's {cfg.intermediate_size} channels.")


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """What one rank's layers hold: its heads and MLP channels (the vocabulary stays whole: logits are gathered)."""
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=max(1, cfg.num_kv_heads // tp),
                               intermediate_size=cfg.intermediate_size // tp)


@learner_can_replace  # lesson 12's build-it exercise: exercises/l12_tensor_parallel.py
def slice_for(name: str, shape: tuple, cfg: ModelConfig, rank: int, tp: int) -> Slice | None:
    """Rank ``rank``'s slice of the full weight ``name`` (of ``shape``), or None: replicated."""
    D = cfg.head_dim
    if name in VOCAB:
        n = -(-cfg.vocab_size // tp)
        return Slice(0, rank * n, (rank + 1) * n, n)
    if COLUMN.search(name):
        if ".q_proj." in name:
            n = cfg.num_heads // tp * D
            return Slice(0, rank * n, (rank + 1) * n, n)
        if ".k_proj." in name or ".v_proj." in name:
            first, n = rank * cfg.num_kv_heads // tp, max(1, cfg.num_kv_heads // tp)
            return Slice(0, first * D, (first + n) * D, n * D)
        n = cfg.intermediate_size // tp
        return Slice(0, rank * n, (rank + 1) * n, n)
    if ROW.search(name):
        n = shape[1] // tp
        return Slice(1, rank * n, (rank + 1) * n, n)
    return None


def take(full_len: int, sl: Slice, read: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """``read(start, stop)`` along sl.dim, zero-padded to sl.size where the slice passes the end."""
    part = read(sl.start, min(sl.stop, full_len))
    if part.shape[sl.dim] == sl.size:
        return part
    shape = list(part.shape)
    shape[sl.dim] = sl.size - part.shape[sl.dim]
    return torch.cat([part, part.new_zeros(shape)], dim=sl.dim)


def expected_shapes(cfg: ModelConfig, tp: int) -> dict[str, tuple]:
    """The parameter shapes of one rank's model (its skeleton on ``meta``, the vocab split)."""
    with torch.device("meta"):
        skeleton = CausalLM(local_config(cfg, tp))
    out = {n: tuple(p.shape) for n, p in skeleton.named_parameters(remove_duplicate=False)}
    for n in VOCAB:
        out[n] = (-(-cfg.vocab_size // tp), cfg.hidden_size)
    return out


def _no_bias_past_rank0(name: str, rank: int) -> bool:
    """A row-parallel bias is added once, after the sum: rank 0 keeps it (as vLLM), the others drop it."""
    return rank > 0 and name.endswith("o_proj.bias")


def build(model: CausalLM, rank: int, tp: int, read: Callable[[str, Slice | None], torch.Tensor]) -> CausalLM:
    """Make ``model`` (built for the full config) rank ``rank``'s shard, in place: every parameter
    becomes ``read(name, its slice)``, checked against the shard's shape; the embedding and the
    lm_head become their vocab-parallel modules (layers.py installs the collectives)."""
    cfg, want = model.cfg, expected_shapes(model.cfg, tp)
    tied = cfg.tie_word_embeddings
    for name, p in list(model.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if _no_bias_past_rank0(name, rank):
            module.bias = None
            continue
        t = read(name, slice_for(name, tuple(p.shape), cfg, rank, tp))
        if tuple(t.shape) != want[name]:
            raise UserError(f"rank {rank}'s shard of {name} is {tuple(t.shape)}, its layer needs {want[name]}: the "
                            "split is wrong (a row-parallel weight splits its input columns, dim 1).")
        setattr(module, attr, torch.nn.Parameter(t, requires_grad=False))
    local = local_config(cfg, tp)
    for layer in model.model.layers:
        layer.self_attn.h_q, layer.self_attn.h_kv = local.num_heads, local.num_kv_heads
    embed = VocabParallelEmbedding(model.model.embed_tokens.weight, rank, cfg.vocab_size)
    model.model.embed_tokens = embed
    model.lm_head = ParallelLMHead(embed.weight if tied else model.lm_head.weight, cfg.vocab_size)
    model.cfg = local
    return model


def shard_model(model: CausalLM, rank: int, tp: int) -> CausalLM:
    """Rank ``rank``'s shard of a model loaded whole, in place (the slices are copied, the rest freed)."""
    full = dict(model.named_parameters())

    def read(name, sl):
        w = full[name].data
        if sl is None:
            return w
        return take(w.shape[sl.dim], sl, lambda a, b: w.narrow(sl.dim, a, b - a)).clone()
    return build(model, rank, tp, read)


def load_shard(path: Path, device, dtype: torch.dtype, rank: int, tp: int) -> CausalLM:
    """Rank ``rank``'s model from the checkpoint's files: each weight read as its slice only."""
    path = Path(path)
    cfg = ModelConfig.from_dir(path)
    check_tp(cfg, tp)
    where = {}
    for f in _weight_files(path):
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            where.update({name: f for name in sf.keys()})
    with torch.device("meta"):
        model = CausalLM(cfg)

    def read(name, sl):
        if name not in where:
            raise UserError(f"checkpoint {path} is missing weight {name}: is it a complete Qwen3/Qwen2/Llama "
                            "checkpoint?")
        with safe_open(str(where[name]), framework="pt", device="cpu") as sf:
            s = sf.get_slice(name)
            full_len = s.get_shape()[sl.dim] if sl is not None else 0
            if sl is None:
                t = s[:]
            else:
                t = take(full_len, sl, lambda a, b: s[a:b] if sl.dim == 0 else s[:, a:b])
        return t.to(device=device, dtype=dtype)
    build(model, rank, tp, read)
    model.inv_freq = rope_inv_freq(cfg).to(device)
    return model.eval()
