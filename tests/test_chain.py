"""The chain: Hugging Face's greedy generate() and every stage emit the same token ids (fp32, on
the default device: the interpreter on a CPU, compiled kernels on a GPU)."""
import pytest

from check_chain import main as check_chain


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_every_stage_matches_hf_generate_for_20_tokens(family, capsys):
    rc = check_chain(["--model", f"tiny-{family}", "--dtype", "float32"])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    assert "chain: OK" in out and out.count("| yes ") == 5
