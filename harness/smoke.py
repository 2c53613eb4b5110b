"""What every smoke script does before its stage runs: device, dtype, checkpoint, tokenizer, prompt.

Its flags are parsed and checked first (plumbing/cli.py), so torch loads only here.
"""
from __future__ import annotations

from dataclasses import dataclass

from plumbing.cli import DEFAULT_PROMPT, NO_TEXT, check_device_dtype, dtype_name_of, note
from plumbing.errors import UserError


@dataclass
class Loaded:
    model: object                   # l1_dense.model.CausalLM
    tokenizer: object
    prompt_ids: list[int]
    label: str
    device: str
    dtype_name: str

    def text(self, ids: list[int]) -> str:
        return NO_TEXT if self.tokenizer is None else self.tokenizer.decode(ids)


def load(args) -> Loaded:
    """Device, dtype, checkpoint, tokenizer, prompt ids and the model (torch loads here)."""
    from l1_dense.checkpoint import load_model, load_tokenizer, resolve_model_dir
    from l1_dense.config import ModelConfig
    from plumbing.runtime import default_device, default_dtype
    device = args.device or default_device()
    dtype_name = dtype_name_of(default_dtype(device)) if args.dtype in (None, "auto") else args.dtype
    dtype = check_device_dtype(device, dtype_name)
    if device == "cpu" and dtype_name != "float32":
        note(f"--dtype {dtype_name} on cpu: its tokens differ from the float32 ones the lessons quote "
             "(the lessons' CPU outputs are float32, the default on cpu).")
    path = resolve_model_dir(args.model)
    ModelConfig.from_dir(path)                       # a broken config.json fails here, named, before the tokenizer
    tokenizer = load_tokenizer(path)
    if args.prompt_ids is not None:
        try:
            prompt_ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise UserError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}.") from None
    else:
        prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
        if tokenizer is None:
            raise UserError(f"{path} has no tokenizer files, so --prompt cannot be encoded: pass --prompt-ids 1,2,3.")
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    model = load_model(path, device, dtype)
    return Loaded(model, tokenizer, prompt_ids, args.model or "tiny-qwen3 (built-in)", device, dtype_name)
