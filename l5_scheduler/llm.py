"""``LLM``: vLLM's offline API on top of the engine, and ``build_engine``, which assembles it.

    from l5_scheduler import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")                       # or None: the built-in tiny Qwen3
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}],
                        SamplingParams(temperature=0.8, max_tokens=32, seed=1))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids, outs[0].outputs[0].finish_reason

``generate`` returns one ``RequestOutput`` per prompt, in input order, whatever order they
finished in. The lower level is ``llm.llm_engine``: ``add_request`` / ``step`` /
``has_unfinished_requests``.

``LLM`` loads the checkpoint, sizes the engine (config.py), then calls a builder that gives the
one engine loop its parts. Stage 5's builder:

    kv        = BlockManager(num_blocks, block_size)                stage 2's allocator
    scheduler = Scheduler(kv, max_num_batched_tokens, max_num_seqs)
    runner    = ModelRunner(model, config)                          stage 3's metadata and kernel
    sampler   = Sampler(seed)                                       stage 4
    engine    = LLMEngine(model, tokenizer, config, scheduler=..., runner=..., sampler=...)

A later stage writes a builder that passes its own parts to this one (``kv=``, ``runner=``) and
gives it to ``LLM`` (``build_engine=``): ``from l6_prefix_cache import LLM`` is this class with
stage 6's builder, never a subclass.
"""
from __future__ import annotations

import time

from l4_sampler.params import SamplingParams
from l4_sampler.sampler import Sampler
from plumbing.cli import DTYPE_NAMES, check_device_dtype, dtype_name_of
from plumbing.errors import UserError
from plumbing.runtime import default_device, default_dtype
from l1_dense.checkpoint import load_model, load_tokenizer, resolve_model_dir

from .config import make_config
from .engine import LLMEngine
from .kv_manager import BlockManager
from .outputs import RequestOutput
from .runner import ModelRunner
from .scheduler import Scheduler


def build_engine(model, tokenizer, config, *, kv=None, runner=None, wrap=None, seed: int | None = None,
                 impl: str = "triton", check: bool = False, keep_logits: bool = False,
                 speculator=None, async_scheduling: bool = False) -> LLMEngine:
    """The one engine with stage 5's parts, or with the ``kv`` manager, ``runner`` and ``speculator``
    (lesson 11) a later stage passes; ``async_scheduling``: the engine's overlapped step order (lesson 7). ``wrap(name, part)``, if given, may put a wrapper with the same methods around each part
    before the loop gets it ("scheduler", "runner", "sampler"; lesson 7's profiler times them so)."""
    kv = kv if kv is not None else BlockManager(config.num_blocks, config.block_size)
    runner = runner if runner is not None else ModelRunner(model, config, impl=impl, check=check)
    parts = dict(scheduler=Scheduler(kv, config.max_num_batched_tokens, config.max_num_seqs), runner=runner,
                 sampler=Sampler(seed))
    if wrap is not None:
        parts = {name: wrap(name, part) for name, part in parts.items()}
    return LLMEngine(model, tokenizer, config, **parts, speculator=speculator, keep_logits=keep_logits,
                     async_scheduling=async_scheduling)


def _dtype_name(dtype, device) -> str:
    if dtype is None or dtype == "auto":
        dtype = default_dtype(device)
    if not isinstance(dtype, str):
        name = dtype_name_of(dtype)
        if name is None:
            raise UserError(f"dtype {dtype} unsupported: use one of {', '.join(DTYPE_NAMES)}")
        return name
    if dtype not in DTYPE_NAMES:
        raise UserError(f"dtype {dtype!r} unsupported: use one of {', '.join(DTYPE_NAMES)} or 'auto'")
    return dtype


