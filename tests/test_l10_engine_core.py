"""Stage 10: the engine core's failure rule, in this process (no server, no pipe: a list for each
end). A request that cannot be admitted, for any reason, is refused in its own ack (a UserError:
400; anything else: RequestFailed, 500) and the others are served exactly; a step that raises
reports "dead" and the loop ends (the server then answers everyone and exits)."""
import pytest

from l4_sampler import SamplingParams
from l5_scheduler import LLM
from l10_server import engine_core
from l10_server.engine_core import EngineCore, RequestFailed
from plumbing.errors import UserError

P = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


class Inbox:
    """What the server sent, in order; then "stop" once the engine has nothing left to step."""

    def __init__(self, items):
        self.items = list(items)

    def recv(self):
        return self.items.pop(0) if self.items else ("stop",)

    def poll(self):
        return bool(self.items)


class Outbox(list):
    send = list.append


@pytest.fixture(scope="module")
def llm():
    return LLM(None, dtype="float32", impl="torch")


def _run(llm, prompts):
    """Serve ``prompts`` (submission key = index) to the end; (acks by key, finished ids by key, messages)."""
    out = Outbox()
    EngineCore(llm.llm_engine, out).run(Inbox([("add", k, 0, f"r{k}", p, GREEDY) for k, p in enumerate(prompts)]))
    acks, ids = {}, {}
    for msg in out:
        if msg[0] == "dead":
            continue
        (keys, _, toks), batch, _ = msg
        for key, tok in zip(keys, toks):
            ids.setdefault(key, []).append(tok)
        for key, kind, _, payload in batch:
            if kind == "ack":
                acks[key] = payload
            else:
                ids.setdefault(key, []).extend(t for ch in payload[0] for t in ch[1])
    return acks, ids, out


def _free(llm) -> bool:
    kv = llm.llm_engine.scheduler.kv
    return not llm.llm_engine.requests and kv.num_free == kv.num_blocks


def test_any_admission_error_fails_that_request_alone_and_the_others_are_served_exactly(llm, monkeypatch):
    solo = llm.generate({"prompt_token_ids": P}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    real = llm.llm_engine.make_requests

    def buggy(prompt, params, rid):                  # a bug that one input meets: not the input's fault
        if prompt == "boom":
            raise KeyError("a bug")
        return real(prompt, params, rid)
    monkeypatch.setattr(llm.llm_engine, "make_requests", buggy)
    acks, ids, out = _run(llm, [{"prompt_token_ids": P}, "boom", "a\ud800b", {"prompt_token_ids": P}])
    assert isinstance(acks[1], RequestFailed) and "KeyError: 'a bug'" in str(acks[1])          # a 500
    assert type(acks[2]) is UserError and "unpaired surrogate U+D800 at character 1" in str(acks[2])  # a 400
    assert acks[0] == acks[3] == P and ids[0] == ids[3] == solo
    assert not any(msg[0] == "dead" for msg in out) and _free(llm)


def test_with_the_narrow_except_planted_the_same_bug_stops_the_core(llm, monkeypatch):
    import l10_planted_core
    monkeypatch.setattr(engine_core, "refusal", l10_planted_core.narrowed_refusal)
    monkeypatch.setattr(llm.llm_engine, "make_requests", lambda *a: {}["a bug"])
    _, _, out = _run(llm, ["boom", {"prompt_token_ids": P}])
    assert out[-1][0] == "dead" and "KeyError" in out[-1][1]


def test_a_step_that_raises_reports_dead_and_the_loop_ends(llm, monkeypatch):
    def step():
        raise RuntimeError("a bug in the step")
    monkeypatch.setattr(llm.llm_engine, "step", step)
    _, _, out = _run(llm, [{"prompt_token_ids": P}])
    assert out[-1] == ("dead", "the engine stopped after an error: RuntimeError: a bug in the step")
    llm.llm_engine.abort_request("r0")               # (the module's engine, for the next test)
