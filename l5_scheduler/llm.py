"""``LLM``: vLLM's offline API on top of the engine, which the assembler builds (assemble.py).

    from l5_scheduler import LLM, SamplingParams
    llm = LLM("Qwen/Qwen3-0.6B")                       # or None: the built-in tiny Qwen3
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}],
                        SamplingParams(temperature=0.8, max_tokens=32, seed=1))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids, outs[0].outputs[0].finish_reason

``generate`` returns one ``RequestOutput`` per prompt, in input order, whatever order they
finished in. The lower level is ``llm.llm_engine``: ``add_request`` / ``step`` /
``has_unfinished_requests``. ``reset_prefix_cache()`` and ``get_metrics()`` are vLLM's too (below).

``LLM(model, **options)`` checks every option against its declaration (options.py, and each later
stage's own) before anything loads, then hands the checkpoint to the assembler, whose ``model``
part loads it; the sizes (config.py) are made for the model loaded. Each stage exports its own
``LLM`` and ``build_engine``: the same two, over the stages up to it (``entry_points``): a later
stage's ``LLM`` takes its options too.
"""
from __future__ import annotations

import time

from l4_sampler.params import SamplingParams
from plumbing.cli import check_device_dtype, dtype_name_of
from plumbing.errors import UserError
from plumbing.runtime import default_device, default_dtype
from l1_dense.checkpoint import load_tokenizer, resolve_model_dir
from l1_dense.config import ModelConfig

from . import assemble
from .assemble import Checkpoint, engine_config  # noqa: F401  (engine_config: scripts size an engine by it)
from .engine import LLMEngine
from .outputs import Metric, RequestOutput, engine_metrics
from .request import check_encodable

class LLM:
    def __init__(self, model: str | None = None, *, stages, **options):
        args = assemble.resolve_options(stages, dict(options, model=model))   # before anything loads
        device = args.device or default_device()
        dtype = check_device_dtype(device, dtype_name_of(default_dtype(device)) if args.dtype in (None, "auto")
                                   else args.dtype)
        path = resolve_model_dir(args.model)
        ModelConfig.from_dir(path)                 # a broken config.json: named before the tokenizer reads it
        self.tokenizer = load_tokenizer(path)
        # the model slot loads it (a broken checkpoint: one UserError naming the file); the sizes follow it
        self.llm_engine = assemble.build_engine(Checkpoint(path, device, dtype), self.tokenizer, None, stages,
                                                args=args)
        self.model = self.llm_engine.model

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

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, chat_template: str | None = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """``generate`` on conversations (``[{"role": "user", "content": "..."}, ...]``, or a list of
        them) rendered by a chat template, as vLLM's ``LLM.chat``: ``chat_template`` (a Jinja string)
        instead of the tokenizer's; ``continue_final_message``: the prompt ends inside the last message
        (an assistant's reply to continue), so it excludes ``add_generation_prompt``."""
        if continue_final_message and add_generation_prompt:
            raise UserError("continue_final_message=True continues the last message, add_generation_prompt=True "
                            "starts a new one: pass add_generation_prompt=False with it.")
        kw = dict(chat_template_kwargs or {}, continue_final_message=continue_final_message)
        if chat_template is not None:
            kw["chat_template"] = chat_template
        convs = [messages] if not messages or isinstance(messages[0], dict) else list(messages)   # [] is refused
        return self.generate([render_chat(self.tokenizer, c, add_generation_prompt, kw) for c in convs],
                             sampling_params, use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """vLLM's: the KV manager forgets which blocks hold which tokens. True when done, False (nothing
        changed) while a request holds blocks; a KV manager that remembers nothing: True."""
        if self.llm_engine.has_unfinished_requests():
            return False
        return self.llm_engine.scheduler.kv.reset_prefix_cache()

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges now (vLLM returns its Prometheus metrics): a list of
        ``Metric(name, kind, value, help)``, one line each when printed (outputs.engine_metrics)."""
        return engine_metrics(self.llm_engine)


def entry_points(stages):
    """A stage's ``LLM(model, **options)`` and ``build_engine(model, tokenizer, config, **options)``:
    the one LLM and the one assembler, over ``stages`` (this stage and those before it)."""
    last = stages[-1].name

    def llm(model: str | None = None, **options) -> LLM:
        return LLM(model, stages=stages, **options)

    def build_engine(model, tokenizer, config, **kw) -> LLMEngine:
        return assemble.build_engine(model, tokenizer, config, stages, **kw)

    llm.__doc__ = (f"vLLM's ``LLM`` with the parts of {', '.join(s.name for s in stages)}; options: each one's "
                   "options.py (``python scripts/engine_options.py`` lists them).")
    build_engine.__doc__ = f"The assembler over the stages up to {last} (l5_scheduler/assemble.py)."
    llm.__qualname__ = llm.__name__ = "LLM"
    build_engine.__qualname__ = build_engine.__name__ = "build_engine"
    return llm, build_engine


def render_chat(tokenizer, conversation, add_generation_prompt: bool = True, kwargs: dict | None = None) -> str:
    """One conversation as the prompt text its model was trained on (the tokenizer's chat template)."""
    if tokenizer is None or not (getattr(tokenizer, "chat_template", None) or (kwargs or {}).get("chat_template")):
        raise UserError("this checkpoint's tokenizer has no chat template, so messages cannot be rendered: "
                        "use generate() with a text prompt, or a checkpoint whose tokenizer_config.json has one.")
    if not isinstance(conversation, list) or not conversation or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in conversation):
        raise UserError(f'messages must be a non-empty list of {{"role": str, "content": str}}, got '
                        f"{str(conversation)[:80]!r}.")
    for i, m in enumerate(conversation):
        check_encodable(m["role"], f"messages[{i}].role")
        check_encodable(m["content"], f"messages[{i}].content")
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **(kwargs or {}))
    except Exception as e:            # the template's own refusal (jinja's raise_exception): these messages'
        raise UserError(f"the chat template cannot render these messages ({type(e).__name__}: {str(e)[:200]}): "
                        "check their roles and order against the model's template.") from None


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
