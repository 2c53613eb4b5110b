"""The engine's updates -> OpenAI's response objects, streamed (SSE chunks) or whole.

A streamed response is a sequence of ``data: {json}\\n\\n`` events and then ``data: [DONE]``:

    completions   {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
    chat          {"object": "chat.completion.chunk", "choices": [{"index", "delta", "logprobs", "finish_reason"}]}
                  the first chunk of each choice has delta {"role": "assistant", "content": ...}

Every choice gets exactly one chunk whose ``finish_reason`` is not null, its last. With
``stream_options.include_usage`` every chunk carries ``"usage": null`` and one more chunk, with
``"choices": []``, carries the usage; with ``continuous_usage_stats`` too, every chunk carries its
choice's usage so far (its prompt's tokens, its own generated tokens: vLLM's). Choice ``index`` is
``prompt_index * n + k`` (OpenAI's order).

vLLM's extras: ``return_token_ids`` adds ``token_ids`` to every choice (a chunk: its new ids) and
the prompt's ids, ``prompt_token_ids``: on each completions choice (streamed: its first chunk),
at the top of a chat response (streamed: the first chunk only). ``echo`` (completions) starts each
choice's text with its prompt: the text sent, or the ids decoded; with ``logprobs``, the choice's
logprobs start with the prompt tokens' (the first one's null: nothing predicts it), as vLLM's do.
``prompt_logprobs`` (not streamed): vLLM's list, null and then per prompt token
``{"token id": {"logprob", "rank", "decoded_token"}}``, on each completions choice and at the top
of a chat response.
"""
from __future__ import annotations

import json
import time
import uuid


FLOOR = -9999.0       # vLLM's stand-in for -inf, which JSON cannot spell (clamp_prompt_logprobs)


def prompt_logprobs_json(plps: list) -> list:
    """vLLM's RequestOutput.prompt_logprobs as its JSON: ids as keys, -inf as -9999."""
    return [None if d is None else {str(t): {"logprob": max(lp.logprob, FLOOR), "rank": lp.rank,
                                             "decoded_token": lp.decoded_token} for t, lp in d.items()} for d in plps]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"


