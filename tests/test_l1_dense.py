"""Stage 1: the skeleton against Hugging Face, the tiny checkpoints, the interpreter switch, bad input."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from harness.stages import run_stages
from harness.oracle import hf_generate
from l1_dense.checkpoint import load_model
from l1_dense.config import ModelConfig
from plumbing.errors import UserError
from plumbing.runtime import default_device
from plumbing.tiny import tiny_checkpoint, write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102, 32, 70, 114, 97, 110, 99, 101, 32, 105, 115]

# SHA-256 of every file of the tiny Qwen3, recorded once (CPU, torch 2.13, numpy 2.4) and
# confirmed on the GPU machine (torch 2.11, another numpy and transformers): the bytes must not
# depend on the machine or the torch version. Changing the generator on purpose means bumping
# tiny.VERSION and these pins together.
PINNED = {
    "qwen3": {
        "config.json": "5c1641a367630eef5a73d27ea8508d3b70acac81bf5f385e5b07bf0b16252247",
        "generation_config.json": "68ae97cdc84d9eb168bf2e88b8114999f08d8b407e7a51096fe1e88f1c89e35e",
        "model.safetensors": "b5e105ecd38e52babb193b3371c4805f79622e065a71870063bd9f9fc028521a",
        "tokenizer.json": "f6dc5c1e1da2b55da487cdd410a812729812e2aed3761f42441bf74bedf3729b",
        "tokenizer_config.json": "6728d7ae2503d53de8af10c1ea6f55d9cb5641bca8e56f17199f32e0aeaf9cf6",
    },
}


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_checkpoint_is_byte_identical_to_pins(tmp_path):
    write_checkpoint("qwen3", tmp_path)
    got = {p.name: _sha(p) for p in sorted(tmp_path.iterdir())}
    assert got == PINNED["qwen3"]


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_tiny_checkpoint_loads_in_transformers_offline(family):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = tiny_checkpoint(family)
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok("Hi é")["input_ids"] == [72, 105, 32, 195, 169]   # byte-level: one id per UTF-8 byte
    assert tok.decode([72, 105, 32, 195, 169]) == "Hi é"
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert model.config.architectures[0] == ModelConfig.from_dir(path).architecture


def test_tiny_qwen3_greedy_output_is_diverse(tiny):
    model, path = tiny("qwen3")
    gen = run_stages(model, PROMPT, 20, only=["l1_dense"])["l1_dense"]
    assert len(gen.token_ids) == 20 and len(set(gen.token_ids)) >= 10, gen.token_ids


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_l1_dense_tokens_match_hf_generate_exactly(tiny, family):
    model, path = tiny(family)
    ref = hf_generate(path, PROMPT, 20, default_device(), torch.float32)
    gen = run_stages(model, PROMPT, 20, only=["l1_dense"])["l1_dense"]
    assert gen.token_ids == ref.token_ids
    worst = max(float((a - b).abs().max()) for a, b in zip(ref.logits, gen.logits))
    assert worst < 1e-4, worst   # fp32: same maths, same order, up to SDPA vs eager rounding


def test_config_switches_per_family():
    q3 = ModelConfig.from_dir(tiny_checkpoint("qwen3"))
    q2 = ModelConfig.from_dir(tiny_checkpoint("qwen2"))
    ll = ModelConfig.from_dir(tiny_checkpoint("llama"))
    assert (q3.qk_norm, q3.head_dim, q3.hidden_size // q3.num_heads) == (True, 32, 16)  # explicit head_dim
    assert (q2.attention_bias, q2.qk_norm, q2.tie_word_embeddings) == (True, False, True)
    assert (ll.rope_scaling["rope_type"], ll.tie_word_embeddings, ll.num_heads // ll.num_kv_heads) == ("llama3", False, 4)


def test_llama3_rope_inv_freq_matches_transformers():
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from l1_dense.model import rope_inv_freq
    path = tiny_checkpoint("llama")
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](AutoConfig.from_pretrained(str(path)), "cpu")
    ours = rope_inv_freq(ModelConfig.from_dir(path))
    assert not torch.equal(ours, 1.0 / (500000.0 ** (torch.arange(0, 8, 2).float() / 8)))  # scaling did something
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_sharded_checkpoint_gives_identical_logits(tiny, tmp_path):
    from safetensors.torch import load_file, save_file
    model, path = tiny("llama")
    for f in path.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard), metadata={"format": "pt"})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: s for s, ks in shards.items() for k in ks}}))
    sharded = load_model(tmp_path, default_device(), torch.float32)
    for name, p in model.state_dict().items():
        assert torch.equal(p, sharded.state_dict()[name]), name


def test_unsupported_architecture_lists_supported_ones():
    with pytest.raises(UserError, match="Qwen3ForCausalLM.*Qwen2ForCausalLM.*LlamaForCausalLM"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})


def test_triton_interpreter_runs_a_trivial_kernel_on_cpu():
    import triton
    import triton.language as tl

    from plumbing.runtime import CUDA, INTERPRET
    assert INTERPRET == (not CUDA) or os.environ.get("TRITON_INTERPRET") == "1"

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.arange(5, dtype=torch.float32, device="cuda" if CUDA else "cpu")
    add_one[(1,)](x, 5, BLOCK=8)
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def _smoke(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "l1_smoke.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, needle", [
    (["--model", "/no/such/dir"], "does not exist"),
    (["--model", "nobody/no-such-model-xyz"], "could not get 'nobody/no-such-model-xyz'"),
    (["--prompt", ""], "prompt is empty"),
    (["--prompt-ids", "1,2,300"], "outside the vocabulary [0, 259)"),
    (["--max-new-tokens", "1010"], "exceeds the model's context"),
    (["--max-seq-len", "30"], "exceeds the KV cache of 30"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "tpu"], "--device"),
])
def test_bad_input_gets_one_clear_line_and_exit_2(args, needle, capsys):
    code, err = _smoke_here(capsys, *args)
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def _smoke_here(capsys, *args) -> tuple[int, str]:
    """scripts/l1_smoke.py's main as its ``__main__`` runs it (run_main), in this process: the exit
    status and stderr. (A fresh interpreter per case costs ~6 s of imports; the test below runs the
    script itself once.)"""
    import l1_smoke
    from plumbing.cli import run_main
    with pytest.raises(SystemExit) as e:
        run_main(lambda: l1_smoke.main(list(args)))
    return e.value.code, capsys.readouterr().err


def test_the_script_itself_turns_a_user_error_into_one_line_and_exit_2():
    r = _smoke("--prompt-ids", "1,2,300")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and "outside the vocabulary" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_unsupported_dtype_on_device_is_a_clear_error(monkeypatch):
    from plumbing import cli
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def no_half(q, *a, **k):  # a device without float16 kernels, as some CPUs builds are
        if q.dtype == torch.float16:
            raise RuntimeError('"baddbmm" not implemented for Half')
        return real_sdpa(q, *a, **k)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_half)
    with pytest.raises(UserError, match="float16 is not supported on cpu"):
        cli.check_device_dtype("cpu", "float16")
    assert cli.check_device_dtype("cpu", "float32") == torch.float32


def test_checkpoint_without_tokenizer_works_with_prompt_ids(tmp_path):
    src = tiny_checkpoint("qwen3")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(src / name, tmp_path / name)
    r = _smoke("--model", str(tmp_path), "--prompt-ids", ",".join(map(str, PROMPT)), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"stage", "model", "device", "dtype", "prompt_ids", "token_ids", "text"}
    assert out["text"].startswith("(text unavailable") and len(out["token_ids"]) == 20
    r = _smoke("--model", str(tmp_path), "--prompt", "hello")
    assert r.returncode == 2 and "--prompt-ids" in r.stderr


def test_kv_bytes_per_token_matches_the_lesson_hand_calculation():
    from l1_dense.config import PRESETS
    assert PRESETS["Qwen/Qwen3-0.6B"].kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688
    assert PRESETS["Qwen/Qwen3-8B"].kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456


def _corrupt(tmp_path, case):
    """A copy of the tiny Qwen3 with one thing broken; returns (dir, the text the error must hold)."""
    src = tiny_checkpoint("qwen3")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg, weights = tmp_path / "config.json", tmp_path / "model.safetensors"
    if case == "broken config.json":
        cfg.write_text(cfg.read_text()[:40])
        return tmp_path, f"{cfg}: not valid JSON"
    if case == "a missing key":
        data = json.loads(cfg.read_text())
        del data["hidden_size"]
        cfg.write_text(json.dumps(data))
        return tmp_path, f"{cfg}: no 'hidden_size' field"
    if case == "a truncated safetensors file":
        weights.write_bytes(weights.read_bytes()[:1000])
        return tmp_path, f"{weights}: cannot read the weights"
    if case == "no weights":
        weights.unlink()
        return tmp_path, f"no *.safetensors weights in {tmp_path}"
    if case == "weights of another shape":
        data = json.loads(cfg.read_text())
        data["intermediate_size"] += 8
        cfg.write_text(json.dumps(data))
        return tmp_path, "weights do not match"
    raise AssertionError(case)


CORRUPT = ["broken config.json", "a missing key", "a truncated safetensors file", "no weights", "weights of another shape"]


@pytest.mark.parametrize("case", CORRUPT)
def test_a_corrupt_checkpoint_is_one_line_naming_the_file_from_the_api(case, tmp_path):
    from l5_scheduler import LLM
    path, needle = _corrupt(tmp_path, case)
    with pytest.raises(UserError) as e:
        LLM(str(path), device="cpu")
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("case", CORRUPT[:3])
def test_a_corrupt_checkpoint_is_one_line_naming_the_file_from_a_script(case, tmp_path, capsys):
    path, needle = _corrupt(tmp_path, case)
    code, err = _smoke_here(capsys, "--model", str(path), "--prompt-ids", "1,2,3")
    assert code == 2 and needle in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1 == len(err.strip().splitlines()), err
