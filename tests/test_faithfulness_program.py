"""The faithfulness programs with a scripted LM: label parsing and re-asks, evidence offsets,
decomposition clean-up, evidence modes and concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

import dspy
import pytest

from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter
from booklens.programs.faithfulness import (
    ClaimDecomposer,
    ClaimVerifier,
    build_checker,
    build_decomposer,
    build_verifier,
    clean_claims,
    clean_evidence,
    evidence_budget,
)
from booklens.retrieval import BookIndex
from booklens.testing import ScriptedLM
from booklens.text import count_tokens

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"


def story() -> str:
    from booklens.text import read_book

    return read_book(STORY)


def verdict(label="faithful", supporting=(1,), refuting=(), reason="The first passage says so."):
    return {"label": label, "supporting_passages": list(supporting), "refuting_passages": list(refuting),
            "reason": reason}


def run_with(responder, fn, **lm_kwargs):
    lm = ScriptedLM(responder, **lm_kwargs)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        return fn(), lm


# ---------------------------------------------------------------------------
# Labels


@pytest.mark.parametrize("label, fables", [("faithful", "Yes"), ("unfaithful", "No"),
                                           ("partial support", "PartialSupport"), ("can't verify", "Inapplicable")])
def test_every_label_parses_and_maps_to_fables(label, fables):
    checker = build_checker(evidence_mode="given")
    result, _ = run_with(lambda call: verdict(label),
                         lambda: checker(claims=["Anna sails home."], given_evidence=[["Anna sailed home."]]))
    v = result.claims[0]
    assert v.label == label and v.fables_label == fables and v.error is None and v.attempts == 1
    assert result.label_percentages[label] == 100.0 and result.failures == 0


@pytest.mark.parametrize("written, label", [("Faithful", "faithful"), ("UNFAITHFUL", "unfaithful"),
                                            ("Partial  Support", "partial support"), ("Can't verify.", "can't verify"),
                                            ("can\u2019t verify", "can't verify"),
                                            ("\u201cFaithful\u201d", "faithful"), ("__Unfaithful__", "unfaithful")])
def test_a_label_written_in_capitals_is_read_as_the_label(written, label):
    checker = build_checker(evidence_mode="given")
    result, lm = run_with(lambda call: verdict(written),
                          lambda: checker(claims=["Anna sails home."], given_evidence=[["Anna sailed home."]]))
    v = result.claims[0]
    assert (v.label, v.error, v.attempts) == (label, None, 1) and len(lm.backend.calls) == 1


@pytest.mark.parametrize("label_set, written, label", [
    ("four-way", "Label: Unfaithful", "unfaithful"), ("four-way", "**Faithful**", "faithful"),
    ("four-way", "faithful.", "faithful"), ("four-way", "Partially supported", "partial support"),
    ("four-way", "The claim is partly supported.", "partial support"), ("four-way", "Cannot verify", "can't verify"),
    ("four-way", "Can not be verified", "can't verify"), ("four-way", "Unverifiable", "can't verify"),
    ("four-way", "The claim is unfaithful", "unfaithful"), ("four-way", "Unfaithful - he stayed home", "unfaithful"),
    ("binary", "Label: unfaithful", "unfaithful"), ("binary", "The claim is faithful.", "faithful"),
    ("binary", "not faithful", "unfaithful"), ("four-way", "**Label:** Unfaithful", "unfaithful"),
    ("four-way", "**Label**: partially supported", "partial support"), ("binary", "**Label:** **faithful**", "faithful"),
    ("four-way", "**The claim is** unfaithful.", "unfaithful"), ("binary", "True", "faithful"),
    ("binary", "true", "faithful"), ("binary", "False", "unfaithful"), ("binary", "**False.**", "unfaithful"),
    ("binary", "The claim is true.", "faithful"), ("binary", "Faithful. The claim is true to the book.", "faithful")])
@pytest.mark.parametrize("passages", [["Anna sailed home."], None])
def test_a_label_after_a_label_name_or_in_a_phrase_is_read_as_the_label(label_set, written, label, passages):
    """'Label: Unfaithful' or 'Partially supported' (a model without its answer schema enforced) name
    one label: refused, they were asked again until the claim was recorded as unverified."""
    verifier = build_verifier(label_set=label_set)
    pred, lm = run_with(lambda call: verdict(written), lambda: verifier(claim="Anna sails home.", passages=passages))
    assert (pred.label, pred.error, pred.attempts) == (label, None, 1) and len(lm.backend.calls) == 1


@pytest.mark.parametrize("label_set, written", [
    ("four-way", "faithful or unfaithful"), ("four-way", "not faithful"), ("four-way", "not unfaithful"),
    ("four-way", "Faithful - though partially supported"), ("four-way", "maybe"), ("four-way", "supported"),
    ("binary", "Partially supported"), ("binary", "Cannot verify"), ("binary", "not unfaithful"),
    ("binary", "faithful or unfaithful"), ("four-way", "**Label:** faithful or unfaithful"),
    ("four-way", "**Label**: not faithful"), ("four-way", "True"), ("four-way", "False"),
    ("binary", "true or false"), ("binary", "Faithful - it is false"), ("binary", "False - but true in part")])
def test_a_label_naming_no_single_label_is_still_asked_again(label_set, written):
    """'not faithful' may be unfaithful or partial support among the four labels (binary has only the
    one), and a double negation is a guess: asked again, then recorded as a failure."""
    verifier = build_verifier(label_set=label_set)
    pred, lm = run_with(lambda call: verdict(written), lambda: verifier(claim="Anna sails home.",
                                                                        passages=["Anna sailed home."]))
    assert pred.label is None and written in pred.error and len(lm.backend.calls) == 3


def test_an_out_of_set_label_is_reasked_then_recorded_as_a_failure():
    checker = build_checker(evidence_mode="given")
    result, lm = run_with(lambda call: verdict("mostly true"),
                          lambda: checker(claims=["Anna sails home.", "Ben stays."],
                                          given_evidence=[["Anna sailed home."], ["Ben stayed."]]))
    calls = lm.backend.calls
    assert len(calls) == 6  # three tries per claim
    assert sorted(c.attempt for c in calls) == [0, 0, 1, 1, 2, 2]  # each re-ask is a fresh sample
    for v in result.claims:
        assert v.label is None and v.fables_label is None and v.attempts == 3
        assert "mostly true" in v.error
    assert result.failures == 2 and result.label_counts["failed"] == 2
    assert result.label_counts["faithful"] == 0 and result.label_percentages == {}  # unknown, not 0% of each


def test_claims_the_judge_could_not_label_are_left_out_of_the_shares():
    # One claim verified faithful, one never given a valid label: the share is of the verified claim
    # only, so a failing judge does not read as an unfaithful summary.
    checker = build_checker(evidence_mode="given")
    result, _ = run_with(lambda call: verdict("faithful" if "Anna" in call.inputs["claim"] else "mostly true"),
                         lambda: checker(claims=["Anna sails home.", "Ben stays."],
                                         given_evidence=[["Anna sailed home."], ["Ben stayed."]]))
    assert result.failures == 1 and result.label_counts == {"faithful": 1, "unfaithful": 0, "partial support": 0,
                                                            "can't verify": 0, "failed": 1}
    assert result.label_percentages == {"faithful": 100.0, "unfaithful": 0.0, "partial support": 0.0,
                                        "can't verify": 0.0}


def test_a_bad_first_answer_is_replaced_by_the_reasked_one():
    def responder(call):
        return "not json at all" if call.attempt == 0 else verdict("unfaithful", supporting=(), refuting=(1,))

    checker = build_checker(evidence_mode="given")
    result, lm = run_with(responder, lambda: checker(claims=["Anna sails home."],
                                                     given_evidence=[["Anna never left."]]))
    v = result.claims[0]
    assert v.label == "unfaithful" and v.attempts == 2 and v.error is None
    assert v.evidence[0].refutes and not v.evidence[0].supports


def test_verifier_reports_passage_numbers_and_drops_invalid_ones():
    verifier = build_verifier()
    pred, _ = run_with(lambda call: verdict("partial support", supporting=(2, 7), refuting=(1, 1, 0)),
                       lambda: verifier(claim="c", passages=["one", "two"]))
    assert pred.label == "partial support"
    assert pred.supporting == [2] and pred.refuting == [1] and pred.invalid_references == [0, 7]


@pytest.mark.parametrize("written, numbers", [
    (["Passage 2"], [2]), (["[2]", "[3]"], [2, 3]), (2, [2]), ("passages 1 and 3", [1, 3]), (None, []),
    (["none"], []), ([2.0], [2]), (["2.0"], [2]), ("passages 1-3", [1, 2, 3]), (["1 to 2", "3"], [1, 2, 3]),
], ids=["named", "bracketed", "bare-number", "sentence", "null", "word", "float", "float-text", "range",
        "range-in-words"])
def test_passage_numbers_written_as_text_keep_the_verdict(written, numbers):
    """A server that does not enforce the answer schema lets a model write its passage lists as it
    likes: "Passage 2", "[2]", a bare 2. The label it gave is valid, and used to be thrown away
    (asked three times, then recorded as a failure) for the way the numbers were written."""
    def responder(call):
        return {"label": "faithful", "reason": "The passage says so.", "supporting_passages": written,
                "refuting_passages": []}

    pred, lm = run_with(responder, lambda: build_verifier()(claim="c", passages=["one", "two", "three"]))
    assert (pred.label, pred.error, pred.attempts, len(lm.backend.calls)) == ("faithful", None, 1, 1)
    assert pred.supporting == numbers and pred.refuting == []


def test_a_passage_number_with_a_fraction_is_refused_not_split():
    from booklens.signatures.answers import read_numbers

    assert read_numbers(["2.5"]) == ["2.5"]  # refused by the list[int] field, and asked again
    assert read_numbers("2-4, 7") == [2, 3, 4, 7] and read_numbers("1-1000") == [1, 1000]


def test_a_cut_off_answer_keeps_its_label_but_not_its_passage_lists():
    lm = ScriptedLM(lambda call: verdict("faithful", supporting=list(range(1, 60))))
    lm.backend.finish_reason = "length"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        pred = build_verifier()(claim="c", passages=["one", "two"])
    assert pred.label == "faithful" and pred.truncated and pred.error is None and pred.attempts == 1
    assert pred.supporting == [] and pred.refuting == [] and pred.invalid_references == []


# ---------------------------------------------------------------------------
# Evidence


def test_retrieved_evidence_offsets_point_at_the_book_text():
    text = story()
    index = BookIndex.build(text, passage_tokens=96)
    claims = ["The keeper let the lamp go dark.", "The storm wrecked a ship near the rocks."]
    checker = build_checker(evidence_mode="bm25", k=3)
    result, lm = run_with(lambda call: verdict(supporting=(2,)), lambda: checker(claims=claims, index=index))
    for v in result.claims:
        assert 1 <= len(v.evidence) <= 3
        assert [e.number for e in v.evidence] == list(range(1, len(v.evidence) + 1))
        for e in v.evidence:
            assert e.source == "bm25" and e.score is not None
            assert text[e.start:e.end] == e.text == index.passages[e.passage].text
        assert v.evidence[1].supports and not v.evidence[0].supports
    # the verifier saw exactly these passages, numbered, before the claim
    # (claims run concurrently: find the call for the first claim rather than trusting the order)
    call = next(c for c in lm.backend.calls if c.inputs["claim"] == claims[0])
    prompt = call.messages[-1]["content"]
    first = result.claims[0].evidence[0].text
    assert prompt.index("[[ ## evidence ## ]]") < prompt.index("[[ ## claim ## ]]")
    assert "[1] " + first.strip()[:40] in prompt


def test_claims_against_the_same_evidence_share_their_prompt_up_to_the_claim():
    text = story()[:2500]  # fits the evidence budget whole: every claim gets the same passages
    index = BookIndex.build(text, passage_tokens=96)
    checker = build_checker(evidence_mode="book")
    claims = ["The keeper let the lamp go dark.", "Anna sails home."]
    result, lm = run_with(lambda call: verdict(), lambda: checker(claims=claims, index=index))
    assert [c.claim for c in result.claims] == claims
    prompts = [call.messages[-1]["content"] for call in lm.backend.calls]
    assert len(prompts) == 2
    shared, tails = zip(*(p.split("[[ ## claim ## ]]") for p in prompts))
    # The format reminder is the same for every claim, so it comes after the evidence and before the claim.
    assert shared[0] == shared[1]
    assert shared[0].index("[[ ## evidence ## ]]") < shared[0].index("Respond with a JSON object")
    # claims are verified concurrently, so the calls may come in either order
    assert sorted(t.strip() for t in tails) == sorted(claims)
    assert sorted(call.inputs["claim"] for call in lm.backend.calls) == sorted(claims)


def test_given_quotes_are_located_in_the_book():
    text = story()
    index = BookIndex.build(text, passage_tokens=96)
    sentence = next(s for s in text.split(". ") if len(s) > 60).strip()
    quote = " ".join(sentence.split()[:12])
    checker = build_checker(evidence_mode="given")
    result, lm = run_with(lambda call: verdict(), lambda: checker(
        claims=["A claim."], index=index, given_evidence=[[quote, "N/A", "Words that are nowhere in it."]]))
    ev = result.claims[0].evidence
    assert len(ev) == 2  # the placeholder is not evidence
    assert ev[0].source == "given" and " ".join(text[ev[0].start:ev[0].end].split()) == quote
    assert index.passages[ev[0].passage].start <= ev[0].start < index.passages[ev[0].passage].end
    assert ev[1].start is None and ev[1].passage is None


def test_book_mode_fills_the_budget_and_needs_a_book(monkeypatch):
    import booklens.retrieval as retrieval

    text = story()
    index = BookIndex.build(text, passage_tokens=64)
    monkeypatch.setattr(index, "ensure_dense", lambda: None)
    monkeypatch.setattr(index, "rank", lambda q, mode, depth: [(5, 1.0)])
    checker = build_checker(evidence_mode="book", budget_tokens=300)
    result, _ = run_with(lambda call: verdict(), lambda: checker(claims=["x"], index=index))
    ev = result.claims[0].evidence
    assert ev and sum(count_tokens(e.text) for e in ev) <= 300
    assert 5 in [e.passage for e in ev] and all(text[e.start:e.end] == e.text for e in ev)
    for mode in ("bm25", "dense", "hybrid", "book"):
        with pytest.raises(BooklensError, match="needs a book"):
            build_checker(evidence_mode=mode).verify_claims(["x"], index=None)
    assert retrieval.BOOK_MODES == ("bm25", "dense", "hybrid", "book")


def test_book_mode_embeds_nothing_when_the_whole_book_fits(tmp_path, monkeypatch):
    """A book the budget holds is shown whole: no passage is ranked, so the embedding model is not
    loaded and the book not embedded (minutes for a novel a large-window model reads whole)."""
    import booklens.retrieval.index as index_module
    from booklens.steps import verify_claims

    def no_embedding(*args, **kwargs):
        raise AssertionError("the book was embedded")

    monkeypatch.setattr(index_module, "embed", no_embedding)
    monkeypatch.setattr(index_module, "embedding_model", no_embedding)
    text = story()
    report, _ = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren kept the lighthouse."], book_text=text, mode="book", budget_tokens=count_tokens(text) + 100,
        cache_dir=tmp_path))
    (claim,) = report.claims
    assert [e.passage for e in claim.evidence] == [p.index for p in BookIndex.build(text).passages]
    assert not list((tmp_path / "indexes").glob("*/dense.json"))


def test_the_library_step_refuses_settings_its_evidence_mode_never_uses():
    """`booklens.steps.verify_claims` checks what the CLI checks, before any LM or index."""
    from booklens.steps import verify_claims

    with pytest.raises(BooklensError, match="^k is how many passages bm25/dense/hybrid retrieve; evidence none"):
        verify_claims(claims=["x"], book_text=None, mode="none", k=7)
    with pytest.raises(BooklensError, match="^budget_tokens bounds the evidence of the book and given modes"):
        verify_claims(claims=["x"], book_text="A book.", mode="bm25", budget_tokens=100)
    # 'given' quotes are placed in the book's passages only when there is a book: without one, a
    # passage size was taken and did nothing
    with pytest.raises(BooklensError, match="^passage_tokens sizes the passages cut from the book; evidence given "
                                            "without the book cuts none"):
        verify_claims(claims=["x"], given=[["q"]], book_text=None, mode="given", passage_tokens=100)


def test_book_mode_with_a_budget_below_the_passage_size_gets_part_of_a_passage():
    text = story()
    index = BookIndex.build(text, passage_tokens=256)
    checker = build_checker(evidence_mode="book", budget_tokens=100)
    claims = ["Jonah hid a letter from Maren."]
    result, lm = run_with(lambda call: verdict(), lambda: checker(claims=claims, index=index))
    (ev,) = result.claims[0].evidence
    assert 0 < count_tokens(ev.text) <= 100 and text[ev.start:ev.end] == ev.text
    assert ev.text in lm.backend.calls[0].messages[-1]["content"]


def test_bm25_evidence_from_a_book_of_one_passage():
    """rank-bm25 scores every term of a one-passage book below 0; the passage is still the evidence."""
    text = ("Maren kept the lighthouse on Carrick Point for twenty years. One winter night the lamp went dark, "
            "because her brother Jonah had given away the fuel. Jonah hid the letter in the cellar.")
    index = BookIndex.build(text)
    assert len(index.passages) == 1
    checker = build_checker(evidence_mode="bm25", k=5)
    claims = ["Jonah hid a letter in the cellar.", "Maren kept the lighthouse for twenty years."]
    result, lm = run_with(lambda call: verdict(), lambda: checker(claims=claims, index=index))
    for v in result.claims:
        assert [(e.passage, e.text, e.source) for e in v.evidence] == [(0, text, "bm25")]
    assert all("[1] Maren kept the lighthouse" in call.messages[-1]["content"] for call in lm.backend.calls)


def test_every_evidence_source_a_record_can_name_is_a_mode_that_gives_evidence():
    from typing import get_args

    import booklens.retrieval as retrieval
    from booklens.vocabulary import EvidenceSource

    assert set(get_args(EvidenceSource)) == {"given", *retrieval.BOOK_MODES}
    assert set(retrieval.EVIDENCE_MODES) - set(get_args(EvidenceSource)) == {"none"}


def test_none_mode_asks_without_evidence():
    checker = build_checker(evidence_mode="none")
    result, lm = run_with(lambda call: {"label": "can't verify", "reason": "No idea."},
                          lambda: checker(claims=["Anna sails home."]))
    call = lm.backend.calls[0]
    assert "evidence" not in call.inputs and call.inputs["claim"] == "Anna sails home."
    assert result.claims[0].label == "can't verify" and result.claims[0].evidence == []


def test_given_mode_needs_evidence():
    with pytest.raises(BooklensError, match="given"):
        build_checker(evidence_mode="given").verify_claims(["x"])


def test_given_evidence_is_cut_to_the_budget():
    checker = build_checker(evidence_mode="given", budget_tokens=100)
    long_quote = "The sea was grey and the wind was cold. " * 60
    result, lm = run_with(lambda call: verdict(), lambda: checker(claims=["x"], given_evidence=[[long_quote, "more"]]))
    from booklens.text import count_tokens

    ev = result.claims[0].evidence
    assert len(ev) == 1 and count_tokens(ev[0].text) <= 100


def test_given_evidence_cut_to_the_budget_ends_on_a_whole_word():
    """A cut at a token boundary can fall inside a word ('unsett|led'): the judge would read a
    fragment. The quote shown ends at its last whole word, within the budget."""
    from booklens.text import count_tokens

    quote = ("Wickham's expostulations about Hertfordshire drew commendations from Lydia, and the perpetual "
             "commendations of Miss Bingley unsettled Elizabeth entirely. ") * 6
    split = 0
    for budget in range(64, 160):
        (shown,) = build_checker(evidence_mode="given", budget_tokens=budget)._given([quote], None)
        assert quote.startswith(shown.text) and count_tokens(shown.text) <= budget
        split += shown.text[-1].isalnum() and quote[len(shown.text)].isalnum()
    assert split == 0


def test_evidence_budget_leaves_room_for_the_prompt():
    assert evidence_budget(8192) < 8192 - 400 - 1000
    assert evidence_budget(128000) > 90000


# ---------------------------------------------------------------------------
# Decomposition and the whole chain


def test_decomposer_cleans_the_claims():
    claims = ["- Anna sails home.", "2. Ben stays behind.", "", "anna  sails home.", "* Carl waves."]
    pred, lm = run_with(lambda call: {"claims": claims}, lambda: build_decomposer()(summary="Anna sails home."))
    assert pred.claims == ["Anna sails home.", "Ben stays behind.", "Carl waves."] and pred.error is None
    assert lm.backend.calls[0].inputs["summary"] == "Anna sails home."


def test_a_finished_answer_cut_inside_a_string_is_asked_again():
    """A list of claims that stops mid-claim although the model said it had finished: its last claim
    is a fragment ("Ben st"), not a claim to verify. So is a verdict whose reason stops mid-word."""
    answers = iter(['{"claims": ["Anna sails home.", "Ben st', {"claims": ["Anna sails home.", "Ben stays behind."]}])
    pred, lm = run_with(lambda call: next(answers), lambda: build_decomposer()(summary="Anna sails; Ben stays."))
    assert pred.claims == ["Anna sails home.", "Ben stays behind."] and pred.attempts == 2 and pred.error is None
    verdicts = iter(['{"label": "faithful", "supporting_passages": [1], "refuting_passages": [], "reason": "Passage 1 sa',
                     verdict("unfaithful", reason="Passage 1 says she stays.")])
    pred, lm = run_with(lambda call: next(verdicts), lambda: build_verifier()(claim="Anna sails.", passages=["Anna stays."]))
    assert (pred.label, pred.reason, pred.attempts) == ("unfaithful", "Passage 1 says she stays.", 2)
    # what is not cut off: a closed object (an odd stray quote in a value too) or an escaped quote
    from booklens.lm.adapter import ends_inside_string

    assert not any(map(ends_inside_string, ['{"claims": ["A", "B"]}', '{"reason": "He is "the keeper."}\n```',
                                            '{"reason": "a \\" b"} and "more', 'no JSON "at all']))
    assert ends_inside_string('{"reason": "a \\" b')


def test_decomposer_answer_budget_follows_the_summary_length():
    short = "Anna sails home."
    _, lm = run_with(lambda call: {"claims": [short]}, lambda: build_decomposer(max_tokens=1024)(summary=short))
    assert lm.backend.calls[0].request["max_tokens"] == 2 * count_tokens(short) + 256
    long = "Anna sails home across the bay while Ben stays behind. " * 80
    _, lm = run_with(lambda call: {"claims": ["Anna sails home."]},
                     lambda: build_decomposer(max_tokens=1024)(summary=long))
    assert lm.backend.calls[0].request["max_tokens"] == 1024  # never above the configured limit


def test_decomposer_rejects_an_empty_summary_and_records_failures():
    with pytest.raises(BooklensError, match="empty"):
        run_with(lambda call: {"claims": ["x"]}, lambda: build_decomposer()(summary="  \n "))
    pred, lm = run_with(lambda call: {"claims": []}, lambda: build_decomposer(tries=2)(summary="Something."))
    assert pred.claims == [] and pred.error and pred.attempts == 2 and len(lm.backend.calls) == 2


def test_check_decomposes_then_verifies_concurrently():
    text = story()
    index = BookIndex.build(text, passage_tokens=128)
    claims = [f"Claim number {i} about the lamp." for i in range(8)]
    # Each verification waits until all eight are in flight at once, which only concurrent
    # verification reaches; the wait's timeout only ends the test if it never happens.
    lock = threading.Lock()
    all_in_flight = threading.Event()
    state = {"now": 0, "max": 0}

    def responder(call):
        if call.wants("claims"):
            return {"claims": claims}
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            if state["now"] == len(claims):
                all_in_flight.set()
        all_in_flight.wait(timeout=60)
        with lock:
            state["now"] -= 1
        return verdict("unfaithful" if "3" in call.inputs["claim"] else "faithful")

    checker = build_checker(evidence_mode="bm25", concurrency=8)
    result, lm = run_with(responder, lambda: checker(summary="A summary.", index=index))
    assert [v.claim for v in result.claims] == claims  # order kept
    assert result.label_counts["unfaithful"] == 1 and result.label_percentages["faithful"] == 87.5
    assert state["max"] == 8  # all eight verifications overlapped
    assert len(lm.backend.calls) == 1 + 8  # one decomposition, one verification per claim


def test_programs_expose_predictors_for_compiled_artifacts():
    names = {name for name, _ in build_checker().named_predictors()}
    assert names == {"decomposer.decompose", "verifier.verify", "verifier.verify_without_evidence"}
    assert isinstance(build_checker().decomposer, ClaimDecomposer)
    assert isinstance(build_checker().verifier, ClaimVerifier)


def test_clean_helpers():
    assert clean_evidence(["", "N/A", "None.", "-", " a quote ", "n/a"]) == ["a quote"]
    assert clean_claims(['"Quoted claim."', "(3) Anna sails home."]) == ["Quoted claim.", "Anna sails home."]


def test_an_annotator_note_that_there_is_no_evidence_is_no_quote():
    """FABLES annotators who found no quote wrote so in the evidence field, in words as well as as
    'N/A' (these are the release's own): shown to the judge as passage [1], the note would read as the
    book. A quote from a book that starts the same way is kept."""
    notes = ["no evidence of this", "no evidence of this in the book", "no evidence to verify this",
             "no evidence to verify or refute", "no evidence to support or refute", "no evidence to support",
             "cant verify or refute", "Cannot verify", "No quotation."]
    assert clean_evidence(notes + ["Maren trimmed the lamp."]) == ["Maren trimmed the lamp."]
    quotes = ["No evidence of this was found in the cellar, the inspector said.", "Cannot verify it? Then ask her."]
    assert clean_evidence(quotes) == quotes


def test_a_bare_name_or_title_is_not_a_claim():
    # "Daniel Pike" is a claim the embedded model wrote for the sample story; the rest are made up
    raw = ["Maren Holt keeps the light at Saltmarsh Point.", "Daniel Pike", "2. Chapter One", "Anna sails.",
           "The Keeper's Ledger", "Elizabeth Bennet Marries Fitzwilliam Darcy At Longbourn"]
    assert clean_claims(raw) == ["Maren Holt keeps the light at Saltmarsh Point.", "Anna sails.",
                                 "Elizabeth Bennet Marries Fitzwilliam Darcy At Longbourn"]
    # a list of nothing but fragments is kept: the run still has something to verify
    assert clean_claims(["Daniel Pike", "2. Chapter One"]) == ["Daniel Pike", "Chapter One"]


@pytest.mark.parametrize("raw, cleaned", [
    # a claim that starts or ends with a quotation from the book keeps its quotation marks
    ('"Nevermore," the raven answers every question the narrator asks.',
     '"Nevermore," the raven answers every question the narrator asks.'),
    ('Fortunato cries out "For the love of God, Montresor!"', 'Fortunato cries out "For the love of God, Montresor!"'),
    ('"Anna," Ben says, "the lamp is out."', '"Anna," Ben says, "the lamp is out."'),
    # a claim written inside quotes, straight or curly, loses the pair around it
    ('"Anna sails home."', "Anna sails home."),
    ("\u201cAnna sails home.\u201d", "Anna sails home."),
    # with quotes inside too, which pair is which cannot be told: the claim stays as it was written
    ('"Ben says "hello" to Anna."', '"Ben says "hello" to Anna."'),
], ids=["opens-with-quote", "ends-with-quote", "quotes-at-both-ends", "wrapped", "wrapped-curly", "wrapped-nested"])
def test_quotation_marks_that_belong_to_the_claim_are_kept(raw, cleaned):
    assert clean_claims([raw]) == [cleaned]


def test_index_time_of_a_check_leaves_out_the_decomposition(monkeypatch, tmp_path):
    """`check` decomposes, then builds the index, then verifies: the record's index_seconds is the
    index alone (it used to run from the start, so it counted every decomposition call too). A
    clock that moves only when the LM answers makes the figures exact."""
    import types

    import booklens.steps as steps_module
    from booklens.steps import verify_claims

    clock = {"now": 0.0}
    monkeypatch.setattr(steps_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))

    def responder(call):
        clock["now"] += 10.0
        if call.wants("claims"):
            return {"claims": ["Maren kept the lighthouse.", "Jonah hid a letter."]}
        return verdict()

    report, lm = run_with(responder, lambda: verify_claims(
        claims=[], book_text=story(), summary="Maren kept the lighthouse. Jonah hid a letter.", decompose=True,
        cache_dir=tmp_path))
    assert len(lm.backend.calls) == 3
    assert report.timings == {"index_seconds": 0.0, "verify_seconds": 20.0, "total_seconds": 30.0}


def test_numbered_claims_lose_their_numbers():
    """Models number their claims in more ways than "1." and "(1)": "[1]" (as the passages are shown to
    the verifier), "1:", "Claim 2:". The number stayed in the claim, and a repeat numbered
    differently was verified twice."""
    raw = ["[1] Anna sails home.", "Claim 2: Ben waits at the dock.", "3: Maren keeps the light.",
           "Claim #4 - Jonah hides a letter.", "CLAIM 5. Anna sails home.", '"6. Ben waits at the dock."']
    assert clean_claims(raw) == ["Anna sails home.", "Ben waits at the dock.", "Maren keeps the light.",
                                 "Jonah hides a letter."]
    # a claim that starts with a number of its own keeps it
    assert clean_claims(["1984 is the year Winston starts his diary.", "3 ships sink in the storm."]) == [
        "1984 is the year Winston starts his diary.", "3 ships sink in the storm."]


def test_numbers_without_a_space_or_in_bold_are_markers_too():
    """"1.Anna sails" and "**1.** Anna sails" kept their numbers, and a repeat numbered so was verified
    twice. A number that is part of the claim ("1.5 million", "10:30 train") stays."""
    raw = ["1.Anna sails home.", "**2.** Ben waits at the dock.", "__3)__ Maren keeps the light.",
           "4)Jonah hides a letter.", "Anna sails home."]
    assert clean_claims(raw) == ["Anna sails home.", "Ben waits at the dock.", "Maren keeps the light.",
                                 "Jonah hides a letter."]
    kept = ["1.5 million people read the letter.", "10:30 trains leave the harbour daily.", "*Anna* sails home."]
    assert clean_claims(kept) == kept


@pytest.mark.parametrize("given", [[["Anna sailed."], []], [["Anna sailed."], ["N/A", " "]], [["Anna sailed."], None]],
                         ids=["empty-list", "placeholders", "none"])
def test_the_library_step_refuses_given_mode_with_a_claim_without_quotes(given):
    """`booklens verify` refuses it; `booklens.steps.verify_claims` judged such a claim on no evidence
    at all (and usually called it faithful). Now the same one-line error, before any LM call."""
    from booklens.steps import verify_claims

    def responder(call):
        raise AssertionError("the LM was asked")

    with pytest.raises(BooklensError,
                       match=r"^evidence mode 'given' needs quotes with every claim \(claim 2 has none\)"):
        run_with(responder, lambda: verify_claims(claims=["Anna sails.", "Ben waits."], book_text=None, mode="given",
                                                  given=given))


def test_claims_in_a_script_without_capitals_are_claims():
    """A bare name is a few words that all start with a capital; Chinese or Japanese has no capitals,
    and a whole claim written without spaces was taken for such a name: beside one claim with a
    Latin word in it, every other claim of the list was dropped."""
    raw = ["安娜在五月乘船去了里斯本。", "本在码头等她。", "Anna kauft ein iPhone."]
    assert clean_claims(raw) == raw
    assert clean_claims(["Daniel Pike", "本在码头等她。"]) == ["本在码头等她。"]


def test_a_repeat_that_differs_only_in_its_final_stop_is_dropped():
    """The same claim written once with its period and once without was verified twice, and counted
    twice in the shares."""
    assert clean_claims(["Anna sails home.", "Anna sails home", "anna sails  home!", "Ben waits."]) == [
        "Anna sails home.", "Ben waits."]


def test_a_claim_without_a_word_is_no_claim():
    """"..." or a lone dash from the decomposer would be verified (and called faithful: nothing in it
    is false); the library's verify step now refuses such a claim, so the decomposer must not make one."""
    assert clean_claims(["Anna sails home.", "...", "\u2014", "- *"]) == ["Anna sails home."]
    assert clean_claims(["...", "\u2014"]) == []


# A book of about 6,000 tokens: longer than a 4K window, so its top passages can fill one.
LONG_BOOK = " ".join(f"On day {n} Maren climbed the tower and trimmed the lamp before the storm." for n in range(400))


def test_retrieved_evidence_that_cannot_fit_the_window_is_refused_before_any_call():
    """20 passages of 256 tokens are 5,120 tokens of evidence, more than a 4,096-token window holds:
    that failed at the first verification with the server's 'prompt does not fit', which names
    neither --k nor --passage-tokens. Now a one-line error up front, before the claims are split."""
    from booklens.steps import verify_claims

    def responder(call):
        raise AssertionError("the LM was asked")

    for decompose in (False, True):
        with pytest.raises(BooklensError, match=r"^k 20 passages of up to passage_tokens 256 tokens: 5120 tokens "
                                                r"of evidence per claim, more than the \d+ that fit beside the "
                                                r"judge's answer and prompt in its 4096-token context window; "
                                                r"lower k to \d+ or less or passage_tokens to \d+ or less$"):
            run_with(responder, lambda: verify_claims(
                claims=[] if decompose else ["Maren trimmed the lamp."], summary="Maren trimmed the lamp.",
                decompose=decompose, book_text=LONG_BOOK, mode="bm25", k=20), context_window=4096)


def test_a_book_budget_that_cannot_fit_the_window_is_refused_before_any_call():
    """--evidence book --budget-tokens 6000 on a 4,096-token window: every verification prompt held
    6,000 tokens of the book and failed with the server's 'prompt does not fit', naming no option.
    Now one line naming the budget, before the claims are split. A book shorter than the window is
    all the evidence any budget brings, and no window figure means no check, as for k."""
    from booklens.steps import verify_claims

    def responder(call):
        raise AssertionError("the LM was asked")

    for decompose in (False, True):
        with pytest.raises(BooklensError, match=r"^budget_tokens 6000: 6000 tokens of evidence per claim, more "
                                                r"than the \d+ that fit beside the judge's answer and prompt in its "
                                                r"4096-token context window; lower budget_tokens to \d+ or less, or leave it out "
                                                r"\(the default is what the window holds\)$"):
            run_with(responder, lambda: verify_claims(
                claims=[] if decompose else ["Maren trimmed the lamp."], summary="Maren trimmed the lamp.",
                decompose=decompose, book_text=LONG_BOOK, mode="book", budget_tokens=6000), context_window=4096)
    short = " ".join(LONG_BOOK.split()[:600])
    for book, window in ((short, 4096), (LONG_BOOK, None)):
        report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
            claims=["Maren trimmed the lamp."], book_text=book, mode="book", budget_tokens=6000),
            context_window=window)
        assert report.claims[0].label == "faithful" and len(lm.backend.calls) == 1