def _check_options(build, options: dict) -> None:
    """Options LLM() passes on to the builder must be ones it takes (a later stage's builder names
    its own and passes the rest to this stage's)."""
    import inspect

    def names(fn):
        ps = inspect.signature(fn).parameters.values()
        return {p.name for p in ps if p.kind == p.KEYWORD_ONLY}, any(p.kind == p.VAR_KEYWORD for p in ps)
    known, more = names(build)
    if more:
        known |= names(build_engine)[0]
    known -= {"kv", "runner", "wrap", "seed", "impl", "speculator"}    # parts, and LLM's own arguments
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"LLM() got {', '.join(unknown)}, which this stage's engine does not take: its options are "
                        f"{', '.join(sorted(known)) or 'none'} (a later stage's LLM takes more).")


class LLM:
    def __init__(self, model: str | None = None, *, device: str | None = None, dtype=None, block_size: int = 16,
                 num_gpu_blocks_override: int | None = None, max_num_batched_tokens: int | None = None,
                 max_num_seqs: int | None = None, max_model_len: int | None = None, seed: int | None = None,
                 gpu_memory_utilization: float = 0.9, impl: str = "triton", build_engine=build_engine,
                 **engine_options):
        _check_options(build_engine, engine_options)             # before anything loads
        device = device or default_device()
        dtype = check_device_dtype(device, _dtype_name(dtype, device))
        path = resolve_model_dir(model)
        self.model = load_model(path, device, dtype)          # a broken checkpoint: one UserError naming the file
        self.tokenizer = load_tokenizer(path)
        config = make_config(self.model.cfg, device, dtype, block_size=block_size,
                             num_gpu_blocks_override=num_gpu_blocks_override,
                             max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                             max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization)
        self.llm_engine = build_engine(self.model, self.tokenizer, config, seed=seed, impl=impl, **engine_options)

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
        groups = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):   # check all before running any
            try:
                groups.append(engine.make_requests(prompt, p))
            except UserError as e:
                raise UserError(f"prompt {i}: {e}") from None
        ids = [engine.add_group(rid, reqs) for rid, reqs in groups]
        try:
            run_to_completion(engine, {req.request_id for _, reqs in groups for req in reqs}, use_tqdm)
        except BaseException:                 # Ctrl-C, or an error: its requests must not linger in the engine
            engine.abort_request(ids)
            raise
        return [engine.release(i) for i in ids]                 # input order, not finishing order

    def get_tokenizer(self):
        """The checkpoint's Hugging Face tokenizer (None for a checkpoint without one)."""
        return self.tokenizer

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """``generate`` on conversations (``[{"role": "user", "content": "..."}, ...]``, or a list of
        them) rendered by the tokenizer's chat template, as vLLM's ``LLM.chat``."""
        convs = [messages] if not messages or isinstance(messages[0], dict) else list(messages)   # [] is refused
        return self.generate([render_chat(self.tokenizer, c, add_generation_prompt, chat_template_kwargs)
                              for c in convs], sampling_params, use_tqdm)


def render_chat(tokenizer, conversation, add_generation_prompt: bool = True, kwargs: dict | None = None) -> str:
    """One conversation as the prompt text its model was trained on (the tokenizer's chat template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise UserError("this checkpoint's tokenizer has no chat template, so messages cannot be rendered: "
                        "use generate() with a text prompt, or a checkpoint whose tokenizer_config.json has one.")
    if not isinstance(conversation, list) or not conversation or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in conversation):
        raise UserError(f'messages must be a non-empty list of {{"role": str, "content": str}}, got '
                        f"{str(conversation)[:80]!r}.")
    return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(kwargs or {}))


def run_to_completion(engine: LLMEngine, own: set[str], use_tqdm: bool = True):
    """Step until nothing is left; a tqdm bar shows the ``own`` sequences done and output tokens/s."""
    from tqdm import tqdm
    bar = tqdm(total=len(own), desc="Processed prompts", unit="req", disable=not use_tqdm, dynamic_ncols=True)
    t0, out_tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            out_tokens += len(o.new_token_ids)
            if o.finished and o.request_id in own:
                bar.update(1)
        bar.set_postfix_str(f"output {out_tokens / (time.perf_counter() - t0):.1f} tok/s", refresh=False)
    bar.close()
