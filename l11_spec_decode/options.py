"""The option stage 11 adds (declared once, here; plumbing/options.py). Its value is vLLM's dict,
checked by config.py before anything is built."""
from l9_fp8_kv.options import ENGINE_OPTIONS as BEFORE
from plumbing.options import Option

from .config import parse_spec_config

OPTIONS = (
    Option("speculative_config", None, "guess tokens and verify them in one pass: {\"method\": \"ngram\" | "
           "\"draft_model\", \"num_speculative_tokens\": k, ...} (config.py; None: no speculation)", "speculative",
           "step", kind=dict, check=parse_spec_config),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