def test_retrieved_evidence_is_checked_only_where_the_window_is_known_and_the_book_is_long_enough():
    """No figure for the window (a remote model LiteLLM does not know): asked as before. A book
    shorter than the window is all the evidence any k can bring, so a large k is no error."""
    from booklens.steps import verify_claims

    report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren trimmed the lamp."], book_text=LONG_BOOK, mode="bm25", k=20), context_window=None)
    assert report.claims[0].label == "faithful" and len(lm.backend.calls) == 1
    short = " ".join(LONG_BOOK.split()[:600])
    assert count_tokens(short) < 2000
    report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren trimmed the lamp."], book_text=short, mode="bm25", k=20), context_window=4096)
    assert report.claims[0].label == "faithful" and len(lm.backend.calls) == 1


# ---------------------------------------------------------------------------
# Demos that fit beside the evidence


def demos_sent(call) -> int:
    """The demos a verification prompt showed: one answer turn each."""
    return sum(m["role"] == "assistant" for m in call.messages)


def test_a_window_that_holds_fewer_demos_beside_the_passages_shows_the_first_that_fit():
    """Two passages of 256 tokens do not fit a 2048-token window beside the judge's six demos. That
    was a line advising --zero-shot; now the judge keeps its first four demos, which leave room,
    and the report records how many it showed and why."""
    from booklens.steps import verify_claims

    report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren trimmed the lamp."], book_text=LONG_BOOK, mode="bm25", k=2), context_window=2048)
    assert len(lm.backend.calls) == 1 and demos_sent(lm.backend.calls[0]) == 4
    assert report.claims[0].label == "faithful"
    assert (report.judge.demos, report.judge.demos_shown) == (6, 4)
    assert report.judge.demos_note == ("the judge is shown 4 of its 6 demos: its 2048-token context window holds "
                                       "no more beside 2 passages of up to 256 tokens")


