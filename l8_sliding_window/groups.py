"""KV cache groups: layers that share one block table (vLLM's ``KVCacheGroupSpec``).

A full-attention layer reads every key; a windowed layer only the last W. If all layers shared
one block table, a hybrid model could free nothing: the full layers still need the old blocks.
So the layers are split into groups of one kind, each group with its own block table per
request, and each group's KV manager frees what *its* layers no longer read.

Memory is shared the way vLLM shares it. All groups have the same number of layers, g; the cache
holds g K tensors (and g V tensors), and layer i of every group lives in tensor i. A block id
names one block of every tensor, and belongs to one group at a time:

    tiny-qwen2-hybrid: layers (12, None, 12)   windows per layer
        groups   0: full   layers (1,)          full layers first: group 0 is what stage 7 sees
                 1: W=12   layers (0,)
                 2: W=12   layers (2,)
        tensors  K[0] is shared by layers 1, 0 and 2: block 5 may be layer 1's (group 0) in one
                 request and layer 0's (group 1) in another

    a block stores g layers' K/V, so the same memory holds num_layers / g times as many blocks

The group size is the smallest number of layers of one kind (vLLM's rule, without its padding
refinements); a kind whose layers do not divide evenly gets a last, smaller group, whose missing
layers leave that part of its blocks unused. A model with one kind of layer is one group.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVGroup:
    window: int | None               # the layers' sliding window, or None: full attention
    layers: tuple[int, ...]          # model layer indices; layers[i] lives in the cache's tensor i


def kv_cache_groups(layer_windows: tuple, num_layers: int) -> list[KVGroup]:
    """Groups of equal size, one kind each, full-attention kinds first, then by window."""
    windows = tuple(layer_windows) or (None,) * num_layers
    kinds: dict[int | None, list[int]] = {}
    for layer, w in enumerate(windows):
        kinds.setdefault(w, []).append(layer)
    size = min(len(layers) for layers in kinds.values())
    order = sorted(kinds, key=lambda w: (w is not None, w or 0))
    return [KVGroup(w, tuple(kinds[w][i:i + size])) for w in order for i in range(0, len(kinds[w]), size)]


def group_size(groups: list[KVGroup]) -> int:
    """Tensors the cache holds: the largest group's layer count."""
    return max(len(g.layers) for g in groups)


def layer_slots(groups: list[KVGroup], num_layers: int) -> list[tuple[int, int]]:
    """Per model layer: (its group, its tensor)."""
    out = [None] * num_layers
    for gi, g in enumerate(groups):
        for t, layer in enumerate(g.layers):
            out[layer] = (gi, t)
    return out


def layer_tensors(groups: list[KVGroup], num_layers: int, shape: tuple, device, dtype, fill: float = 0.0) -> tuple:
    """A K and a V tensor per tensor index of the groups (``group_size`` of each), listed per model
    layer: layer i of every group gets the same two tensors."""
    import torch
    made = [torch.full(shape, fill, device=device, dtype=dtype) for _ in range(2 * group_size(groups))]
    slots = layer_slots(groups, num_layers)
    return [made[2 * t] for _, t in slots], [made[2 * t + 1] for _, t in slots]


def pool_blocks(num_blocks: int, groups: list[KVGroup], num_layers: int) -> int:
    """Blocks of the shared pool in the memory of ``num_blocks`` blocks of every layer."""
    return num_blocks * num_layers // group_size(groups)


def group_of(meta, g: int) -> tuple:
    """Group g's block table [S, W] and slot mapping [T] of a step: group 0's are the step's own
    (stage 7's fields); the others come in ``GroupMeta`` (inputs.py)."""
    if g == 0:
        return meta.block_table, meta.slot_mapping
    return meta.group_tables[g], meta.group_slots[g]


def request_blocks(n_tokens: int, block_size: int, chunk: int, groups: list[KVGroup]) -> int:
    """The most blocks of the shared pool one request of ``n_tokens`` holds, at its largest: every
    block in a full group, the window's bound in a windowed one (a step computes up to ``chunk``
    tokens, which the window's blocks must hold beside the W keys they see)."""
    full = -(-n_tokens // block_size)
    return sum(full if g.window is None else min(full, -(-(g.window + chunk - 1) // block_size) + 1) for g in groups)
