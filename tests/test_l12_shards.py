"""Stage 12's sharding, in one process: each rank's weights against the full checkpoint, sliced here
by heads and channels (not by shard.py's rule), and the ranks' forward pass against the whole
model's, the ranks as threads joined by a real gloo group. Planted: a row-parallel weight split
along its output rows, and a row-parallel layer without its all-reduce."""
import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from l1_dense.checkpoint import load_model
from l1_dense.dense_kv import DenseKVCache, DenseMeta
from l12_tensor_parallel import layers, shard
from l12_tensor_parallel.comm import Comm
from plumbing.errors import UserError
from plumbing.tiny import tiny_checkpoint

#: (family, tp): qwen3 and llama split 2 KV heads 2 ways and (tp 4) share each between 2 ranks;
#: qwen2 (tied embeddings, q/k/v biases) puts its one KV head on both ranks
CASES = [("qwen3", 2), ("qwen3", 4), ("llama", 2), ("llama", 4), ("qwen2", 2), ("qwen2-hybrid", 2)]


def expected(full: dict, cfg, name: str, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s part of weight ``name``, from the heads and channels it owns."""
    w, D = full[name], cfg.head_dim
    heads = range(rank * cfg.num_heads // tp, (rank + 1) * cfg.num_heads // tp)
    kv_heads = sorted({h * cfg.num_kv_heads // cfg.num_heads for h in heads})   # the KV heads they read
    if ".q_proj." in name:
        return w.view(cfg.num_heads, D, -1)[list(heads)].reshape(-1, *w.shape[1:])
    if ".k_proj." in name or ".v_proj." in name:
        return w.view(cfg.num_kv_heads, D, -1)[kv_heads].reshape(-1, *w.shape[1:])
    if name.endswith("o_proj.weight"):
        return w.view(w.shape[0], cfg.num_heads, D)[:, list(heads)].reshape(w.shape[0], -1)
    if ".gate_proj." in name or ".up_proj." in name:
        return w.chunk(tp, 0)[rank]
    if ".down_proj." in name:
        return w.chunk(tp, 1)[rank]
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        n = -(-cfg.vocab_size // tp)
        rows = torch.zeros(n, w.shape[1])
        mine = w[rank * n:(rank + 1) * n]
        rows[:len(mine)] = mine
        return rows
    return w                                                    # norms: every rank


def mismatches(model, full: dict, cfg, rank: int, tp: int) -> list[str]:
    got = dict(model.named_parameters())
    return [n for n in full if n in got and not torch.equal(got[n].data, expected(full, cfg, n, rank, tp))]


@pytest.mark.parametrize("family,tp", CASES)
def test_each_ranks_shard_equals_the_matching_slice_of_the_full_weight(family, tp):
    path = tiny_checkpoint(family)
    whole = load_model(path, "cpu", torch.float32)
    full, cfg = {n: p.data for n, p in whole.named_parameters()}, whole.cfg
    for rank in range(tp):
        model = shard.load_shard(path, "cpu", torch.float32, rank, tp)        # a worker: slices from the files
        assert not mismatches(model, full, cfg, rank, tp)
        assert model.cfg.num_heads == cfg.num_heads // tp and model.cfg.vocab_size == cfg.vocab_size
    rank0 = shard.shard_model(load_model(path, "cpu", torch.float32), 0, tp)  # rank 0: its loaded model, in place
    assert not mismatches(rank0, full, cfg, 0, tp)


def test_a_planted_wrong_shard_is_refused_in_one_line(monkeypatch):
    """Planted: a row-parallel weight (o_proj, down_proj) split along its output rows (dim 0)."""
    right = shard.slice_for

    def rows_split(name, shape, cfg, rank, tp):
        sl = right(name, shape, cfg, rank, tp)
        if shard.ROW.search(name):
            n = shape[0] // tp
            return shard.Slice(0, rank * n, (rank + 1) * n, n)
        return sl
    monkeypatch.setattr(shard, "slice_for", rows_split)
    with pytest.raises(UserError) as e:
        shard.load_shard(tiny_checkpoint("qwen3"), "cpu", torch.float32, 1, 2)
    assert "o_proj.weight is (32, 128), its layer needs (64, 64)" in str(e.value) and "\n" not in str(e.value)


def ranks_logits(path, tp: int, ids: list[int]) -> torch.Tensor:
    """Rank 0's logits for a prompt, every rank a thread with its shard and its own dense KV cache."""
    store, out, errors = dist.HashStore(), [None] * tp, []
    models = [shard.load_shard(path, "cpu", torch.float32, r, tp) for r in range(tp)]

    def run(r):
        try:
            pg = dist.ProcessGroupGloo(store, r, tp, datetime.timedelta(seconds=30))
            layers.install(models[r], Comm(pg, r, tp))
            kv = DenseKVCache(models[r].cfg, len(ids), "cpu", torch.float32)
            meta = DenseMeta(positions=torch.arange(len(ids)), logits_indices=torch.tensor([len(ids) - 1]), start=0)
            out[r] = models[r](torch.tensor(ids), kv, meta)
        except Exception as e:                      # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out[0]


def whole_logits(path, ids: list[int]) -> torch.Tensor:
    model = load_model(path, "cpu", torch.float32)
    meta = DenseMeta(positions=torch.arange(len(ids)), logits_indices=torch.tensor([len(ids) - 1]), start=0)
    return model(torch.tensor(ids), DenseKVCache(model.cfg, len(ids), "cpu", torch.float32), meta)


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]


