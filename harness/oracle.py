"""The oracle: Hugging Face transformers' own model class and greedy generate() on the same
checkpoint files, and how a stage's generation is compared with it (tokens identical, the first
differing step, the logits' largest difference before it, the oracle's top-1 margin there)."""
from __future__ import annotations

import torch

from l1_dense.generate import Generation


def hf_model(path, device, dtype):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


def hf_generate(path, prompt_ids, max_new_tokens, device, dtype) -> Generation:
    """The oracle: transformers' own model class and generate(), on the same checkpoint files."""
    hf = hf_model(path, device, dtype)
    out = hf.generate(torch.tensor([prompt_ids], device=device), max_new_tokens=max_new_tokens,
                      do_sample=False, top_k=None, top_p=None, temperature=None,
                      output_logits=True, return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt_ids):].tolist()
    logits = [step[0].float().cpu() for step in out.logits]
    reason = "length" if len(ids) == max_new_tokens else "stop"     # vLLM's finish_reason names
    return Generation(ids, reason, logits)


def compare(ref: Generation, gen: Generation) -> dict:
    """Tokens identical?, first differing step, max |logit diff| before it, oracle's top-1 margin there."""
    first = next((i for i, (a, b) in enumerate(zip(ref.token_ids, gen.token_ids)) if a != b), None)
    if first is None and len(ref.token_ids) != len(gen.token_ids):
        first = min(len(ref.token_ids), len(gen.token_ids))
    upto = len(ref.token_ids) if first is None else first
    diff = max((float((a - b).abs().max()) for a, b in zip(ref.logits[:upto], gen.logits[:upto])), default=0.0)
    margin = None
    if first is not None and first < len(ref.logits):
        top2 = ref.logits[first].topk(2).values
        margin = float(top2[0] - top2[1])
    return {"identical": first is None, "first_diff": first, "max_logit_diff": diff, "margin_at_diff": margin}
