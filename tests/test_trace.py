"""The typed question trace: it round-trips through its stored form, reads what older runs
wrote, and refuses a line that is not a question's trace."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.trace import QuestionTrace, TraceError, first_error, read_trace

texts = st.text(max_size=40)
scores = st.dictionaries(
    st.sampled_from(["evidence_similarity", "evidence_hit_rate", "judge_correct"]),
    st.none() | st.floats(0, 1),
)
traces = st.builds(
    QuestionTrace,
    id=texts,
    conversation_id=texts,
    query=st.none() | st.dictionaries(st.text(max_size=8), texts | st.lists(texts, max_size=3)),
    retrieved=st.none() | texts,
    over_budget=st.none() | st.booleans(),
    raw_chars=st.none() | st.integers(0, 10**6),
    retrieve_ms=st.none() | st.floats(0, 1e4),
    answer=st.none() | texts,
    error=st.none() | texts,
    diagnostics=st.none() | st.dictionaries(st.sampled_from(["d_ext", "d_idx"]), st.floats(0, 1)),
    capability=st.none() | texts,
    scores=scores,
    judged=st.none() | st.dictionaries(st.text(max_size=8), texts),
)


@settings(max_examples=60, deadline=None)
@given(traces)
def test_a_trace_reads_back_equal_to_what_was_written(trace: QuestionTrace) -> None:
    line = trace.to_json()
    assert "\n" not in line
    assert read_trace(line) == trace


def test_a_trace_written_by_an_older_run_still_reads() -> None:
    # what a failed question looked like before traces were typed: only id, conversation, error
    old = {"id": "q1", "conversation_id": "c1", "error": "worker: crashed", "retired": 1}
    trace = read_trace(json.dumps(old))
    assert (trace.id, trace.conversation_id, trace.error) == ("q1", "c1", "worker: crashed")
    assert trace.retrieved is None and trace.retrieved_text == "" and trace.scores == {}


@pytest.mark.parametrize("missing", ["id", "conversation_id"])
def test_a_trace_without_its_question_is_refused(missing: str) -> None:
    data = {"id": "q1", "conversation_id": "c1", "retrieved": "text"}
    del data[missing]
    with pytest.raises(TraceError, match=missing):
        read_trace(json.dumps(data))


@pytest.mark.parametrize("line", ["{not json", '["q1"]', '{"id": "q1", "conversation_id": 3}'])
def test_a_line_that_is_not_a_trace_is_refused(line: str) -> None:
    with pytest.raises(TraceError):
        read_trace(line)


def test_first_error_names_the_first_failed_question() -> None:
    ok = QuestionTrace(id="a", conversation_id="c")
    bad = [QuestionTrace(id=i, conversation_id="c", error=f"plan: {i}") for i in ("b", "d")]
    assert first_error([ok, *bad]) == "plan: b"
    assert first_error([ok]) == ""
