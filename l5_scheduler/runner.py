"""The model runner: one scheduled step -> one forward pass -> logits for the rows that sample.

    scheduled  [(A, 1), (B, 1), (C, 30)]          A, B decode; C runs a mid-prefill chunk
    input_ids  [T = 32]                           A's last token, B's last token, C's next 30
    meta       build_meta(pairs, sample=[T, T, F]) stage 3's tensors for the whole batch
    forward    one pass, ONE paged-attention launch per layer for decodes and chunks alike
    logits     [2, V]                             rows of A and B only: C's chunk samples nothing

The pairs handed to ``build_meta`` are each request's stage 2 block handle (``req.kv``), whose
``cur_len`` is ``num_computed_tokens``: exactly what stage 3 built by hand for one request.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from l3_paged.cache import PagedKVCache
from l3_paged.metadata import PagedMeta, build_meta

from .scheduler import SchedulerOutput


class RunnerOutput(NamedTuple):
    """What a runner hands back for one step."""
    logits: torch.Tensor                  # [S', V] float32: the rows that sample, in batch order
    meta: object                          # the step's metadata (--trace-meta, tests)
    argmax: torch.Tensor | None = None    # [S'] each row's argmax, if the runner computed it with the
                                          # forward (no extra launch for an all-greedy batch)
    prompt_logits: torch.Tensor | None = None   # [E, V]: rows for prompt_logprobs (out.prompt_rows), in order


def logits_rows(out) -> list:
    """Per scheduled request, how many of its last tokens need logits: its sampling rows, and before
    them the prompt rows that prompt_logprobs asks for (``out.prompt_rows``)."""
    return out.sample if out.prompt_rows is None else [int(s) + e for s, e in zip(out.sample, out.prompt_rows)]


def split_prompt_rows(ran: RunnerOutput, out) -> RunnerOutput:
    """A forward pass that computed prompt rows (``logits_rows``): the sampling rows as ``logits``,
    the prompt rows apart, so whatever samples sees only its own rows."""
    if out.prompt_rows is None:
        return ran
    keep, prompt, r = [], [], 0
    for s, e in zip(out.sample, out.prompt_rows):
        prompt += range(r, r + e)
        keep += range(r + e, r + e + int(s))
        r += e + int(s)
    idx = lambda rows: torch.tensor(rows, dtype=torch.int64, device=ran.logits.device)   # noqa: E731
    return RunnerOutput(ran.logits[idx(keep)], ran.meta, None, ran.logits[idx(prompt)])


class ModelRunner:
    """``cache``: the KV cache it reads and writes (default: stage 3's ``PagedKVCache``); ``ops``: the
    skeleton's small ops (None: its own ``TorchOps``)."""

    def __init__(self, model, config, impl: str = "triton", check: bool = False, ops=None, cache=None):
        p = next(model.parameters())
        self.model, self.device, self.block_size, self.ops = model, p.device, config.block_size, ops
        self.cache = cache if cache is not None else PagedKVCache(model.cfg, config.num_blocks, config.block_size,
                                                                  p.device, p.dtype, impl=impl, check=check)

    def inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, PagedMeta]:
        ids = []
        for req, n in out.scheduled:
            ids += req.tokens(req.num_computed_tokens, n)
        meta = build_meta([(req.kv, n) for req, n in out.scheduled], self.block_size, self.device, logits_rows(out))
        return torch.tensor(ids, device=self.device), meta      # [T] int64, T = out.num_tokens

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        """One forward pass: logits [S', V] float32 (S' = rows that sample) and the metadata.
        Nothing is kept between steps, so the output's finished and new-block lists need no reply."""
        input_ids, meta = self.inputs(out)
        return split_prompt_rows(RunnerOutput(self.model(input_ids, self.cache, meta, ops=self.ops), meta), out)
