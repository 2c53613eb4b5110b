"""The engine's updates -> OpenAI's response objects, streamed (SSE chunks) or whole.

A streamed response is a sequence of ``data: {json}\\n\\n`` events and then ``data: [DONE]``:

    completions   {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
    chat          {"object": "chat.completion.chunk", "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
                  the first chunk of each choice has delta {"role": "assistant", "content": ""}

Every choice gets exactly one chunk whose ``finish_reason`` is not null, its last. With
``stream_options.include_usage`` every chunk carries ``"usage": null`` and one more chunk, with
``"choices": []``, carries the usage. Choice ``index`` is ``prompt_index * n + k`` (OpenAI's order).
"""
from __future__ import annotations

import json
import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


class Formatter:
    """Builds one response's objects (one id, one created time, one model name)."""

    def __init__(self, chat: bool, model: str, n: int, tokenizer, include_usage: bool = False,
                 return_token_ids: bool = False):
        self.chat, self.model, self.n, self.tok, self.include_usage = chat, model, n, tokenizer, include_usage
        self.return_token_ids = return_token_ids
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}          # completions logprobs: text offset per choice
        self.started: set[int] = set()             # chat: choices that got their role chunk

    def _token(self, tid: int) -> str:
        return self.tok.decode([tid], skip_special_tokens=False)

    def logprobs(self, index: int, lps, text_before: int = 0):
        """Stage 4's TokenLogprobs -> OpenAI's shape for this endpoint (None when not asked)."""
        if lps is None:
            return None
        if self.chat:
            def entry(tid, lp):
                t = self._token(tid)
                return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
            return {"content": [dict(entry(x.token_id, x.logprob),
                                     top_logprobs=[entry(t, v) for t, v in x.top]) for x in lps]}
        tokens = [self._token(x.token_id) for x in lps]
        offsets, off = [], self.offsets.get(index, 0)
        for t in tokens:
            offsets.append(off)
            off += len(t)
        self.offsets[index] = off
        tops = []                       # keyed by text: two ids with one text (e.g. "\ufffd") keep the first
        for x in lps:
            top: dict[str, float] = {}
            for t, v in [(x.token_id, x.logprob)] + list(x.top):
                top.setdefault(self._token(t), v)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [x.logprob for x in lps], "top_logprobs": tops,
                "text_offset": offsets}

    def _choice(self, index: int, ch, delta: bool) -> dict:
        out = self._fields(index, ch, delta)
        if self.return_token_ids:
            out["token_ids"] = list(ch.token_ids)
        return out

    def _fields(self, index: int, ch, delta: bool) -> dict:
        lps = self.logprobs(index, ch.logprobs)
        if not self.chat:
            return {"index": index, "text": ch.text, "logprobs": lps, "finish_reason": ch.finish_reason,
                    "stop_reason": ch.stop_reason}
        if delta:
            d = {"content": ch.text}
            if index not in self.started:
                self.started.add(index)
                d = {"role": "assistant", "content": ch.text}
            key, value = "delta", d
        else:
            key, value = "message", {"role": "assistant", "content": ch.text}
        return {"index": index, key: value, "logprobs": lps, "finish_reason": ch.finish_reason,
                "stop_reason": ch.stop_reason}

    def chunk(self, choices: list[dict]) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def stream_chunks(self, prompt_index: int, update) -> list[str]:
        """One update of one prompt -> SSE events, one per choice that has something to say."""
        out = []
        for ch in update.choices:
            index = prompt_index * self.n + ch.index
            first_chat = self.chat and index not in self.started
            if ch.text or ch.logprobs or ch.finish_reason or first_chat or (self.return_token_ids and ch.token_ids):
                out.append(sse(self.chunk([self._choice(index, ch, delta=True)])))
        return out

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def usage_chunk(self, usage: dict) -> str:
        return sse({"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                    "created": self.created, "model": self.model, "choices": [], "usage": usage})

    def whole(self, finished: dict, usage: dict) -> dict:
        """``finished``: choice index -> the merged Choice (all its text, token ids and logprobs)."""
        choices = [self._choice(i, finished[i], delta=False) for i in sorted(finished)]
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": usage}


def merge(acc: dict, prompt_index: int, n: int, update) -> int:
    """Fold one update into ``acc`` (choice index -> Choice with everything so far); returns the
    number of new tokens."""
    new = 0
    for ch in update.choices:
        index = prompt_index * n + ch.index
        have = acc.get(index)
        if have is None:
            acc[index] = have = type(ch)(index, "", [], [] if ch.logprobs is not None else None)
        have.text += ch.text
        have.token_ids += ch.token_ids
        if ch.logprobs is not None:
            have.logprobs += ch.logprobs
        have.finish_reason, have.stop_reason = ch.finish_reason, ch.stop_reason
        new += len(ch.token_ids)
    return new