@pytest.mark.parametrize("family,tp", [("qwen3", 2), ("qwen3", 4), ("qwen2", 2)])
def test_the_ranks_forward_pass_is_the_whole_models(family, tp):
    path = tiny_checkpoint(family)
    got, want = ranks_logits(path, tp, PROMPT), whole_logits(path, PROMPT)
    assert got.shape == want.shape and (got - want).abs().max() < 1e-4


def test_a_row_parallel_layer_without_its_all_reduce_is_caught(monkeypatch):
    """Planted: the MLP's down_proj partial sums go on unsummed (the attention's are still reduced)."""
    from l1_dense.model import MLP
    right = layers._all_reduce_output
    monkeypatch.setattr(layers, "_all_reduce_output",
                        lambda comm: lambda m, a, o: o if isinstance(m, MLP) else right(comm)(m, a, o))
    path = tiny_checkpoint("qwen3")
    assert (ranks_logits(path, 2, PROMPT) - whole_logits(path, PROMPT)).abs().max() > 1e-2


@pytest.mark.parametrize("kw,needle", [
    (dict(tensor_parallel_size=3), "tensor_parallel_size 3 does not divide the model's 4 query heads"),
    (dict(tensor_parallel_size=2, distributed_backend="nccl"), "distributed_backend='nccl' needs CUDA GPUs"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be a positive integer"),
])
def test_bad_sizes_and_backends_are_one_line_each(kw, needle):
    from l12_tensor_parallel import LLM
    with pytest.raises(UserError) as e:
        LLM(None, device="cpu", impl="torch", **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_more_ranks_than_gpus_is_one_line(monkeypatch):
    from l12_tensor_parallel.stage import backend_for
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match=r"^tensor_parallel_size 4 needs 4 GPUs \(one per rank\) and 2 are visible"):
        backend_for("auto", "cuda", 4)
    assert backend_for("auto", "cuda", 2) == "nccl" and backend_for("auto", "cpu", 4) == "gloo"


def test_a_daemonic_process_is_refused_before_any_worker_starts(monkeypatch):
    """Python forbids a daemonic process children (stage 10's engine core is one)."""
    import multiprocessing as mp
    from l12_tensor_parallel import LLM
    monkeypatch.setattr(mp.current_process(), "daemon", True)
    with pytest.raises(UserError, match="this process is a daemonic one"):
        LLM(None, device="cpu", impl="torch", tensor_parallel_size=2)
