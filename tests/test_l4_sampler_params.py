"""Stage 4 sampler, per request: parameter validation, per-request seeds and raw logprobs (each
processor, their order and the draw distribution: tests/test_l4_sampler.py).

Expected values come from hand arithmetic or plain-Python math in this file, never from the code
under test.
"""
import math

import pytest
import torch

from plumbing.errors import UserError
from l4_sampler import RowState, Sampler, SamplingParams, noise_seed
from test_l4_sampler import rows_of


# ---- validation ---------------------------------------------------------------------------------
BAD = [  # (field, value, words of the valid range that the message must contain)
    ("temperature", -0.1, ">= 0"), ("temperature", float("nan"), ">= 0"),
    ("temperature", float("inf"), ">= 0"), ("temperature", "1", ">= 0"),
    ("temperature", True, ">= 0"),
    ("top_k", -2, ">= 1"), ("top_k", 2.5, ">= 1"), ("top_k", True, ">= 1"),
    ("top_p", 0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", float("nan"), "(0, 1]"),
    ("min_p", -0.01, "[0, 1]"), ("min_p", 1.01, "[0, 1]"),
    ("repetition_penalty", 0, "> 0"), ("repetition_penalty", -1.0, "> 0"),
    ("presence_penalty", 2.5, "[-2, 2]"), ("presence_penalty", -2.01, "[-2, 2]"),
    ("frequency_penalty", 3, "[-2, 2]"), ("frequency_penalty", -3.0, "[-2, 2]"),
    ("seed", 1.5, "int or None"), ("seed", "7", "int or None"),
    ("max_tokens", 0, ">= 1"), ("max_tokens", 2.0, ">= 1"),
    ("min_tokens", -1, "[0, max_tokens=16]"), ("min_tokens", 17, "[0, max_tokens=16]"),
    ("min_tokens", 1.0, "[0, max_tokens=16]"),
    ("stop_token_ids", [1.0], "ints >= 0"), ("stop_token_ids", [-1], "ints >= 0"),
    ("stop_token_ids", 5, "ints >= 0"), ("stop_token_ids", [True], "ints >= 0"),
    ("stop", [1], "non-empty string"), ("stop", [""], "non-empty string"),
    ("stop", "", "non-empty string"), ("stop", 5, "non-empty string"),
    ("ignore_eos", 1, "bool"), ("logprobs", -2, "-1 (the whole vocabulary)"), ("logprobs", 1.5, ">= 0"),
    ("prompt_logprobs", -2, "-1 (the whole vocabulary)"), ("prompt_logprobs", "1", ">= 0"),
    ("logit_bias", {"a": 1.0}, "token id"), ("logit_bias", {-1: 1.0}, "token id"), ("logit_bias", [1], "dict"),
    ("logit_bias", {1: float("nan")}, "finite"), ("allowed_token_ids", [], "non-empty list"),
    ("allowed_token_ids", [-1], "non-empty list"), ("allowed_token_ids", 5, "non-empty list"),
    ("bad_words", [""], "non-empty strings"), ("bad_words", ["  "], "non-empty strings"), ("bad_words", "x", "list"),
    ("detokenize", 0, "bool"), ("skip_special_tokens", None, "bool"), ("spaces_between_special_tokens", 1, "bool"),
    ("truncate_prompt_tokens", 0, "-1 (max_model_len) or an int >= 1"), ("truncate_prompt_tokens", -2, ">= 1"),
    ("truncate_prompt_tokens", 1.0, ">= 1"),
]


@pytest.mark.parametrize("field,value,valid", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_invalid_param_rejected_naming_field_range_value(field, value, valid):
    with pytest.raises(UserError) as e:
        SamplingParams(**{field: value})
    msg = str(e.value)
    assert f"SamplingParams.{field}" in msg and valid in msg and repr(value) in msg, msg


def test_edge_values_accepted_and_stop_normalised():
    for kw in [dict(temperature=0), dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(top_p=1),
               dict(min_p=0), dict(min_p=1), dict(presence_penalty=-2), dict(frequency_penalty=2),
               dict(min_tokens=16), dict(seed=-5), dict(logprobs=0), dict(max_tokens=1), dict(logprobs=-1),
               dict(prompt_logprobs=-1), dict(prompt_logprobs=0), dict(max_tokens=None, min_tokens=40),
               dict(truncate_prompt_tokens=-1), dict(truncate_prompt_tokens=3), dict(detokenize=False),
               dict(skip_special_tokens=False, spaces_between_special_tokens=False)]:
        SamplingParams(**kw)
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]
    assert SamplingParams(stop=None).stop == [] and SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(bad_words=None).bad_words == [] and SamplingParams(bad_words=["a", "a"]).bad_words == ["a"]
    assert SamplingParams(logit_bias={"7": 2}).logit_bias == {7: 2.0}         # JSON's keys are strings
    with pytest.raises(UserError, match=r"SamplingParams\.stop .*detokenize=False.*detokenize=True"):
        SamplingParams(stop=["x"], detokenize=False)


def test_bad_sampler_input_rejected():
    with pytest.raises(UserError, match="2-D float"):
        Sampler()(torch.zeros(5), rows_of(1))
    with pytest.raises(UserError, match="one RowState per logits row"):
        Sampler()(torch.zeros(2, 5), rows_of(1))
    with pytest.raises(UserError, match=r"\[0, V=5\)"):
        Sampler()(torch.zeros(1, 5), rows_of(1, stop_token_ids=[7]))


# ---- seeds --------------------------------------------------------------------------------------
def test_seeded_row_independent_of_batch_slot_and_neighbours():
    g = torch.Generator().manual_seed(4)
    mine = torch.randn(1000, generator=g)                        # flat-ish: many plausible tokens
    other = torch.randn(4, 1000, generator=g)
    me = RowState(SamplingParams(seed=42), list(range(7)), [1, 2, 3])
    alone = Sampler(seed=0)(mine[None], [me]).token_ids_list[0]
    batch = torch.stack([other[0], other[1], mine, other[2], mine, other[3]])
    rows = [RowState(SamplingParams(), [1], []), RowState(SamplingParams(seed=1), [1, 2], []), me,
            RowState(SamplingParams(temperature=0), [3], []), me,
            RowState(SamplingParams(seed=42, top_k=3), [4] * 10, [])]   # same seed & position
    ids = Sampler(seed=123)(batch, rows).token_ids_list
    assert ids[2] == ids[4] == alone

    def one(seed, prompt_len):
        row = RowState(SamplingParams(seed=seed), [0] * prompt_len, [])
        return Sampler()(mine[None], [row]).token_ids_list[0]
    # ...and the noise does depend on the position and on the seed
    at_pos = {one(42, n) for n in range(1, 21)}
    by_seed = {one(s, 1) for s in range(20)}
    assert len(at_pos) > 10 and len(by_seed) > 10


def test_unseeded_rows_reproducible_from_sampler_seed():
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(5))
    a = Sampler(seed=7)(logits, rows_of(64)).token_ids_list
    assert a == Sampler(seed=7)(logits, rows_of(64)).token_ids_list
    assert a != Sampler(seed=8)(logits, rows_of(64)).token_ids_list


