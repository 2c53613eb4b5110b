"""Lesson 12, build it: which slice of each weight a tensor-parallel rank holds (Megatron's split).

Replace the stub below with your own ``slice_for``, then run

    python scripts/exercise.py l12

which runs the project's tests with ``LESSONS_LEARNER=l12``: every rank's model is then built from
the slices your function names (l12_tensor_parallel/shard.py), and the tests compare each rank's
weights with the full checkpoint sliced by heads and channels, and the ranks' forward pass (joined
by gloo) with the whole model's.

Contract
    name    str     the weight's name in the checkpoint, e.g. "model.layers.0.self_attn.q_proj.weight"
    shape   tuple   the full weight's shape, PyTorch's [out, in]
    cfg             the model's sizes: num_heads (H_q), num_kv_heads (H_kv), head_dim (D),
                    intermediate_size (I), vocab_size (V)
    rank, tp int    this rank, of tp ranks
    ->      Slice(dim, start, stop, size) (import it: ``from l12_tensor_parallel.shard import Slice``),
            or None for a weight every rank holds whole (the norms)

The rule, per weight (lesson 12.1):
    q_proj (weight, bias)             dim 0, this rank's H_q/tp query heads: rows of D each
    k_proj, v_proj (weight, bias)     dim 0, the KV heads those query heads read: max(1, H_kv/tp)
                                      heads from head rank*H_kv//tp (H_kv < tp: a head on several ranks)
    gate_proj, up_proj                dim 0, I/tp channels
    o_proj, down_proj (weights)       dim 1 (row-parallel: the input columns), shape[1]/tp of them
    model.embed_tokens, lm_head       dim 0, ceil(V/tp) rows each (the last rank's stop may pass V:
                                      the loader pads those rows with zeros)
    anything else                     None
Example: tiny Qwen3 (H_q 4, H_kv 2, D 16), tp 2, rank 1, "model.layers.0.self_attn.k_proj.weight"
-> Slice(0, 16, 32, 16).
"""


def slice_for(name, shape, cfg, rank, tp):
    raise NotImplementedError("slice_for: column-parallel weights by output rows (heads, channels), row-parallel "
                              "ones by input columns, the vocabulary by rows; None for the rest")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l12_shards.py::test_each_ranks_shard_equals_the_matching_slice_of_the_full_weight",
    "tests/test_l12_shards.py::test_the_ranks_forward_pass_is_the_whole_models",
]
