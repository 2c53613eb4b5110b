"""Rank 0's model: its shard, and the other ranks, behind the one call every part makes.

    ShardedModel(ids, kv, meta, ops)
      group.step(ids, meta):  the inputs to every worker            (group.py; a failure: one line)
                              (structure by pipe, tensors by broadcast: comm.py)
      shard(ids, kv, meta, ops)  rank 0's shard of CausalLM       (its all-reduces meet the workers')

The runner gets this module as its model (the ``model`` part), so every path that calls the model
(an eager step, speculative verification, async scheduling's on-device token fill, a GPU's
warm-up, a CUDA graph's capture) sends exactly the inputs it runs, and no part knows the model is
split. A graph's replay calls no model: the runner part announces it (graphs.py). ShardedModel
reads to the other parts as the shard does: its sizes (``cfg``, the shard's own: its heads), its
layers (``model``: fused ops merge their projections there) and its parameters (the shard is its
one submodule).
"""
from __future__ import annotations

from torch import nn


class ShardedModel(nn.Module):
    def __init__(self, shard: nn.Module, group):
        super().__init__()
        self.shard = shard
        self.tensor_parallel = group                 # TensorParallel (group.py): not a module, so not moved

    @property
    def cfg(self):
        return self.shard.cfg

    @property
    def model(self):                                 # the backbone: embedding, layers, final norm
        return self.shard.model

    @property
    def lm_head(self):
        return self.shard.lm_head

    def forward(self, input_ids, kv, meta, ops=None):
        with self.tensor_parallel.step(input_ids, meta, ops is None):
            return self.shard(input_ids, kv, meta, ops=ops)