def test_noise_seed_distinct_for_nearby_pairs():
    assert len({noise_seed(s, p) for s in range(100) for p in range(100)}) == 10_000


# ---- raw logprobs -------------------------------------------------------------------------------
def test_logprobs_are_raw_before_any_processing():
    z = [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]
    lse = math.log(sum(math.exp(x) for x in z))
    raw = [x - lse for x in z]                                   # by hand, no penalties
    rows = [RowState(SamplingParams(logprobs=3, repetition_penalty=3.0, temperature=0.3, top_k=2,
                                    seed=0), [3], [3]),
            RowState(SamplingParams(temperature=0), [0], []),
            RowState(SamplingParams(logprobs=0, temperature=0, presence_penalty=2.0), [0], [3])]
    out = Sampler()(torch.tensor([z] * 3), rows)
    lp0, lp1, lp2 = out.logprobs
    assert [t for t, _ in lp0.top] == [3, 0, 2]                  # raw order, though 3 is penalised
    assert [v for _, v in lp0.top] == pytest.approx([raw[3], raw[0], raw[2]], abs=1e-5)
    assert lp0.token_id == out.token_ids_list[0]
    assert lp0.logprob == pytest.approx(raw[lp0.token_id], abs=1e-5)
    assert lp1 is None
    assert lp2.top == [] and lp2.token_id == 0 and lp2.logprob == pytest.approx(raw[0], abs=1e-5)
    assert Sampler()(torch.tensor([z]), rows_of(1)).logprobs is None
