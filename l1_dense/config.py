"""One config dataclass, read from a checkpoint's ``config.json``.

Three families share one skeleton; they differ in a handful of switches:

| family | q/k/v bias | per-head q_norm/k_norm | head_dim          | RoPE scaling      |
|--------|------------|------------------------|-------------------|-------------------|
| Qwen3  | no         | yes                    | explicit in json  | none              |
| Qwen2  | yes        | no                     | hidden / heads    | none              |
| Llama  | no         | no                     | hidden / heads    | optional `llama3` |
| Mistral| no         | no                     | json or h / heads | none              |

Some configs also give layers a **sliding window** (Mistral: every layer; Qwen2/Qwen3 with
``use_sliding_window``: the layers from ``max_window_layers`` on, or those ``layer_types`` marks
``"sliding_attention"``). ``layer_windows`` holds it per layer, as transformers reads it: a query
at position p sees keys p - window < j <= p. Only a KV object that implements windows may run
such a model; ``CausalLM.forward`` refuses any other, since attending to every key
would silently give other tokens.

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
    "MistralForCausalLM": "mistral",                 # Llama's layers, every one with a sliding window
}
FULL_LAYER_TYPES = ("full_attention", "attention")      # "attention": transformers' legacy name


@dataclass(frozen=True)
class ModelConfig:
    family: str                      # "qwen3" | "qwen2" | "llama" | "mistral"
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
    layer_windows: tuple = ()        # per layer: the sliding window (keys) or None; () = none windowed

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.layer_windows)

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
            layer_windows=read_windows(cfg, family),
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


def read_windows(cfg: dict, family: str) -> tuple:
    """Each layer's sliding window (or None), by transformers' rules for the family; () if none.
    A config whose windows transformers would read another way, or not at all, is refused."""
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window", None if family == "llama" else 4096)   # transformers' default if absent
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise UserError(f"sliding_window must be a positive int or null, got {window!r}: fix config.json.")
    if family == "mistral":                           # MistralModel: every layer, if set
        return (window,) * n if window is not None else ()
    if family == "llama":
        if window is not None or cfg.get("layer_types"):
            raise UserError("this Llama config sets sliding_window/layer_types, which transformers' LlamaForCausalLM "
                            "ignores: the model was probably meant as another architecture. Remove the fields to run "
                            "it as Llama, or set architectures to MistralForCausalLM for a sliding window.")
        return ()
    if not cfg.get("use_sliding_window", False):      # Qwen2/Qwen3: the window is off unless asked for
        window = None
    types = cfg.get("layer_types") or ["sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28)
                                       else "full_attention" for i in range(n)]
    unknown = sorted({t for t in types if t not in FULL_LAYER_TYPES and t != "sliding_attention"})
    if unknown or len(types) != n:
        raise UserError(f"layer_types {unknown or types!r}: this project implements full_attention and "
                        f"sliding_attention, one per layer ({n}).")
    if window is None and "sliding_attention" in types:
        raise UserError("layer_types has sliding_attention layers but the window is off (use_sliding_window false "
                        "or sliding_window null): set both, or mark the layers full_attention.")
    out = tuple(window if t == "sliding_attention" else None for t in types)
    return out if any(w is not None for w in out) else ()


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
