"""Stage 10's server at data_parallel_size 2 (deep: a server and two engine cores start each time):
the openai client's tokens equal the single engine's, requests land on both replicas (the router's
counts and /metrics' per-engine series), with other options on (prefix routing, n-gram speculation,
the e4m3 cache) the tokens are the single engine's with the same options, a replica that dies
answers the clients in flight and stops the server in one line, and no replica outlives the server."""
import threading
import time

import httpx
import openai
import pytest

from l10_serving import metrics, offline_llm, running_server
from test_l12_serving import _alive, _children

pytestmark = pytest.mark.deep
PROMPTS = ["The capital of France is", "one two three one two", "a b c d e f", "Hello, my name is",
           "1 2 3 4 5 6 7", "the quick brown fox"]


def _offline(**kw) -> list[list[int]]:
    from l4_sampler.params import SamplingParams
    outs = offline_llm(dtype="float32", **kw).generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0),
                                                       use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def _served(base: str) -> list[list[int]]:
    """Every prompt at once (threads), so that the router has a choice to make."""
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120, max_retries=0)
    got = [None] * len(PROMPTS)

    def one(j):
        r = c.completions.create(model="tiny-qwen3", prompt=PROMPTS[j], max_tokens=10, temperature=0,
                                 extra_body={"return_token_ids": True})
        got[j] = r.choices[0].model_extra["token_ids"]
    threads = [threading.Thread(target=one, args=(j,)) for j in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return got


def _per_engine(base: str, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {s.labels["engine"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


def test_dp2_serves_the_single_engines_tokens_from_both_replicas_and_leaves_no_process_behind():
    want = _offline()
    with running_server("tiny-qwen3", data_parallel_size=2, dtype="float32") as (base, server):
        assert "data_parallel_size 2 (2 CPU processes), least_loaded routing" in server.describe
        procs = server.async_llm.client.procs
        everyone = {p.pid for p in procs} | {k for p in procs for k in _children(p.pid)}
        assert len(procs) == 2 and all(_alive(p.pid) for p in procs)
        assert _served(base) == want
        sent = server.async_llm.client.router.sent
        assert sum(sent) == len(PROMPTS) and min(sent) >= 1, sent          # both replicas took requests
        gen = _per_engine(base, "vllm:generation_tokens_total")
        assert set(gen) == {"0", "1"} and min(gen.values()) > 0 and sum(gen.values()) == 10 * len(PROMPTS)
        assert metrics(base)["num_requests_pending"] == 0 and server.async_llm.client.router.load == [0, 0]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in everyone):
        time.sleep(0.2)
    assert not [p for p in everyone if _alive(p)], "a replica outlived the server"


def test_dp2_with_prefix_routing_speculation_and_an_e4m3_cache_serves_that_engines_tokens():
    opts = dict(kv_cache_dtype="fp8", speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                enable_prefix_caching=True)
    want = _offline(block_size=4, **opts)
    with running_server("tiny-qwen3", data_parallel_size=2, data_parallel_routing="prefix", dtype="float32",
                        block_size=4, **opts) as (base, server):
        assert _served(base) == want
        from l12_tensor_parallel.router import prefix_replica
        router, c = server.async_llm.client.router, openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=120)
        firsts = [[5, 6, 7, j] for j in range(8)]
        homes = [prefix_replica(f, 2) for f in firsts]
        for first, home in zip(firsts, homes):             # three prompts a first block: each on the block's home
            before = list(router.sent)
            for tail in ([1], [2, 3], [4, 4, 4]):
                c.completions.create(model="tiny-qwen3", prompt=first + tail, max_tokens=2, temperature=0)
            assert [a - b for a, b in zip(router.sent, before)] == [3 * (home == 0), 3 * (home == 1)]
        assert set(homes) == {0, 1}                         # the blocks' homes: both replicas
        hits = _per_engine(base, "vllm:prefix_cache_hits_total")
        assert min(hits.values()) > 0, hits                 # each replica reused the blocks it was sent


def test_a_replica_that_dies_answers_the_clients_in_flight_and_stops_the_server_in_one_line(capfd):
    import os
    import signal
    with running_server("tiny-qwen3", data_parallel_size=2) as (base, server):
        body = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
        answers = {}
        threads = [threading.Thread(target=lambda j=j: answers.__setitem__(j, httpx.post(
            f"{base}/v1/completions", json=body, timeout=60))) for j in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while server.async_llm.client.router.sent != [1, 1]:
            assert time.monotonic() < deadline, "the two requests were not routed one to each replica"
            time.sleep(0.01)
        victim = server.async_llm.client.procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert [answers[j].status_code for j in range(2)] == [503, 503]    # both in flight, on either replica
        assert f"data-parallel replica 1 (pid {victim.pid})" in answers[0].json()["error"]["message"]
        deadline = time.monotonic() + 15
        while not server.should_exit:
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.05)
    err = capfd.readouterr().err
    line = [ln for ln in err.splitlines() if "data-parallel replica 1" in ln and ln.startswith("l10_server:")]
    assert len(line) == 1 and "exiting with status 1" in line[0], err[-2000:]
    survivor = server.async_llm.client.procs[0]
    survivor.join(15)
    assert survivor.exitcode is not None, "replica 0 outlived the server"


def test_dp2_of_tp2_groups_serves_the_single_engines_tokens():
    """Each replica an engine core with a worker rank of its own (4 processes): the same tokens."""
    want = _offline()
    with running_server("tiny-qwen3", data_parallel_size=2, tensor_parallel_size=2, dtype="float32") as (base, server):
        procs = server.async_llm.client.procs
        assert all(len(_children(p.pid)) >= 1 for p in procs)          # each replica started its TP worker
        assert _served(base) == want and min(server.async_llm.client.router.sent) >= 1
