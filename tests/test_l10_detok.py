"""Stage 10's incremental detokenizer: a stream never sends half a UTF-8 character nor a stop
string's first characters, and its deltas add up to the engine's non-streamed text. On the tiny
byte-level tokenizer, where every byte is a token (a worst case for splitting characters)."""
import pytest
from hypothesis import example, given, settings, strategies as st

from l4_sampler import SamplingParams
from l4_sampler.stops import StopChecker
from l10_server import IncrementalDetokenizer
from l5_scheduler import LLM


@pytest.fixture(scope="module")
def llm():
    return LLM(None, dtype="float32", impl="torch")


def _stream(tok, ids, stop, include):
    """One token per step, as a decode does: stage 4's stop checks, then the delta the stream sends."""
    params = SamplingParams(max_tokens=len(ids), stop=stop, include_stop_str_in_output=include, ignore_eos=True)
    decode = lambda x: tok.decode(x, skip_special_tokens=True)    # noqa: E731
    stops, detok, out, deltas = StopChecker(params, 1, None, (), decode if stop else None), \
        IncrementalDetokenizer(tok, stop, include), [], []
    for t in ids:
        out.append(t)
        fin = stops.update(out)
        detok.add([t])
        deltas.append(detok.delta(stops.text if stop else decode(out)) if fin else detok.delta())
        if fin:
            return deltas, stops.text if stop else decode(out)
    raise AssertionError("the request never finished")


TEXT = st.text(alphabet=st.sampled_from(list("ab\n é日本🙂")), min_size=1, max_size=24)


@settings(max_examples=150, deadline=None)
@example(text="a日\n\nb", stop=["\n\n"], include=False)
@example(text="é🙂é", stop=["🙂"], include=True)
@given(text=TEXT, stop=st.lists(st.text(alphabet=st.sampled_from(list("ab\n日🙂")), min_size=1, max_size=3),
                                max_size=2), include=st.booleans())
def test_deltas_never_split_a_character_never_leak_a_stop_string_and_add_up(llm, text, stop, include):
    tok = llm.get_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    deltas, final = _stream(tok, ids, stop, include)
    assert "".join(deltas) == final
    assert not any("\ufffd" in d for d in deltas)
    if not include:
        assert not any(s in "".join(deltas) for s in stop)


def test_a_served_stream_equals_the_engines_text_with_stop_strings(llm):
    e = llm.llm_engine
    text = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0] \
        .outputs[0].text
    for stop, include in (([text[4:6]], False), ([text[4:6]], True), ([], False)):
        sp = SamplingParams(temperature=0, max_tokens=16, stop=stop, include_stop_str_in_output=include)
        rid = e.add_request("The capital of France is", sp)
        detok, deltas = IncrementalDetokenizer(llm.get_tokenizer(), stop, include), []
        while e.has_unfinished_requests():
            for o in e.step():
                detok.add(o.new_token_ids)
                deltas.append(detok.delta(e.output(rid).outputs[0].text) if o.finished else detok.delta())
        assert "".join(deltas) == e.release(rid).outputs[0].text == (text[:6] if include else text[:4] if stop else text)
