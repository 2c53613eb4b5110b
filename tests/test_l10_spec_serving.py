"""Stage 10 serves any configuration of the latest stage: every engine option is a flag generated
from its declaration, the engine core builds ``l5_scheduler.stages.latest("stage").LLM``, and a
step that gives a request several tokens (speculative decoding) reaches the stream whole and is
counted in tokens. Driven by the real ``openai`` client on 127.0.0.1 (tests/l10_serving.py)."""
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest

from l10_serving import running_server, wait_idle

ROOT = Path(__file__).resolve().parent.parent
#: n-gram lookup finds guesses in these prompts and in the tiny model's loops (1 to 3 tokens kept a step)
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = ["one two three one two three one two", "a a a a a a", "The capital of France is"]
FAST = dict(impl="torch", fused_ops=False, gemv=False, split_kv=False)     # the server's --impl auto on a CPU
SERVER_FLAGS = {"--help", "--served-model-name", "--host", "--port", "--max-pending", "--log-level"}
EAGLE = "speculative_config['method'] = 'eagle' is not implemented"


def _ids(choice):
    return (choice.model_extra or {})["token_ids"]


@pytest.fixture(scope="module")
def spec_server():
    """(base URL, server, offline outputs): the offline LLM loads on a thread while the engine core
    (another process) loads the server's, one core each."""
    def offline():
        from l11_spec_decode import LLM, SamplingParams
        got.append(LLM("tiny-qwen3", speculative_config=SPEC, **FAST).generate(
            PROMPTS, SamplingParams(max_tokens=24, temperature=0), use_tqdm=False))
    got, thread = [], threading.Thread(target=offline)
    thread.start()
    try:
        with running_server("tiny-qwen3", speculative_config=SPEC, **FAST) as (base, server):
            thread.join()
            assert got, "the offline run failed (see the thread's traceback above)"
            yield base, server, got[0]
    finally:
        thread.join()


def test_speculative_steps_stream_every_token_equal_offline_and_metrics_count_tokens(spec_server):
    base, server, offline = spec_server
    from l5_scheduler.stages import stage_packages
    assert f"{stage_packages()[-1]}'s engine, SpeculativeStep" in server.describe    # the start line says what runs
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0)
    start, sent, widest = wait_idle(base), 0, 0
    for prompt, want in zip(PROMPTS, offline):
        kw = dict(model="tiny-qwen3", prompt=prompt, max_tokens=24, temperature=0,
                  extra_body={"return_token_ids": True})
        whole = c.completions.create(**kw)
        chunks = [ch.choices[0] for ch in c.completions.create(stream=True, **kw) if ch.choices]
        lps = c.completions.create(stream=True, logprobs=1, **kw)          # the other path out (engine_core._emit)
        lp_chunks = [ch.choices[0] for ch in lps if ch.choices]
        streamed = [t for ch in chunks for t in _ids(ch)]
        assert _ids(whole.choices[0]) == streamed == [t for ch in lp_chunks for t in _ids(ch)] \
            == want.outputs[0].token_ids
        assert "".join(ch.text for ch in chunks) == whole.choices[0].text == want.outputs[0].text
        assert sum(len(ch.logprobs.tokens) for ch in lp_chunks if ch.logprobs) == len(streamed)
        assert whole.usage.completion_tokens == len(streamed)
        sent += 3 * len(streamed)
        widest = max(widest, *(len(_ids(ch)) for ch in chunks))
    end = wait_idle(base)
    assert end["generation_tokens_total"] - start["generation_tokens_total"] == sent
    # one request at a time, so more tokens than steps means some step gave its request several
    steps = end["engine_steps_total"] - start["engine_steps_total"]
    assert steps < sent, f"{sent} tokens in {steps} steps: no guess was kept, and this test tested nothing"
    assert widest > 1                                                       # a chunk carried a step's tokens


def _help() -> str:
    r = subprocess.run([sys.executable, "-m", "l10_server", "--help"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_help_lists_every_engine_option_as_a_generated_flag_and_only_the_servers_by_hand():
    from l5_scheduler.stages import latest
    text = _help()
    for flag in ("--speculative-config", "--kv-cache-dtype", "--enforce-eager", "--no-enable-prefix-caching",
                 "--max-num-seqs", "--impl"):
        assert flag in text
    options = latest("options").ENGINE_OPTIONS
    want = {o.flag for o in options} | {"--no-" + o.flag[2:] for o in options if o.type is bool}
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text.split("\n\n")[0]))     # the usage lines
    assert shown - SERVER_FLAGS == want
    source = (ROOT / "l10_server" / "__main__.py").read_text()
    assert set(re.findall(r"add_argument\(\"(--[\w-]+)\"", source)) == SERVER_FLAGS - {"--help"}   # no copy
    assert "--impl {triton,torch,auto}" in text and "(default: auto)" in text.split("--impl {triton,torch,auto}")[-1]


def test_a_later_stage_only_bad_value_is_one_error_line_and_exit_2_before_torch_loads():
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "l10_server", "--speculative-config",
                        '{"method": "eagle"}'], capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("import time:")]
    loaded = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {EAGLE}"), r.stderr[-2000:]
    assert not loaded & {"torch", "triton"}


def test_the_engine_core_reports_failed_with_the_user_errors_text():
    """What only the engine can refuse (make_server's callers skip __main__) comes back as "failed"
    with the UserError's text, which AsyncLLM raises as a UserError (one line from the CLI)."""
    from l10_server.engine_core import run_engine_core

    class Outbox(list):
        send = list.append
    old = signal.getsignal(signal.SIGINT)
    try:
        for kw, text in (({"speculative_config": {"method": "eagle"}}, EAGLE),
                         (dict(FAST, speculative_config=SPEC, async_scheduling=True),
                          "async_scheduling=True cannot run with speculative_config")):
            out = Outbox()
            run_engine_core("tiny-qwen3", kw, None, out)
            assert len(out) == 1 and out[0][0] == "failed" and out[0][1].startswith(text), out
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_servers_impl_defaults_yield_to_a_flag_given_and_an_ignored_flag_says_so():
    from l10_server.serve import llm_options
    kw, notes = llm_options({}, "cpu")
    assert kw == dict(FAST, device="cpu") and notes == []
    kw, notes = llm_options({"fused_ops": True, "speculative_config": SPEC, "model": "tiny-qwen3"}, "cpu")
    assert kw == dict(FAST, fused_ops=True, speculative_config=SPEC, device="cpu") and notes == []
    kw, notes = llm_options({"impl": "triton"}, "cpu")                     # the interpreter, asked for
    assert kw == {"impl": "triton", "device": "cpu"} and notes == []
    assert llm_options({}, "cuda") == ({"device": "cuda"}, [])
    assert llm_options({"impl": "auto"}, "cuda") == ({"impl": "triton", "device": "cuda"}, [])
    _, notes = llm_options({"split_kv": True, "gemv": True, "enforce_eager": False, "prefill_graphs": True}, "cpu")
    assert [n.split(" ignored: ")[0] for n in notes] == ["--split-kv", "--gemv", "--no-enforce-eager",
                                                         "--prefill-graphs"]
    assert llm_options({"enforce_eager": True, "split_kv": False}, "cpu")[1] == []      # asked for what runs
    _, notes = llm_options({"impl": "torch", "prefill_graphs": True, "gpu_memory_utilization": 0.5}, "cuda")
    assert notes == ["--prefill-graphs ignored: the PyTorch attention (--impl torch) runs without CUDA graphs."]
