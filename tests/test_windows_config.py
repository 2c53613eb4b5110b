"""Sliding windows in the config: read as transformers reads them, refused where they cannot be honoured.

Stages 1-7 attend to every key. A windowed checkpoint given to them must fail with a clear error
at its first forward pass, never run with another meaning (issue 19: a Qwen2 config with
``use_sliding_window`` used to load without a word and diverge from transformers past the window).
"""
import json
import shutil

import pytest
import torch

from harness.stages import STAGES, run_stages
from l1_dense.config import ModelConfig
from plumbing.errors import UserError, WindowsUnsupported
from plumbing.tiny import tiny_checkpoint

PROMPT = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]
BASE = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=259, intermediate_size=128)


def windows(arch, **fields):
    return ModelConfig.from_dict({**BASE, "architectures": [arch], **fields}).layer_windows


def test_tiny_windowed_checkpoints_read_as_transformers_does():
    from transformers import AutoConfig
    for family, want in (("mistral", (20, 20)), ("qwen2-hybrid", (12, None, 12))):
        path = tiny_checkpoint(family)
        assert ModelConfig.from_dir(path).layer_windows == want
        hf = AutoConfig.from_pretrained(str(path))
        types = getattr(hf, "layer_types", None) or ["sliding_attention"] * hf.num_hidden_layers
        assert tuple(hf.sliding_window if t == "sliding_attention" else None for t in types) == want


@pytest.mark.parametrize("arch,fields,want", [
    ("MistralForCausalLM", dict(sliding_window=4096), (4096,) * 4),
    ("MistralForCausalLM", dict(sliding_window=None), ()),                 # Mistral 7B v0.2+: no window
    ("MistralForCausalLM", {}, (4096,) * 4),                                # absent: transformers' default
    ("Qwen2ForCausalLM", dict(sliding_window=64), ()),                      # use_sliding_window off
    ("Qwen2ForCausalLM", dict(sliding_window=64, use_sliding_window=True, max_window_layers=2), (None, None, 64, 64)),
    ("Qwen3ForCausalLM", dict(sliding_window=8, use_sliding_window=True, max_window_layers=0,
                              layer_types=["full_attention", "sliding_attention"] * 2), (None, 8, None, 8)),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, max_window_layers=4), ()),   # no layer reaches it
    ("LlamaForCausalLM", {}, ()),
])
def test_windows_per_family(arch, fields, want):
    assert windows(arch, **fields) == want


@pytest.mark.parametrize("arch,fields,words", [
    ("LlamaForCausalLM", dict(sliding_window=512), "LlamaForCausalLM ignores"),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, layer_types=["chunked_attention"] * 4), "chunked_attention"),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=8, layer_types=["full_attention"]), "one per layer"),
    ("Qwen2ForCausalLM", dict(layer_types=["sliding_attention"] * 4), "the window is off"),
    ("MistralForCausalLM", dict(sliding_window=0), "positive int"),
])
def test_windows_the_skeleton_cannot_honour_are_refused(arch, fields, words):
    with pytest.raises(UserError, match=words):
        windows(arch, **fields)


@pytest.mark.parametrize("stage", list(STAGES)[:list(STAGES).index("l8_sliding_window")])   # the stages before windows
def test_stages_without_windows_refuse_a_windowed_checkpoint(tiny, stage):
    model, _ = tiny("mistral")
    with pytest.raises(WindowsUnsupported, match="sliding window .* stage 8"):
        run_stages(model, PROMPT, 2, only=[stage])


def test_the_window_changes_transformers_tokens(tmp_path):
    """The premise of the refusal and of stage 8's tests: on these checkpoints the window matters."""
    from harness.oracle import hf_generate
    for family in ("mistral", "qwen2-hybrid"):
        src, dst = tiny_checkpoint(family), tmp_path / family
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(sliding_window=None, use_sliding_window=False)
        cfg.pop("layer_types", None)
        (dst / "config.json").write_text(json.dumps(cfg))
        windowed = hf_generate(src, PROMPT, 20, "cpu", torch.float32).token_ids
        assert windowed != hf_generate(dst, PROMPT, 20, "cpu", torch.float32).token_ids
        assert len(set(windowed)) >= 10, windowed                  # and the output is diverse
