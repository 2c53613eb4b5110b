"""The stage 4 generate loop: stage 3's engine for the logits, the sampler for the token, the
stop checker for the end. Greedy argmax (lessons 1-3) is the special case temperature=0."""
from __future__ import annotations

from dataclasses import dataclass, field

from l1_dense.generate import Generation
from plumbing.errors import UserError

from .params import SamplingParams
from .sampler import RowState, Sampler, TokenLogprobs
from .stops import StopChecker


@dataclass
class SampledGeneration(Generation):
    stop_reason: int | str | None = None
    label: str = ""
    text: str | None = None                       # decoded output, cut at a stop string
    logprobs: list[TokenLogprobs] = field(default_factory=list)


def sample_generate(engine, prompt_ids: list[int], params: SamplingParams, eos_ids=(), max_model_len=None,
                    decode=None, sampler: Sampler | None = None, keep_logits: bool = False) -> SampledGeneration:
    if params.n != 1:
        raise UserError(f"SamplingParams.n={params.n}: stage 4 generates one sequence per call; n > 1 needs "
                        "stage 5's engine (l5_scheduler.LLM), or call this n times with different seeds.")
    later = [name for name, on in (("bad_words", params.bad_words),
                                   ("prompt_logprobs", params.prompt_logprobs is not None),
                                   ("truncate_prompt_tokens", params.truncate_prompt_tokens is not None),
                                   ("detokenize", not params.detokenize),
                                   ("skip_special_tokens", not params.skip_special_tokens)) if on]
    if later:                                               # never silently ignored
        raise UserError(f"SamplingParams.{later[0]}: stage 4's generate loop does not apply it; stage 5's engine "
                        "(l5_scheduler.LLM) does.")
    sampler = sampler or Sampler()
    row = RowState(params, list(prompt_ids), [], tuple(eos_ids))
    stops = StopChecker(params, len(prompt_ids), max_model_len, eos_ids, decode)
    gen = SampledGeneration([], "")
    logits = engine.prefill(prompt_ids)                     # [V]
    while True:
        if keep_logits:
            gen.logits.append(logits.float().cpu())
        out = sampler(logits[None], [row])                  # one row; .tolist() inside is the one sync
        row.output_ids.append(out.token_ids_list[0])
        if out.logprobs:
            gen.logprobs.append(out.logprobs[0])
        finish = stops.update(row.output_ids)
        if finish is not None:
            gen.token_ids, gen.finish_reason = row.output_ids, finish.finish_reason
            gen.stop_reason, gen.label = finish.stop_reason, finish.label
            gen.text = stops.text if decode is not None else None
            return gen
        logits = engine.decode(row.output_ids[-1])