def test_a_book_budget_that_fits_beside_fewer_demos_is_verified_with_them():
    from booklens.steps import verify_claims

    report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren trimmed the lamp."], book_text=LONG_BOOK, mode="book", budget_tokens=512), context_window=2048)
    assert len(lm.backend.calls) == 1 and demos_sent(lm.backend.calls[0]) == 4
    assert report.judge.demos_shown == 4 and report.budget_tokens == 512
    assert report.judge.demos_note == ("the judge is shown 4 of its 6 demos: its 2048-token context window holds "
                                       "no more beside up to 512 tokens of evidence per claim")


def test_where_all_the_demos_fit_the_prompt_is_the_one_sent_without_a_window_check():
    """A window that holds every demo beside the evidence changes nothing: the prompt sent (and so
    its cache key) is the one sent where no window figure is known, and no demo count is recorded."""
    from booklens.steps import verify_claims

    sent = {}
    for window in (8192, None):
        report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
            claims=["Maren trimmed the lamp."], book_text=LONG_BOOK, mode="bm25", k=2), context_window=window)
        sent[window] = lm.backend.calls[0].messages
        assert report.judge.demos_shown is None and report.judge.demos_note is None
    assert sent[8192] == sent[None] and sum(m["role"] == "assistant" for m in sent[8192]) == 6


