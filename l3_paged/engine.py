"""One sequence on the block-tensor cache. Same loop as stage 2; only the pool and the metadata change."""
from __future__ import annotations

from l2_gather.engine import GatherEngine

from .cache import PagedKVCache
from .metadata import PagedMeta, build_meta


class PagedEngine(GatherEngine):
    def __init__(self, model, num_blocks: int, block_size: int, impl: str = "triton", check: bool = False, **kw):
        self.impl, self.check = impl, check
        super().__init__(model, num_blocks, block_size, **kw)

    def make_pool(self, cfg, num_blocks, block_size, device, dtype):
        return PagedKVCache(cfg, num_blocks, block_size, device, dtype, impl=self.impl, check=self.check)

    def make_meta(self, start: int, T: int) -> PagedMeta:
        assert self.req.cur_len == start
        return build_meta([(self.req, T)], self.alloc.block_size, self.device)
