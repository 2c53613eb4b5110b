"""Stage 10: /metrics in vLLM's names and types, read with prometheus_client's own parser, on the
test process's tiny-Qwen3 server (counters judged by their change over the test). Ported from vLLM's
tests/entrypoints/openai/test_metrics.py: ``test_metrics_counts`` (the counts after ten requests),
``test_metrics_exist`` (the names a vLLM dashboard queries) and ``test_abort_metrics_reset``
(aborted requests leave nothing running, waiting or cached). The expected values come from the
test's own arithmetic (ten requests of a prompt the test encodes, ten tokens each), never from the
server's answers."""
import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from l10_serving import wait_idle

PROMPT = "Hello my name is Robert and I love magic. " * 3     # two full blocks of 16 and more
N, MAX_TOKENS = 10, 10
#: vLLM's EXPECTED_METRICS_V1 that this server has (vLLM's others: see lessons/l10_server.md, 10.6)
EXPECTED = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions_total",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total"] + [
    f"vllm:{h}_{suffix}" for h in ("request_prompt_tokens", "request_generation_tokens", "request_params_n",
                                   "request_params_max_tokens", "time_to_first_token_seconds",
                                   "inter_token_latency_seconds", "e2e_request_latency_seconds",
                                   "request_queue_time_seconds", "request_inference_time_seconds",
                                   "request_prefill_time_seconds", "request_decode_time_seconds")
    for suffix in ("sum", "bucket", "count")]


@pytest.fixture(scope="module")
def server(tiny_server):
    yield tiny_server
    wait_idle(tiny_server[0])


def samples(base: str) -> dict[str, float]:
    """Every sample without a bucket label: name (and finished_reason, if any) -> value."""
    text = httpx.get(f"{base}/metrics", timeout=10)
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(text.text):
        for s in family.samples:
            if "le" not in s.labels:
                assert s.labels["model_name"] == "tiny-qwen3" and s.labels["engine"] == "0", s
                out[s.name + (f"[{s.labels['finished_reason']}]" if "finished_reason" in s.labels else "")] = s.value
    return out


def test_metrics_counts_after_ten_requests(server):
    base, srv = server
    prompt_ids = srv.async_llm.front_tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    P, client = len(prompt_ids), openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
    wait_idle(base)
    before = samples(base)
    for _ in range(N):
        client.completions.create(model="tiny-qwen3", prompt=prompt_ids, max_tokens=MAX_TOKENS,
                                  extra_body={"ignore_eos": True})
    m = {k: v - before.get(k, 0) for k, v in samples(base).items()}
    expected = {"vllm:time_to_first_token_seconds_count": N, "vllm:e2e_request_latency_seconds_count": N,
                "vllm:inter_token_latency_seconds_count": N * (MAX_TOKENS - 1),   # one token a step here
                "vllm:request_queue_time_seconds_count": N, "vllm:request_inference_time_seconds_count": N,
                "vllm:request_prefill_time_seconds_count": N, "vllm:request_decode_time_seconds_count": N,
                "vllm:request_prompt_tokens_sum": N * P, "vllm:request_prompt_tokens_count": N,
                "vllm:request_generation_tokens_sum": N * MAX_TOKENS, "vllm:request_generation_tokens_count": N,
                "vllm:request_params_n_sum": N, "vllm:request_params_max_tokens_sum": N * MAX_TOKENS,
                "vllm:prompt_tokens_total": N * P, "vllm:generation_tokens_total": N * MAX_TOKENS,
                "vllm:request_success_total[length]": N,
                # the same prompt ten times: every later one finds its full blocks cached
                "vllm:prefix_cache_queries_total": N * P}
    assert {k: m.get(k) for k in expected} == expected
    assert 0 < m["vllm:prefix_cache_hits_total"] < N * P
    assert 0 < m["vllm:time_to_first_token_seconds_sum"] < m["vllm:e2e_request_latency_seconds_sum"]
    text = httpx.get(f"{base}/metrics", timeout=10).text
    assert [name for name in EXPECTED if name not in text] == []


def test_aborted_requests_leave_nothing_running_waiting_or_in_the_kv_cache(server):
    base, _ = server

    def gauges():
        m = samples(base)
        return m["vllm:num_requests_running"], m["vllm:num_requests_waiting"], m["vllm:kv_cache_usage_perc"]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        before = samples(base).get("vllm:request_success_total[abort]", 0)
        tasks = [asyncio.create_task(client.completions.create(
            model="tiny-qwen3", prompt=PROMPT + f" {i}", max_tokens=800, extra_body={"ignore_eos": True}))
            for i in range(3)]
        for _ in range(500):
            await asyncio.sleep(0.01)
            running, _, usage = gauges()
            if running == 3:
                break
        assert running == 3 and usage > 0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(500):
            if gauges() == (0, 0, 0):
                break
            await asyncio.sleep(0.01)
        return before
    before = asyncio.run(run())
    assert gauges() == (0, 0, 0)
    assert samples(base)["vllm:request_success_total[abort]"] == before + 3
