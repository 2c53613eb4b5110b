"""The option stage 6 adds (declared once, here; plumbing/options.py)."""
from plumbing.options import Option
from l5_scheduler.options import ENGINE_OPTIONS as BEFORE

OPTIONS = (
    Option("enable_prefix_caching", True, "share the KV blocks of equal prompt prefixes between requests "
           "(off: no hashes, no hits)", "cache", "kv_manager"),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