def test_passages_that_fit_beside_no_demo_name_the_values_that_do_with_none():
    """Five passages of 256 tokens do not fit a 2048-token window even with no demo: the line names
    the k and passage size that fit beside none, and a rerun with them is verified (its demos cut
    to fit), so that one rerun is enough. It no longer advises --zero-shot."""
    from booklens.steps import verify_claims

    def responder(call):
        raise AssertionError("the LM was asked")

    with pytest.raises(BooklensError) as refused:
        run_with(responder, lambda: verify_claims(claims=["Maren trimmed the lamp."], book_text=LONG_BOOK,
                                                  mode="bm25", k=5, as_keys=False), context_window=2048)
    assert str(refused.value) == ("--k 5 passages of up to --passage-tokens 256 tokens: 1280 tokens of evidence per "
                                  "claim, more than the 733 that fit beside the judge's answer and prompt in its "
                                  "2048-token context window; lower --k to 2 or less or --passage-tokens to 146 or "
                                  "less")
    report, lm = run_with(lambda call: verdict(), lambda: verify_claims(
        claims=["Maren trimmed the lamp."], book_text=LONG_BOOK, mode="bm25", k=2, as_keys=False),
        context_window=2048)
    assert len(lm.backend.calls) == 1 and report.judge.demos_shown == 4


