"""Stage 4 in the generate loop: greedy = stage 3, seeds repeat, stops end the loop where they should."""
import json

import pytest

from l1_dense.generate import greedy_generate
from l3_paged.engine import PagedEngine
from l4_sampler.generate import sample_generate
from l4_sampler.params import SamplingParams
from l4_sampler.sampler import Sampler
from l4_smoke import main as l4_main

PROMPT = [84, 104, 101, 32, 99, 97, 112, 105, 116, 97, 108, 32, 111, 102]


def _run(model, params, decode=None, sampler_seed=None):
    e = PagedEngine(model, 16, 16, impl="torch")
    return sample_generate(e, PROMPT, params, model.cfg.eos_token_ids, 1024, decode, Sampler(seed=sampler_seed))


def test_l4_greedy_tokens_match_l3_paged_argmax(tiny):
    model, _ = tiny("qwen3")
    want = greedy_generate(PagedEngine(model, 16, 16, impl="torch"), PROMPT, 16).token_ids
    assert _run(model, SamplingParams(temperature=0.0, max_tokens=16)).token_ids == want


def test_l4_seeded_sampling_repeats_and_other_seed_differs(tiny):
    model, _ = tiny("qwen3")
    p = dict(temperature=1.0, top_p=0.95, max_tokens=16)
    a = _run(model, SamplingParams(seed=7, **p), sampler_seed=1).token_ids
    b = _run(model, SamplingParams(seed=7, **p), sampler_seed=2).token_ids   # other global RNG: no effect
    c = _run(model, SamplingParams(seed=8, **p)).token_ids
    assert a == b and a != c


def test_l4_stop_token_id_ends_generation_at_that_token(tiny):
    model, _ = tiny("qwen3")
    greedy = _run(model, SamplingParams(temperature=0.0, max_tokens=16)).token_ids
    k = 5
    stop_id = greedy[k]
    first = greedy.index(stop_id)
    g = _run(model, SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_id]))
    assert g.token_ids == greedy[:first + 1] and (g.finish_reason, g.stop_reason) == ("stop", stop_id)
    g = _run(model, SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_id], min_tokens=first + 1))
    assert len(g.token_ids) > first + 1 and g.token_ids[first] != stop_id   # held back: masked, not sampled


def test_l4_stop_string_is_cut_from_text(tiny):
    model, path = tiny("qwen3")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path))
    greedy = _run(model, SamplingParams(temperature=0.0, max_tokens=16)).token_ids
    stop = tok.decode(greedy[6:8])
    g = _run(model, SamplingParams(temperature=0.0, max_tokens=16, stop=[stop]), decode=tok.decode)
    assert g.finish_reason == "stop" and g.stop_reason == stop
    assert stop not in g.text and tok.decode(greedy).startswith(g.text)


def test_l4_smoke_seeded_twice_prints_identical_tokens(capsys):
    argv = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--json", "--impl", "torch"]
    def run():       # the whole JSON object but the wall-clock fields, which vary run to run
        l4_main(argv)
        rec = json.loads(capsys.readouterr().out)
        assert rec.pop("elapsed_s") > 0 and rec.pop("tokens_per_s") > 0
        return rec
    first = run()
    assert run() == first and len(first["token_ids"]) == 20


@pytest.mark.parametrize("flag,value,field", [("--top-p", "0", "top_p"), ("--temperature", "-1", "temperature"),
                                              ("--top-k", "-2", "top_k"), ("--min-p", "2", "min_p")])
def test_l4_smoke_rejects_bad_params_naming_the_field(flag, value, field):
    from plumbing.errors import UserError
    with pytest.raises(UserError, match=f"SamplingParams.{field}"):
        l4_main([flag, value])


@pytest.mark.parametrize("field,value", [("bad_words", ["the"]), ("prompt_logprobs", 1), ("truncate_prompt_tokens", 4),
                                         ("detokenize", False), ("skip_special_tokens", False)])
def test_l4_generate_refuses_what_only_stage_5_applies(tiny, field, value):
    """Never silently ignored: stage 4's loop names the field and the stage that applies it."""
    from plumbing.errors import UserError
    model, _ = tiny("qwen3")
    with pytest.raises(UserError, match=f"SamplingParams.{field}: stage 4's generate loop does not apply it"):
        sample_generate(PagedEngine(model, 16, 16, impl="torch"), [1, 2, 3],
                        SamplingParams(max_tokens=2, **{field: value}))
