"""The unguarded engine core, planted for tests/test_l10_fuzz.py: the engine core process (spawned: it
imports this module by name, tests/ being on the path) undoes the two fixes in its own modules,
then runs as usual.

    the tokenizer's TypeError on a lone surrogate reaches the core    (l5_scheduler.request.encode)
    the core takes only a UserError as the request's own failure      (l10_server.engine_core.refusal)
"""
from plumbing.errors import UserError


def raw_encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def narrowed_refusal(e):
    if not isinstance(e, UserError):      # was: "except UserError" around the admission
        raise e
    return e


def run_unguarded_core(model, llm_kwargs, inbox, outbox):
    import l5_scheduler.request
    import l10_server.engine_core
    l5_scheduler.request.encode = raw_encode
    l10_server.engine_core.refusal = narrowed_refusal
    l10_server.engine_core.run_engine_core(model, llm_kwargs, inbox, outbox)