def test_a_window_that_holds_no_evidence_beside_no_demo_advises_a_larger_one_only():
    from booklens.steps import verify_claims

    def responder(call):
        raise AssertionError("the LM was asked")

    # the window named holds the evidence the settings bring (one passage of 256 tokens, a 512-token budget)
    for mode, options, needed in (("bm25", {"k": 1}, "1,431"), ("book", {"budget_tokens": 512}, "1,751")):
        with pytest.raises(BooklensError) as refused:
            run_with(responder, lambda: verify_claims(claims=["Maren trimmed the lamp."], book_text=LONG_BOOK,
                                                      mode=mode, as_keys=False, **options), context_window=1024)
        assert str(refused.value) == ("the judge's 1024-token context window holds no evidence beside its answer and "
                                      "its prompt's instructions; use a model or server with a context window of "
                                      f"{needed} tokens or more")


@pytest.mark.parametrize("mode", ["book", "given"])
def test_the_evidence_as_the_verifier_reads_it_fits_the_budget(monkeypatch, mode):
    """The budget was spent on the passages' or quotes' own tokens, and the '[n] ' labels and blank
    lines between them came on top: here the verifier read 1,058 tokens for a budget of 1,000 (85 more
    than the budget on Pride and Prejudice at 8K). Now the evidence it reads is within it."""
    text = story()
    index = BookIndex.build(text, passage_tokens=64)
    monkeypatch.setattr(index, "ensure_dense", lambda: None)
    monkeypatch.setattr(index, "rank", lambda q, mode, depth: [(5, 1.0)])
    quotes = [p.text for p in index.passages[:40]]
    read = []

    def answer(call):
        read.append(call.inputs["evidence"])
        return verdict()

    budget = 1000
    checker = build_checker(evidence_mode=mode, budget_tokens=budget)
    run_with(answer, lambda: checker(claims=["x"], index=index, given_evidence=[quotes] if mode == "given" else None))
    (evidence,) = read
    assert evidence.startswith("[1] ") and evidence.count("\n\n[") >= 10
    assert count_tokens(evidence) <= budget
