"""Find a checkpoint (local directory or hub id), read its weights, build the model.

Weights are read straight from ``*.safetensors`` with ``safe_open``: one file, or the shards
listed in ``model.safetensors.index.json``. No transformers model class is involved; the tensor
names in the files are the module names of :mod:`l1_dense.model`.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig, read_json
from plumbing.errors import UserError
from .model import CausalLM, rope_inv_freq

_HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model"]


def resolve_model_dir(model: str | None) -> Path:
    """A local directory, a hub id (downloaded once into the HF cache), or a built-in tiny model:
    None or ``tiny-qwen3`` (the default), ``tiny-llama``, ``tiny-qwen2``."""
    from plumbing.tiny import SPECS, tiny_checkpoint
    if model is None:
        return tiny_checkpoint("qwen3")
    if model.startswith("tiny-") and model[5:] in SPECS:
        return tiny_checkpoint(model[5:])
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"{path} has no config.json: point --model at a Hugging Face checkpoint directory.")
        return path
    if model.startswith("tiny-"):
        names = ", ".join(f"tiny-{f}" for f in SPECS)
        raise UserError(f"unknown built-in model {model!r}: the built-in tiny models are {names}.")
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise UserError(f"model path {model!r} does not exist. Pass an existing checkpoint directory "
                        "or a hub id such as Qwen/Qwen3-0.6B (leave --model out for the built-in tiny model).")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, allow_patterns=_HUB_FILES))
    except Exception as e:  # offline, unknown id, gated repo ...
        raise UserError(
            f"could not get {model!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0][:160]}). "
            "Check the id and your network, or download it once and pass its local directory."
        ) from None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UserError(f"{index}: no 'weight_map' object: the index is broken; get it again.")
        shards = [path / s for s in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.exists()]
        if missing:
            raise UserError(f"{index} names weight files that are not in {path}: {', '.join(missing[:3])}: "
                            "the download is incomplete; get them.")
        return shards
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UserError(f"no *.safetensors weights in {path}. This project reads safetensors checkpoints only.")
    return files


def _read_weights(f: Path, params: dict, device: str, dtype: torch.dtype) -> dict:
    """The tensors of one safetensors file that the skeleton has a parameter for."""
    out = {}
    try:
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                if name in params:
                    out[name] = sf.get_tensor(name).to(device=device, dtype=dtype)
    except Exception as e:  # safetensors' own error type for a truncated or corrupt file, or an OSError
        msg = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise UserError(f"{f}: cannot read the weights ({msg}): the file is truncated or corrupt; get it again.") from None
    return out


def load_model(path: Path, device: str, dtype: torch.dtype) -> CausalLM:
    """Build the skeleton on ``meta`` (no memory), then fill it from the safetensors files."""
    cfg = ModelConfig.from_dir(path)
    with torch.device("meta"):
        model = CausalLM(cfg)
    params = dict(model.named_parameters())  # a tied lm_head appears once, as embed_tokens
    loaded = {}
    for f in _weight_files(path):
        loaded.update(_read_weights(f, params, device, dtype))
    missing = set(params) - set(loaded)
    if missing:
        raise UserError(f"checkpoint {path} is missing weights: {sorted(missing)[:5]}... "
                        "Is it a complete Qwen3/Qwen2/Llama checkpoint?")
    wrong = [f"{n} is {tuple(loaded[n].shape)}, config.json says {tuple(p.shape)}"
             for n, p in params.items() if tuple(loaded[n].shape) != tuple(p.shape)]
    if wrong:
        raise UserError(f"checkpoint {path}: weights do not match {path / 'config.json'}: {wrong[0]}"
                        + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else "") + ".")
    model.load_state_dict(loaded, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(cfg).to(device)  # the buffer was built on meta: compute it for real
    return model.eval()


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships no tokenizer files."""
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # a broken tokenizer.json / tokenizer_config.json, a missing vocab file ...
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise UserError(f"{path}: the tokenizer files cannot be loaded ({msg}): get them again, or remove them and "
                        "pass --prompt-ids.") from None
