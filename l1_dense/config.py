"""One config dataclass, read from a checkpoint's ``config.json``.

Three families share one skeleton; they differ in a handful of switches:

| family | q/k/v bias | per-head q_norm/k_norm | head_dim          | RoPE scaling      |
|--------|------------|------------------------|-------------------|-------------------|
| Qwen3  | no         | yes                    | explicit in json  | none              |
| Qwen2  | yes        | no                     | hidden / heads    | none              |
| Llama  | no         | no                     | hidden / heads    | optional `llama3` |

``PRESETS`` holds the shapes of real models, used by benchmarks and the lessons' memory maths
without downloading anything.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.errors import UserError

#: config.json "architectures" entry -> family name used in this project.
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}


@dataclass(frozen=True)
class ModelConfig:
    family: str                      # "qwen3" | "qwen2" | "llama"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int                   # H_q
    num_kv_heads: int                # H_kv (GQA when < H_q)
    head_dim: int                    # D
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3", "factor": .., ...} or None
    attention_bias: bool = False     # bias on q/k/v projections (Qwen2)
    qk_norm: bool = False            # per-head RMSNorm on q and k before RoPE (Qwen3)
    tie_word_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    architecture: str = ""

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers, in bfloat16 (2 bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    @classmethod
    def from_dict(cls, cfg: dict, generation_config: dict | None = None) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise UserError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}. "
                f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}. "
                "Pick a checkpoint of one of these families (e.g. Qwen/Qwen3-0.6B)."
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        # transformers 5 writes RoPE settings as `rope_parameters`; older files use
        # `rope_theta` + `rope_scaling`. Accept both.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        scaling = rope or cfg.get("rope_scaling") or None
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            elif kind != "llama3":
                raise UserError(
                    f"unsupported RoPE scaling type {kind!r}; this project implements 'llama3' "
                    "scaling only. Use a checkpoint without rope_scaling or with rope_type llama3."
                )
        eos = []
        for src in (cfg, generation_config or {}):
            e = src.get("eos_token_id")
            eos += e if isinstance(e, list) else ([e] if e is not None else [])
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=scaling,
            # Qwen2 has q/k/v bias and no flag for it; Llama/Qwen3 say `attention_bias`.
            attention_bias=True if family == "qwen2" else bool(cfg.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=tuple(dict.fromkeys(eos)),
            architecture=arch,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        """config.json (and generation_config.json, if present). A file that is not a JSON object,
        or a config without a field the skeleton needs, is one UserError naming the file."""
        path = Path(path)
        cfg = read_json(path / "config.json")
        gen_path = path / "generation_config.json"
        gen = read_json(gen_path) if gen_path.exists() else None
        try:
            return cls.from_dict(cfg, gen)
        except KeyError as e:
            raise UserError(f"{path / 'config.json'}: no {e.args[0]!r} field, which a Qwen3/Qwen2/Llama config needs: "
                            "the file is incomplete; get the checkpoint's config.json again.") from None
        except (TypeError, ValueError, AttributeError) as e:
            if isinstance(e, UserError):
                raise
            raise UserError(f"{path / 'config.json'}: a field has the wrong type ({e}): get the checkpoint's "
                            "config.json again.") from None


def read_json(file: Path) -> dict:
    """A JSON object from ``file``, or a UserError that names the file and what is wrong with it."""
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{file}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}): the file is "
                        "broken or truncated; get it again.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: cannot be read ({type(e).__name__}: {e}).") from None
    if not isinstance(data, dict):
        raise UserError(f"{file}: a JSON {type(data).__name__}, where a JSON object was expected: get the file again.")
    return data


def _preset(family, vocab, hidden, inter, layers, heads, kv_heads, head_dim, ctx, tied):
    return ModelConfig(family=family, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       max_position_embeddings=ctx, qk_norm=family == "qwen3",
                       tie_word_embeddings=tied, rope_theta=1e6)


#: Shapes of real checkpoints (from their config.json), for benchmarks and memory maths.
PRESETS = {
    "Qwen/Qwen3-0.6B": _preset("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, 40960, True),
    "Qwen/Qwen3-8B": _preset("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, 40960, False),
}
