"""Built-in tiny checkpoints, generated on first use: no network, no download.

Each is a complete Hugging Face directory (``config.json``, ``generation_config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``) that
``AutoModelForCausalLM`` and ``AutoTokenizer`` load offline, so the Hugging Face oracle runs on
exactly the bytes our skeleton reads.

Byte-identical everywhere: the weights come from NumPy's seeded ``default_rng`` (torch's RNG
differs across versions and devices), drawn in sorted-name order, and every JSON file is written
with sorted keys. ``tests/test_tiny_checkpoint.py`` pins the SHA-256 of every file.

The tokenizer is byte-level BPE with no merges: token ``i`` (i < 256) is byte ``i``, followed by
three special tokens. A random model's text is gibberish; the point of the tiny model is that
every stage emits the *same* token ids as the oracle.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

VERSION = 2            # 2: tokenizer_config.json has a chat template (ChatML, as Qwen's)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: ChatML, the format of Qwen's templates (without tools): LLM.chat and the server's chat endpoint
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VOCAB = 256 + len(SPECIALS)
EOS = 256

_BASE = dict(vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-6, eos_token_id=EOS,
             bos_token_id=None, pad_token_id=EOS, hidden_act="silu", attention_dropout=0.0,
             initializer_range=0.02, use_cache=True, torch_dtype="float32")

#: family -> (config.json fields, init scales, seed). Shapes cover the skeleton's switches; the
#: scales were picked so that greedy output is diverse (a tied random model tends to repeat its
#: last input token, so its embedding is shrunk and its residual branches amplified).
SPECS = {
    # explicit head_dim (4 * 32 != 64), q/k norm, GQA 2:1, untied lm_head -- like Qwen3-8B
    "qwen3": (dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64,
                   intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, rope_theta=1000000.0, attention_bias=False,
                   tie_word_embeddings=False, sliding_window=None, use_sliding_window=False),
              dict(embed=1.0, out_gain=1.0), 3),
    # GQA 4:1, head_dim 8, untied lm_head, Llama 3 RoPE scaling
    "llama": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                   intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=2, rope_theta=500000.0, attention_bias=False, mlp_bias=False,
                   tie_word_embeddings=False,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=64)),
              dict(embed=1.0, out_gain=1.0), 1),
    # q/k/v biases, GQA 6:1, head_dim 16, tied embeddings
    "qwen2": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=96,
                   intermediate_size=192, num_hidden_layers=2, num_attention_heads=6,
                   num_key_value_heads=1, rope_theta=1000000.0, tie_word_embeddings=True,
                   sliding_window=None, use_sliding_window=False),
              dict(embed=0.3, out_gain=6.0), 2),
    # stage 8: Mistral (Llama's layers, explicit head_dim), every layer sees the last 20 keys:
    # shorter than a usual prompt + 20 new tokens, and not a multiple of a 16-token block
    "mistral": (dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=64,
                     intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, rope_theta=10000.0, tie_word_embeddings=False,
                     sliding_window=20),
                dict(embed=1.0, out_gain=1.0), 4),
    # stage 8: a hybrid Qwen2, windowed layers 0 and 2 (12 keys) around a full-attention layer 1
    "qwen2-hybrid": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64,
                          intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                          num_key_value_heads=2, rope_theta=1000000.0, tie_word_embeddings=False,
                          use_sliding_window=True, sliding_window=12, max_window_layers=0,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
                     dict(embed=0.3, out_gain=6.0), 5),
}


def cache_root() -> Path:
    root = os.environ.get("TRITON_LLM_LESSONS_CACHE") or Path.home() / ".cache" / "triton-llm-lessons"
    return Path(root)


def _weights(cfg: dict, scales: dict, seed: int) -> dict[str, np.ndarray]:
    """Shapes of every tensor, then values from one seeded generator in sorted-name order."""
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    hq, hkv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (VOCAB, h), "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (VOCAB, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (hq, h), p + "self_attn.k_proj.weight": (hkv, h),
                       p + "self_attn.v_proj.weight": (hkv, h), p + "self_attn.o_proj.weight": (h, hq),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
        if cfg["model_type"] == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if cfg["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (hq,), p + "self_attn.k_proj.bias": (hkv,),
                           p + "self_attn.v_proj.bias": (hkv,)})
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name.endswith("norm.weight"):          # around 1, as trained norms are
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.1 * rng.standard_normal(shape)
        elif "embed_tokens" in name or "lm_head" in name:
            w = scales["embed"] * rng.standard_normal(shape)
            w[256:] *= 0.3                        # special tokens (EOS): rarely the argmax
        else:                                     # 1/sqrt(fan_in): activations keep their scale
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                w *= scales["out_gain"]           # residual branches vs the embedding
        out[name] = w.astype(np.float32)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which the ByteLevel pre-tokenizer uses."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def _tokenizer_json() -> dict:
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    added = [dict(id=256 + i, content=t, single_word=False, lstrip=False, rstrip=False,
                  normalized=False, special=True) for i, t in enumerate(SPECIALS)]
    level = dict(type="ByteLevel", add_prefix_space=False, trim_offsets=True, use_regex=True)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def write_checkpoint(family: str, path: Path) -> None:
    from safetensors.numpy import save_file
    cfg, scales, seed = SPECS[family]
    cfg = {**_BASE, **cfg}
    path.mkdir(parents=True, exist_ok=True)
    dump = lambda name, obj: (path / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    dump("config.json", cfg)
    dump("generation_config.json", {"eos_token_id": EOS, "pad_token_id": EOS, "do_sample": False})
    dump("tokenizer.json", _tokenizer_json())
    dump("tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": SPECIALS[0],
                                   "pad_token": SPECIALS[0], "model_max_length": cfg["max_position_embeddings"],
                                   "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE})
    save_file(_weights(cfg, scales, seed), str(path / "model.safetensors"), metadata={"format": "pt"})


def tiny_checkpoint(family: str = "qwen3") -> Path:
    """Path of the tiny checkpoint of ``family``, generated into the cache on first use."""
    if family not in SPECS:
        raise ValueError(f"no tiny checkpoint for {family!r}; choose from {sorted(SPECS)}")
    path = cache_root() / f"tiny-{family}-v{VERSION}"
    if not (path / "model.safetensors").exists():
        cache_root().mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_root(), prefix=f".tmp-{family}-"))
        write_checkpoint(family, tmp)
        try:
            tmp.rename(path)  # atomic: concurrent first uses never see a half-written directory
        except OSError:       # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return path