class Formatter:
    """Builds one response's objects (one id, one created time, one model name)."""

    def __init__(self, chat: bool, model: str, n: int, tokenizer, include_usage: bool = False,
                 return_token_ids: bool = False, continuous_usage: bool = False, echo: bool = False):
        self.chat, self.model, self.n, self.tok, self.include_usage = chat, model, n, tokenizer, include_usage
        self.return_token_ids, self.continuous_usage, self.echo = return_token_ids, continuous_usage, echo
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}          # completions logprobs: text offset per choice
        self.started: set[int] = set()             # choices that got their first chunk
        self.generated: dict[int, int] = {}        # continuous usage: tokens per choice so far
        self.prompt_ids: list[list[int]] = []      # per prompt, once the engine core took them
        self.prompt_texts: list[str] = []          # echo: what each choice's text starts with
        self.prompt_logprobs: dict[int, list] = {}  # per prompt, when asked (Update.prompt_logprobs)
        self.top_n = 0                             # completions logprobs: the top ones shown (echo)

    def accepted(self, prompts: list, prompt_token_ids: list[list[int]]) -> None:
        """The engine core took the prompts: their ids (usage, return_token_ids) and texts (echo)."""
        self.prompt_ids = prompt_token_ids
        if self.echo:                              # the text sent, or the ids decoded (vLLM's)
            self.prompt_texts = [p if isinstance(p, str) else self.tok.decode(ids, skip_special_tokens=False)
                                 for p, ids in zip(prompts, prompt_token_ids)]

    def seen(self, prompt_index: int, update) -> None:
        """Keep what an update says once for its prompt (its prompt logprobs)."""
        if update.prompt_logprobs is not None:
            self.prompt_logprobs[prompt_index] = update.prompt_logprobs

    def _echo_logprobs(self, index: int) -> dict:
        """The prompt's tokens in the completions logprobs' shape (vLLM's echo with logprobs): the first
        has null logprob and top_logprobs; each position shows its token and logprobs + 1 entries at most."""
        ids, plps = self.prompt_ids[index // self.n], self.prompt_logprobs.get(index // self.n)
        if plps is None:
            raise RuntimeError("echo with logprobs, but the engine core sent no prompt logprobs (a bug)")
        tokens, lps, tops, offsets, off = [], [], [], [], 0
        for tid, d in zip(ids, plps):
            tokens.append(self._token(tid))
            offsets.append(off)
            off += len(tokens[-1])
            lps.append(None if d is None else max(d[tid].logprob, FLOOR))
            top: dict[str, float] | None = None if d is None else {}
            for t, lp in list((d or {}).items())[:self.top_n + 1]:
                top.setdefault(self._token(t), max(lp.logprob, FLOOR))
            tops.append(top)
        self.offsets[index] = off
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

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

    def _choice(self, index: int, ch, delta: bool, first: bool) -> dict:
        """One choice; ``first``: its first chunk, or the whole response (what is said once)."""
        echoed = self._echo_logprobs(index) if self.echo and first and ch.logprobs is not None else None
        lps = self.logprobs(index, ch.logprobs)
        if echoed is not None:
            lps = {k: echoed[k] + lps[k] for k in echoed}
        text = self.prompt_texts[index // self.n] + ch.text if self.echo and first else ch.text
        if not self.chat:
            out = {"index": index, "text": text, "logprobs": lps, "finish_reason": ch.finish_reason,
                   "stop_reason": ch.stop_reason}
            if self.return_token_ids and first:
                out["prompt_token_ids"] = list(self.prompt_ids[index // self.n])
        else:
            message = {"role": "assistant", "content": text} if first else {"content": text}
            out = {"index": index, "delta" if delta else "message": message, "logprobs": lps,
                   "finish_reason": ch.finish_reason, "stop_reason": ch.stop_reason}
        if self.return_token_ids:
            out["token_ids"] = list(ch.token_ids)
        return out

    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices}
        if self.chat and self.return_token_ids and not self.started:     # the stream's first chunk
            out["prompt_token_ids"] = list(self.prompt_ids[0])
        if self.include_usage:
            out["usage"] = usage
        return out

    def stream_chunks(self, prompt_index: int, update) -> list[str]:
        """One update of one prompt -> SSE events, one per choice that has something to say."""
        out = []
        self.seen(prompt_index, update)
        for ch in update.choices:
            index = prompt_index * self.n + ch.index
            self.generated[index] = self.generated.get(index, 0) + len(ch.token_ids)
            first = index not in self.started
            says_first = first and (self.chat or self.echo or self.return_token_ids)
            if ch.text or ch.logprobs or ch.finish_reason or says_first or (self.return_token_ids and ch.token_ids):
                usage = None
                if self.continuous_usage:
                    usage = self.usage(len(self.prompt_ids[prompt_index]), self.generated[index])
                chunk = self.chunk([self._choice(index, ch, delta=True, first=first)], usage)
                self.started.add(index)
                out.append(sse(chunk))
        return out

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def usage_chunk(self, usage: dict) -> str:
        return sse({"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                    "created": self.created, "model": self.model, "choices": [], "usage": usage})

    def whole(self, finished: dict, usage: dict) -> dict:
        """``finished``: choice index -> the merged Choice (all its text, token ids and logprobs)."""
        choices = [self._choice(i, finished[i], delta=False, first=True) for i in sorted(finished)]
        plps = {k: prompt_logprobs_json(v) for k, v in self.prompt_logprobs.items()}
        if not self.chat and plps:
            for c in choices:
                c["prompt_logprobs"] = plps.get(c["index"] // self.n)      # (None: aborted before its prompt ran)
        out = {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices, "usage": usage}
        if self.chat and self.return_token_ids:
            out["prompt_token_ids"] = list(self.prompt_ids[0])
        if self.chat and plps:
            out["prompt_logprobs"] = plps[0]
        return out


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
