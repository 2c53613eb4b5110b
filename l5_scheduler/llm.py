"""``LLM``: vLLM's offline API on top of the engine.

    from l5_scheduler import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")                       # or None: the built-in tiny Qwen3
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}],
                        SamplingParams(temperature=0.8, max_tokens=32, seed=1))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids, outs[0].outputs[0].finish_reason

``generate`` returns one ``RequestOutput`` per prompt, in input order, whatever order they
finished in. The lower level is ``llm.llm_engine``: ``add_request`` / ``step`` /
``has_unfinished_requests``.
"""
from __future__ import annotations

import time

import torch

from l1_dense.checkpoint import load_model, load_tokenizer, resolve_model_dir
from l1_dense.cli import DTYPES, check_device_dtype
from l1_dense.errors import UserError
from l1_dense.runtime import default_device, default_dtype
from l4_sampler.params import SamplingParams

from .config import make_config
from .engine import LLMEngine
from .outputs import RequestOutput


def _dtype_name(dtype, device) -> str:
    if dtype is None or dtype == "auto":
        dtype = default_dtype(device)
    if isinstance(dtype, torch.dtype):
        names = {d: n for n, d in DTYPES.items()}
        if dtype not in names:
            raise UserError(f"dtype {dtype} unsupported: use one of {', '.join(DTYPES)}")
        return names[dtype]
    if dtype not in DTYPES:
        raise UserError(f"dtype {dtype!r} unsupported: use one of {', '.join(DTYPES)} or 'auto'")
    return dtype


class LLM:
    def __init__(self, model: str | None = None, *, device: str | None = None, dtype=None, block_size: int = 16,
                 num_gpu_blocks_override: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int | None = None, max_model_len: int | None = None, seed: int | None = None,
                 gpu_memory_utilization: float = 0.9, impl: str = "triton"):
        device = device or default_device()
        dtype = check_device_dtype(device, _dtype_name(dtype, device))
        path = resolve_model_dir(model)
        self.model = load_model(path, device, dtype)
        self.tokenizer = load_tokenizer(path)
        config = make_config(self.model.cfg, device, dtype, block_size=block_size,
                             num_gpu_blocks_override=num_gpu_blocks_override,
                             max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization)
        self.llm_engine = self.make_engine(config, seed=seed, impl=impl)

    def make_engine(self, config, **kw) -> LLMEngine:
        """The engine under the API (stage 6 returns its prefix-caching one)."""
        return LLMEngine(self.model, self.tokenizer, config, **kw)

    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        n = len(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * n
        else:
            params = list(sampling_params)
            if len(params) != n:
                raise UserError(f"got {n} prompts but {len(params)} sampling params: pass one SamplingParams, "
                                "or a list with one per prompt.")
        engine = self.llm_engine
        reqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):   # check all before running any
            try:
                reqs.append(engine.make_request(prompt, p))
            except UserError as e:
                raise UserError(f"prompt {i}: {e}") from None
        ids = [engine.add(r) for r in reqs]
        run_to_completion(engine, n, use_tqdm)
        return [engine.output(i) for i in ids]                  # input order, not finishing order


def run_to_completion(engine: LLMEngine, n: int, use_tqdm: bool = True):
    """Step until nothing is left; a tqdm bar shows requests done and output tokens/s."""
    from tqdm import tqdm
    bar = tqdm(total=n, desc="Processed prompts", unit="req", disable=not use_tqdm, dynamic_ncols=True)
    t0, out_tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            out_tokens += len(o.new_token_ids)
            if o.finished:
                bar.update(1)
        bar.set_postfix_str(f"output {out_tokens / (time.perf_counter() - t0):.1f} tok/s", refresh=False)
    bar.close()
