"""CUDA graphs across ranks: stage 7's graphs, captured on every rank, each replay announced.

A replay on rank 0 calls no Python: the model part (model.py), which sends every eager step's
inputs to the workers, never hears of it. So the graphs are made in two halves:

    capture   rank 0's GraphRunner (stage 7) captures its buckets; each capture's forward pass
              goes through ShardedModel, which tells the workers "capture" (group.py), and each
              worker captures the same pass as its next graph, in one memory pool: the graph on
              every rank holds the inputs' copies, their broadcast from rank 0 (comm.py), the
              forward pass and its all-reduces
    replay    ``execute`` looks up the step's graph (stage 7's rule, ``replay_bucket``), tells the
              workers its index ("replay i", a few bytes by pipe), then stage 7's runner prepares
              the inputs and replays rank 0's graph; a worker's graph waits on the GPU for rank
              0's broadcast, so no host waits for another
    eager     every other step, as before: through ShardedModel

Speculation's verify graphs (stage 11) replay inside its own step, which announces nothing: at
tp > 1 this runner does not offer its graphs to it (no ``graphs`` attribute), so verify steps run
eagerly, and the runner maker says so.
"""
from __future__ import annotations


class GraphsAcrossRanks:
    def __init__(self, group, capture):
        """``capture()``: stage 7's GraphRunner for this rank (it captures as it is made)."""
        self.group = group
        first = group.captured
        try:
            self.inner = capture()
        except BaseException:                        # the workers captured what rank 0 did not finish
            group.stop_now()
            raise
        keys = list(self.inner.graphs)
        if group.captured - first != len(keys):
            raise RuntimeError(f"{len(keys)} graphs were captured and the workers were told of "
                               f"{group.captured - first} captures: the graph indices would not agree (a bug)")
        self.index = {key: first + i for i, key in enumerate(keys)}    # the workers number them in this order
        group.hold_graphs(self.inner.graphs)         # destroyed before the communicators, at close

    # what the engine, tests and scripts read through the runner part (stage 7's GraphRunner's)
    cache = property(lambda self: self.inner.cache)
    buf = property(lambda self: self.inner.buf)
    ops = property(lambda self: self.inner.ops)
    split_kv = property(lambda self: self.inner.split_kv)
    mode_log = property(lambda self: self.inner.mode_log)
    warmup_report = property(lambda self: self.inner.warmup_report)
    graph_bytes = property(lambda self: self.inner.graph_bytes)
    capture_s = property(lambda self: self.inner.capture_s)
    runner = property(lambda self: self.inner.runner)

    @property
    def keys(self) -> list:
        """The captured graphs' keys (stage 7's ``graph_keys``), in capture order."""
        return list(self.index)

    def execute(self, out):
        key = self.inner.replay_bucket(out)
        if key is None:
            return self.inner.execute(out)
        self.group.replay(self.index[key])           # the workers wait for this replay's broadcast now:
        try:                                         # an error before rank 0's leaves them inside it
            return self.inner.execute(out)
        except Exception as e:
            err = self.group.failure(e)
            if err is e:
                raise
            raise err from None
