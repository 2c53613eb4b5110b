"""What the ports of vLLM's server tests (tests/test_l10_openai_compat*.py), share: one
server per module (tiny Qwen3 on the CPU), the offline oracle, the tokenizer, the real ``openai``
client, and the check of OpenAI's error JSON."""
import json
from pathlib import Path

import httpx
import openai
import pytest

from l10_serving import wait_idle
from plumbing.tiny import tiny_checkpoint

MODEL = "tiny-qwen3"
ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": "what is 1+1?"}]


@pytest.fixture(scope="module")
def server(tiny_server):
    """The process's tiny-Qwen3 server (conftest.py), left idle by each module."""
    yield tiny_server[0]
    wait_idle(tiny_server[0])


@pytest.fixture(scope="module")
def offline(tiny_offline):
    """The oracle for values: the same engine, offline, in this process."""
    return tiny_offline


@pytest.fixture(scope="module")
def tok():
    from l1_dense.checkpoint import load_tokenizer
    return load_tokenizer(tiny_checkpoint("qwen3"))


def _client(base, **kw):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=60, max_retries=0, **kw)


def _refused(call, param: str | None, status: int = 400) -> dict:
    """``call`` gets OpenAI's error JSON with ``status`` naming ``param``; returns the error."""
    with pytest.raises(openai.APIStatusError) as e:
        call()
    err = e.value.body
    assert e.value.status_code == status and set(err) == {"message", "type", "param", "code"}, err
    assert err["param"] == param and "\n" not in err["message"], err
    return err


def _chat_ids(tok, messages) -> list[int]:
    """The prompt's ids as the chat template renders them (the tokenizer's own, not the server's)."""
    return tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]


def _post(base, path, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    kw.setdefault("headers", {"content-type": "application/json"})
    return httpx.post(f"{base}{path}", content=content, timeout=60, **kw)
