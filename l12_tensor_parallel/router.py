"""Which replica takes a request (data parallelism: replicas.py).

    least_loaded   the replica with the fewest sequences in flight, lowest index on a tie. In
                   flight: added and not yet finished, so its engine core's waiting + running,
                   plus any still in the pipe. vLLM's DP load-balancing client picks the engine
                   core the same way from the waiting and running counts the cores publish (plus
                   the requests it sent since); here the router counts them itself, exactly: it
                   sees every request go in and every last update come back.
    prefix         the replica the prompt's first block of tokens hashes to, so that prompts that
                   share a prefix share one replica's prefix cache, unless that replica has
                   ``slack`` more in flight than the least loaded (then least_loaded): a pure hash
                   would send a workload with one shared system prompt to one replica only.
                   SGLang's cache-aware router falls back to the least loaded past an imbalance
                   threshold in the same way. A prompt shorter than a block has no cached block to
                   share: least_loaded.

``Router`` holds the counts; ``pick`` chooses, ``add`` / ``done`` count a request in and out.
"""
from __future__ import annotations

import zlib

PREFIX_SLACK = 32             # sequences: how much busier than the least loaded a prefix's replica may be


def least_loaded(load: list[int]) -> int:
    """The index of the smallest load, the lowest on a tie."""
    return min(range(len(load)), key=load.__getitem__)


def prefix_replica(first_block: list[int], replicas: int) -> int:
    """A replica for a prefix: a hash of its first block's token ids, the same in every process
    and on every run (Python's own ``hash`` of a string is salted per process)."""
    return zlib.crc32(",".join(map(str, first_block)).encode()) % replicas


class Router:
    def __init__(self, replicas: int, how: str = "least_loaded", block_size: int = 16, encode=None,
                 slack: int = PREFIX_SLACK):
        if how not in ("least_loaded", "prefix"):
            raise ValueError(f"routing {how!r}: least_loaded or prefix")
        self.load = [0] * replicas               # sequences in flight, by replica
        self.sent = [0] * replicas               # requests routed, by replica (for people: the lesson, tests)
        self.how, self.block_size, self.encode, self.slack = how, block_size, encode, slack

    def pick(self, prompt=None) -> int:
        """The replica for ``prompt`` (a string, or {"prompt_token_ids": [...]}: the server's form)."""
        if self.how == "prefix":
            ids = self._ids(prompt)
            if len(ids) >= self.block_size:
                r = prefix_replica(ids[:self.block_size], len(self.load))
                if self.load[r] - min(self.load) <= self.slack:
                    return r
        return least_loaded(self.load)

    def add(self, r: int, seqs: int) -> None:
        self.load[r] += seqs
        self.sent[r] += 1

    def done(self, r: int, seqs: int) -> None:
        self.load[r] -= seqs

    def _ids(self, prompt) -> list[int]:
        if isinstance(prompt, dict):
            return list(prompt.get("prompt_token_ids") or ())
        if isinstance(prompt, (list, tuple)):
            return list(prompt)
        if isinstance(prompt, str) and self.encode is not None:
            return self.encode(prompt)
        return []
