"""One configuration (plumbing/options.py, each stage's options.py): every option declared once, the
same declarations behind LLM(...), the assembler and every script's flags; an option of a later
stage given to an earlier stage's LLM is refused naming the stage that adds it."""
import argparse
from importlib import import_module

import pytest

from l5_scheduler.stages import latest, stage_packages
from plumbing.errors import UserError
from plumbing.options import Option, add_flags, given_flags, resolve


def test_every_option_is_declared_once_and_each_stage_sees_the_ones_before_it():
    from l5_scheduler.assemble import declared
    stages = latest("stage").STAGES
    names = list(declared(stages))                               # raises on a name declared twice
    assert names == [o.name for o in latest("options").ENGINE_OPTIONS]
    for package in stage_packages():                             # a stage's LLM: its options and the earlier ones'
        upto = [o.name for o in import_module(f"{package}.options").ENGINE_OPTIONS]
        mine = [s for s in stages if s.number <= int(package[1:].split("_")[0])]
        assert upto == list(declared(mine))
    twice = stages + (stages[-1],)
    with pytest.raises(RuntimeError, match="declared twice"):
        declared(twice)


@pytest.mark.parametrize("later,option,value", [("l6_prefix_cache", "enable_prefix_caching", False),
                                                ("l7_fast", "enforce_eager", True),
                                                ("l9_fp8_kv", "kv_cache_dtype", "fp8"),
                                                ("l11_spec_decode", "speculative_config", {"method": "ngram"})])
def test_an_earlier_stages_llm_names_the_stage_that_adds_an_option(later, option, value):
    from l5_scheduler import LLM
    with pytest.raises(UserError, match=rf"it is an option of stage \d+ \({later}\), which l5_scheduler comes "
                                        rf"before: use `from {later} import LLM`"):
        LLM(None, **{option: value})
    with pytest.raises(UserError, match=rf"'{option[:-1]}': did you mean '{option}'\? it is an option of stage "
                                        rf"\d+ \({later}\)"):
        LLM(None, **{option[:-1]: value})         # misspelt: the later stage's option is the close one


def test_bad_values_and_unknown_options_are_refused_before_anything_loads(monkeypatch):
    import l5_scheduler.stage as stage                   # the model part's maker loads it
    monkeypatch.setattr(stage, "load_model", lambda *a: pytest.fail("the model loaded before the options were checked"))
    from l11_spec_decode import LLM
    for kw, msg in [(dict(block_size=0), "block_size must be a positive integer, got 0"),
                    (dict(enable_prefix_caching="yes"), "enable_prefix_caching must be a bool, got 'yes'"),
                    (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype must be one of"),
                    (dict(speculative_config={"method": "eagle"}), "'eagle' is not implemented"),
                    (dict(gpu_memory_utilization=1.5), r"gpu_memory_utilization must be in \(0, 1\]"),
                    (dict(enforce_eagre=True), "did you mean 'enforce_eager'"),
                    (dict(kv=None), "unknown option 'kv'")]:
        with pytest.raises(UserError, match=msg):
            LLM(None, **kw)


def test_flags_are_generated_from_the_declarations_and_read_back():
    opts = (Option("block_size", 16, "tokens per block", "cache", "sizes"),
            Option("enforce_eager", False, "no graphs", "model", "graphs"),
            Option("speculative_config", None, "guesses", "speculative", "step", kind=dict))
    p = argparse.ArgumentParser()
    add_flags(p, opts, defaults={"block_size": 8})
    ns = p.parse_args(["--enforce-eager", "--speculative-config", '{"method": "ngram"}'])
    given = given_flags(ns, opts, defaults={"block_size": 8})
    assert given == {"block_size": 8, "enforce_eager": True, "speculative_config": {"method": "ngram"}}
    assert resolve({o.name: o for o in opts}, given).block_size == 8
    assert given_flags(p.parse_args(["--no-enforce-eager"]), opts) == {"enforce_eager": False}
    with pytest.raises(SystemExit):
        p.parse_args(["--speculative-config", "{not json"])


def test_every_engine_option_is_a_flag_of_every_scheduler_smoke_script():
    """The smoke scripts take their stage's options as flags (scripts/l5_smoke.py parser)."""
    from l5_smoke import parser
    for package in stage_packages():
        p = parser(package, "")
        flags = {a.dest for a in p._actions}
        want = {o.name for o in import_module(f"{package}.options").ENGINE_OPTIONS} - {"seed"}   # --seed: sampling's
        assert want <= flags, sorted(want - flags)
