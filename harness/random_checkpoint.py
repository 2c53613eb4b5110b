"""A random-weight Hugging Face checkpoint of a real model's shape, for the GPU benchmarks and the
GPU runs of the lesson scripts: the shape decides the bytes and FLOPs a step moves, the weights do
not (a random model's tokens are meaningless, so nothing compares them with a trained model's)."""
from __future__ import annotations

import os


def build_checkpoint(path: str, preset: str = "Qwen/Qwen3-0.6B", num_layers: int | None = None) -> str:
    """A random-weight HF checkpoint of the preset's shape (bf16 safetensors) in ``path``, built once.
    ``num_layers``: fewer decoder layers than the preset's (every layer has the same shapes, so a
    check of kernel shapes needs two, not 28)."""
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from l1_dense.config import PRESETS
    c = PRESETS[preset]
    cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=num_layers or c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
                      max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
                      tie_word_embeddings=c.tie_word_embeddings, eos_token_id=151645, bos_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    print(f"built a random {preset}-shaped checkpoint" + (f" ({num_layers} layers)" if num_layers else "")
          + f" in {path}")
    del model
    return path
