"""Data parallelism's router and engine client without processes (default tier, milliseconds):
fake engine cores stand in for stage 10's CoreClient. The least-loaded pick, a request counted out
when its last update (or its refusal) comes back, an abort sent to the replica that took it, prefix
routing, a replica's death, and the one-line refusals (offline LLM, too few GPUs, a routing with one
replica). The served tokens are tests/test_l12_data_parallel.py's (deep)."""
from types import SimpleNamespace

import pytest

from l12_tensor_parallel.replicas import DataParallel, placement
from l12_tensor_parallel.router import Router, least_loaded, prefix_replica
from plumbing.errors import UserError

ONE = SimpleNamespace(n=1)


class FakeCore:
    def __init__(self, pid):
        self.proc = SimpleNamespace(pid=pid)
        self.info = dict(describe="engine", max_model_len=64 + pid, tokenizer_path="-", snapshots=[{"pid": pid}])
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def client(n=2, how="least_loaded", **kw):
    cores = [FakeCore(100 + r) for r in range(n)]
    dp = DataParallel(cores, Router(n, how, block_size=4, **kw), "test")
    got = []
    dp.on_message = lambda msg, r: got.append((msg, r))
    return dp, cores, got


def add(dp, key, rid, prompt="p", params=ONE):
    dp.send(("add", key, 0, rid, prompt, params))


def step(batch):
    return (((), (), ()), batch, {})


def test_least_loaded_is_the_smallest_load_lowest_index_on_a_tie():
    assert least_loaded([3, 1, 2]) == 1
    assert least_loaded([2, 0, 0]) == 1
    assert least_loaded([0, 0]) == 0


def test_each_request_goes_to_the_replica_with_the_fewest_in_flight_and_leaves_its_count_when_it_finishes():
    dp, cores, got = client()
    for k in range(4):
        add(dp, k, f"r{k}")
    assert [len(c.sent) for c in cores] == [2, 2] and dp.router.load == [2, 2]
    assert [m[3] for m in cores[0].sent] == ["r0", "r2"]               # alternating: 0, 1, 0, 1
    dp._from_core(step([(0, "out", 0, ([], True, None))]), 0)          # r0's last update: replica 0 has 1
    dp._from_core(step([(2, "out", 0, ([], False, None))]), 0)         # r2 not finished: still counted
    assert dp.router.load == [1, 2] and len(got) == 2 and got[0][1] == 0   # and every message passed on
    add(dp, 4, "r4", params=SimpleNamespace(n=3))                       # n = 3: three sequences in flight
    assert cores[0].sent[-1][3] == "r4" and dp.router.load == [4, 2]
    add(dp, 5, "r5")
    assert cores[1].sent[-1][3] == "r5" and dp.router.sent == [3, 3]
    dp._from_core(step([(5, "ack", 0, UserError("too long"))]), 1)      # refused: counted out at once
    assert dp.router.load == [4, 2]


def test_an_abort_goes_to_the_replica_that_took_the_request_and_stop_to_every_replica():
    dp, cores, _ = client()
    add(dp, 0, "a")
    add(dp, 1, "b")
    dp.send(("abort", "b"))
    assert cores[1].sent[-1] == ("abort", "b") and len(cores[0].sent) == 1
    dp._from_core(step([(0, "out", 0, ([], True, None))]), 0)
    dp.send(("abort", "a"))                                            # finished meanwhile: nothing sent
    assert cores[0].sent[-1][0] == "add"
    dp.send(("stop",))
    assert all(c.sent[-1] == ("stop",) for c in cores)


def test_a_replica_that_dies_is_named_once_and_a_stop_waits_for_every_replicas_last_aborts():
    dp, cores, got = client()
    dp._from_core(("exited", "the engine core exited (exit code -9)"), 1)
    dp._from_core(("exited", "later"), 0)
    dp._from_core(step([]), 0)
    assert got == [(("exited", "data-parallel replica 1 (pid 101): the engine core exited (exit code -9)"), 1)]
    dp, cores, got = client()
    dp.send(("stop",))
    dp._from_core(("exited", "the engine core exited (exit code 0)"), 0)
    dp._from_core(step([(0, "out", 0, ([], True, None))]), 1)          # replica 1's aborts still reach the streams
    assert [r for _, r in got] == [1]


def test_the_info_is_every_replicas():
    dp, _, _ = client()
    assert dp.info["max_model_len"] == 64 + 100 and dp.info["snapshots"] == [{"pid": 100}, {"pid": 101}]
    assert dp.procs[1].pid == 101 and "data_parallel_size 2 (test), least_loaded routing" in dp.info["describe"]


def test_prefix_routing_keeps_a_first_block_on_one_replica_unless_it_is_far_busier():
    system = {"prompt_token_ids": [7, 8, 9, 10, 11]}
    r = prefix_replica([7, 8, 9, 10], 2)
    assert r == prefix_replica([7, 8, 9, 10], 2)                        # stable (no salted hash)
    router = Router(2, "prefix", block_size=4, slack=2)
    picks = []
    for _ in range(3):
        picks.append(router.pick(dict(system, prompt_token_ids=system["prompt_token_ids"] + [len(picks)])))
        router.add(picks[-1], 1)
    assert picks == [r, r, r]                                           # load now 3 against 0: past the slack
    assert router.pick(system) == 1 - r
    assert router.pick({"prompt_token_ids": [1, 2]}) == 1 - r           # shorter than a block: least loaded
    words = Router(2, "prefix", block_size=4, encode=lambda s: [ord(c) for c in s])
    assert words.pick("abcdXYZ") == words.pick("abcdQ") == prefix_replica([97, 98, 99, 100], 2)


def test_refusals_in_one_line():
    with pytest.raises(UserError, match=r"needs 4 GPUs \(one per rank of each replica\) and 3 are visible: lower "
                                        r"data_parallel_size, or make more visible \(CUDA_VISIBLE_DEVICES\)"):
        import os
        old = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2"
        try:
            placement("cuda", 2, 2)
        finally:
            os.environ.pop("CUDA_VISIBLE_DEVICES") if old is None else os.environ.__setitem__("CUDA_VISIBLE_DEVICES", old)
    with pytest.raises(UserError, match="names one GPU"):
        placement("cuda:1", 2, 1)
    assert placement("cpu", 3, 1) == [None] * 3
    from l12_tensor_parallel.stage import engine_client, refuse_data_parallel
    from l5_scheduler.assemble import resolve_options
    from l12_tensor_parallel.stage import STAGES
    with pytest.raises(UserError, match=r"LLM\(...\) runs one engine; replicas run behind the server, one engine "
                                        r"core each: python -m l10_server --data-parallel-size 2\."):
        refuse_data_parallel(resolve_options(STAGES, dict(data_parallel_size=2)))
    with pytest.raises(UserError, match="data_parallel_routing chooses among replicas"):
        engine_client(SimpleNamespace(args=resolve_options(STAGES, dict(data_parallel_routing="prefix"))))
    assert engine_client(SimpleNamespace(args=resolve_options(STAGES, {}))) is None


def test_the_server_flag_is_generated_from_the_one_declaration():
    from l10_server.__main__ import given_options, parser
    p = parser()
    args = p.parse_args(["--data-parallel-size", "2", "--data-parallel-routing", "prefix"])
    assert given_options(args) == dict(data_parallel_size=2, data_parallel_routing="prefix")
    with pytest.raises(UserError, match="data_parallel_size must be a positive integer, got 0"):
        given_options(p.parse_args(["--data-parallel-size", "0"]))
