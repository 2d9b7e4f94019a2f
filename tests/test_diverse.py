"""DiverseSumm: loader, summarizer routing, reference building, the judges' rating checks,
pairwise aggregation and the bias analyses. Scripted LM only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from booklens.data.diversesumm import load_events, parse_events, parse_summaries
from booklens.errors import BooklensError
from booklens.lm import configure
from booklens.metrics.bias import (
    aggregate_both_orders,
    format_position,
    position_bias,
    repeat_summary,
    verbosity_pairwise,
    verbosity_single,
)
from booklens.programs.diverse import (
    CoverageJudge,
    DiverseSummarizer,
    FaithfulnessJudge,
    PairwiseJudge,
    RatingJudge,
    ReferenceBuilder,
    article_texts,
    exact_groups,
    judge_pairs,
    pairwise_cases,
    rate_event,
    summarize_events,
)
from booklens.signatures import diverse as signatures
from booklens.signatures.diverse import JudgeCoverageOfAllQAs
from booklens.testing import ScriptedLM
from booklens.text import split_sentences
from booklens.vocabulary import CRITERIA

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def event():
    return load_events(FIXTURE)[0]


def scripted(responder, window=8192):
    lm = ScriptedLM(responder, context_window=window)
    configure(lm)
    return lm


def small_event(n_articles=2):
    return {"eid": "e1", "articles": [{"aid": f"a{i}", "title": f"T{i}", "url": "", "domain": "x.org",
                                       "content": f"Article {i} says the toll is {i} dollars."}
                                      for i in range(n_articles)],
            "question_answers": [{"question": "What is the toll?",
                                  "answer_groups": [[{"aid": "a0", "answer": "0 dollars"}],
                                                    [{"aid": "a1", "answer": "1 dollar"}]]}]}


# ---------------------------------------------------------------------------
# loader


def test_fixture_event_loads(event):
    assert event.eid and len(event.articles) == 10 and len(event.question_answers) == 6
    text = event.question_answers[0].as_text()
    assert text.startswith("Question: ") and "Answer 1 (" in text


@pytest.mark.parametrize("payload, needle", [
    ([small_event(1)], "needs at least 2"),
    ([{**small_event(), "articles": []}], "needs at least 2"),
    ({"events": []}, "expected a JSON list"),
    ([], "empty"),
    ([{"eid": "x"}], "missing field 'articles'"),
    ([{**small_event(), "question_answers": [{"question": "q", "answer_groups": [[{"aid": "zz", "answer": "a"}]]}]}],
     "unknown article"),
    ([{**small_event(), "question_answers": [{"question": "  ", "answer_groups": [[{"aid": "a0", "answer": "a"}]]}]}],
     "a question is blank"),
    ([{**small_event(), "question_answers": [{"question": "q", "answer_groups": [[{"aid": "a0", "answer": " "}]]}]}],
     "an answer is empty"),
    ([{**small_event(), "question_answers": [{"question": "q", "answer_groups": []}]}], "needs answer groups"),
    ([{**small_event(), "question_answers": [{"question": "q", "answer_groups": [[]]}]}], "needs answer groups"),
    # no answer_groups at all is no answers either: a judge would rate coverage of a bare question
    ([{**small_event(), "question_answers": [{"question": "q"}]}], "needs answer groups"),
    # a blank id names nothing: the output heads the event '==  (direct) ==', and a summaries file
    # or a faithfulness judgment is matched to it by that blank
    ([{**small_event(), "eid": "  "}], "eid: must not be blank"),
    ([{**small_event(), "eid": ""}], "eid: must not be blank"),
    ([{**small_event(), "articles": [{**a, "aid": " " * i} for i, a in enumerate(small_event()["articles"], 1)],
       "question_answers": []}], "articles.0.aid: must not be blank"),
    # a reference question given twice is rated twice: binary coverage weighs it double
    ([{**small_event(), "question_answers": small_event()["question_answers"] * 2}],
     "question_answers: the question 'What is the toll?' is given twice"),
    ([{**small_event(), "question_answers": [*small_event()["question_answers"],
                                             {**small_event()["question_answers"][0], "question": "what is the TOLL"}]}],
     "question_answers: the question 'what is the TOLL' is given twice"),
    # which id is given twice, among ten articles
    ([{**small_event(3), "articles": [{**a, "aid": "a1" if i else a["aid"]} for i, a in enumerate(
        small_event(3)["articles"])]}], "article id 'a1' is given twice"),
    # an article or an answer of punctuation alone says nothing to summarize or to cover
    ([{**small_event(), "articles": [small_event()["articles"][0],
                                     {**small_event()["articles"][1], "content": "* * *"}]}],
     "articles.1.content: article content has no words (only punctuation, symbols or invisible characters)"),
    ([{**small_event(), "question_answers": [{"question": "q", "answer_groups": [[{"aid": "a0", "answer": "..."}]]}]}],
     "an answer has no words"),
])
def test_bad_events(payload, needle):
    with pytest.raises(BooklensError) as err:
        parse_events(payload, source="ev.json")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_diverse_result_with_a_failed_summary_says_which_event_failed():
    with pytest.raises(BooklensError, match="event 'e1' has no summary \\(it failed: the judge timed out\\)"):
        parse_summaries({"kind": "booklens.diverse", "events": [{"eid": "e1", "summary": None,
                                                                 "error": "the judge timed out"}]})


def test_summaries_formats():
    assert parse_summaries({"e1": "s"}) == {"e1": "s"}
    assert parse_summaries([{"eid": "e1", "summary": "s"}]) == {"e1": "s"}
    assert parse_summaries({"kind": "booklens.diverse", "events": [{"eid": "e1", "summary": "s"}]}) == {"e1": "s"}
    with pytest.raises(BooklensError):
        parse_summaries({"e1": ""})
    with pytest.raises(BooklensError):
        parse_summaries([{"summary": "no eid"}])
    with pytest.raises(BooklensError, match="item 2: duplicate eid 'e1'"):  # one of the two would be judged, unseen
        parse_summaries([{"eid": "e1", "summary": "first"}, {"eid": "e1", "summary": "second"}])


@pytest.mark.parametrize("record", [
    {"kind": "booklens.qa", "book": "b.txt", "book_tokens": 4990, "predictions": []},
    {"kind": "booklens.judge", "protocol": "likert", "events": [{"eid": "e1", "score": 7}]},
], ids=["qa", "judge"])
def test_another_commands_record_given_as_summaries_is_named_as_such(record):
    """A `qa` record was read as {eid: summary}, its fields as events, and refused for 'the summary
    of event 'book_tokens' is not text', as if the file were summaries with one wrong value."""
    with pytest.raises(BooklensError) as err:
        parse_summaries(record, source="r.json")
    assert str(err.value) == (f"r.json is a {record['kind']} record, not summaries: give {{eid: summary}}, "
                              "[{eid, summary}, ...] or a `booklens diverse` result")


# ---------------------------------------------------------------------------
# summarizer


def test_direct_when_the_articles_fit_extract_otherwise(event):
    def responder(call):
        if call.wants("picks"):
            return {"picks": [3, 1, 3, 2]}  # a repeat, and more numbers than asked for
        return {"summary": "Sources disagree on the cause."}

    lm = scripted(responder, window=16384)
    pred = DiverseSummarizer("auto")(articles=article_texts(event))
    assert pred.method == "direct" and pred.summary == "Sources disagree on the cause."
    assert len(lm.backend.calls) == 1
    assert "[a01]" in lm.backend.calls[0].inputs["articles"]

    lm = scripted(responder, window=4096)
    pred = DiverseSummarizer("auto", num_sentences=2)(articles=article_texts(event))
    assert pred.method == "extract" and len(pred.extracts) == 10
    assert len(lm.backend.calls) == 11  # one extraction per article, then the summary
    for article, extract in zip(article_texts(event), pred.extracts):
        # sentences 3 and 1, verbatim and in the article's order, under the article's title line
        title, body = article.split("\n", 1)
        sentences = split_sentences(body)
        assert extract == f"{title}\n- {sentences[0].strip()}\n- {sentences[2].strip()}"
    assert json.loads(lm.backend.calls[-1].inputs["extracts"]) == pred.extracts  # what the summary step reads

    with pytest.raises(BooklensError, match="use method='extract'$"):  # the library's keyword
        DiverseSummarizer("direct")(articles=article_texts(event))


CAUSES = {"a01": "Corrosion.", "a02": "fatigue", "a03": "rust", "a04": "metal fatigue", "a05": "a barge strike",
          "a06": "The article does not say.", "a07": "corrosion of the plate", "a08": "fatigue cracking",
          "a09": "barge impact", "a10": "no answer given"}


def reference_responder(groups=None, seen=None):
    """Questions, per-article answers, answer clusters and the filter's verdicts for the fixture event.

    'Why did it close?': three causes (corrosion, fatigue, a barge) plus two non-answers;
    'Who is to blame?': answered by one article only; 'When did it close?': every article agrees."""
    def numbers(call, *texts):
        lines = json.loads(call.inputs["answers"])
        return [n for n, line in enumerate(lines, 1) if any(t in line for t in texts)]

    def responder(call):
        if seen is not None:
            seen.append(call)
        if call.wants("questions"):
            return {"questions": ["Why did it close?", "Who is to blame?", "When did it close?", "Why did it close?"]}
        if call.wants("answers"):
            aid = call.inputs["article"].split("]")[0][1:]
            question = call.inputs["question"]
            if question == "Who is to blame?":
                return {"answers": ["the city"] if aid == "a01" else []}
            if question == "When did it close?":
                return {"answers": ["on Monday"]}
            return {"answers": [CAUSES[aid]]}
        if call.wants("groups"):
            if groups is not None:
                return groups(call)
            if call.inputs["question"] == "Why did it close?":
                return {"groups": [numbers(call, "orrosion", "rust"), numbers(call, "atigue"),
                                   numbers(call, "barge")]}  # the two non-answers left out
            return {"groups": [list(range(1, len(json.loads(call.inputs["answers"])) + 1))]}
        if call.wants("invalid", "diverse"):
            if call.inputs["question"] == "Why did it close?":
                return {"invalid": numbers(call, "does not say", "no answer"),
                        "diverse": numbers(call, "Corrosion.", "fatigue", "barge")}
            return {"invalid": [], "diverse": []}
        raise AssertionError(f"unexpected call {call.output_fields}")

    return responder


def test_reference_builder_clusters_answers_and_keeps_diverse_questions(event):
    seen = []
    scripted(reference_responder(seen=seen))
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles]
    ref = ReferenceBuilder(num_questions=3)(articles=articles)
    assert ref.questions == ["Why did it close?", "Who is to blame?", "When did it close?"]
    assert [q["question"] for q in ref.question_answers] == ["Why did it close?"]
    groups = [sorted(a["aid"] for a in g) for g in ref.question_answers[0]["answer_groups"]]
    # corrosion and rust together, fatigue together, the barge together; the non-answers removed
    assert sorted(groups) == [["a01", "a03", "a07"], ["a02", "a04", "a08"], ["a05", "a09"]]
    kept, blame, when = ref.screening
    assert kept["kept"] and kept["invalid_answers"] == 2 and kept["diverse_clusters"] == 3
    assert kept["articles_answering"] == 8 and kept["clusters"] == 3
    assert not blame["kept"] and "answered by 1 of 10 articles" in blame["reason"]
    assert not when["kept"] and "not diverse" in when["reason"] and when["articles_answering"] == 10

    # 30 extractions (3 questions x 10 articles), 2 clusterings (one answer needs none), 3 filter calls
    kinds = [("extract" if c.wants("answers") else "cluster" if c.wants("groups") else
              "filter" if c.wants("diverse") else "questions") for c in seen]
    assert kinds.count("extract") == 30 and kinds.count("cluster") == 2 and kinds.count("filter") == 3
    # calls about one article follow each other (its text is the shared prompt prefix)
    extract_articles = [c.inputs["article"] for c in seen if c.wants("answers")]
    assert all(extract_articles[i] == extract_articles[i - i % 3] for i in range(30))
    # every filter call reads the same articles, before the question and the answers
    filters = [c for c in seen if c.wants("diverse")]
    assert len({c.inputs["articles"] for c in filters}) == 1
    content = filters[0].messages[-1]["content"]
    assert content.index("[[ ## articles ## ]]") < content.index("[[ ## question ## ]]") < content.index(
        "[[ ## answers ## ]]")


def test_questions_and_answers_in_any_script_are_told_apart():
    """Generated questions are deduplicated, and exact clustering groups answers, by their wording up
    to case and punctuation: wording in another script (or with accents) is wording too, not nothing."""
    answers = [("a1", "Три человека."), ("a2", "три человека"), ("a3", "Пять человек"), ("a4", "Café"),
               ("a5", "cafe"), ("a6", "五人"), ("a7", "三人")]
    assert exact_groups(answers) == [[0, 1], [2], [3], [4], [5], [6]]

    def responder(call):
        if call.wants("questions"):
            return {"questions": ["Почему закрыли мост?", "Кто виноват?", "почему закрыли мост"]}
        if call.wants("answers"):
            return {"answers": []}
        raise AssertionError(call.output_fields)

    scripted(responder)
    articles = [(f"a{i}", f"[a{i}] Статья {i}.\nМост закрыт.") for i in range(3)]
    ref = ReferenceBuilder(num_questions=3, clustering="exact", diversity_filter=False)(articles=articles)
    assert ref.questions == ["Почему закрыли мост?", "Кто виноват?"]


def test_generated_questions_without_a_letter_are_dropped_and_a_list_of_none_is_asked_again():
    """SmolLM2 wrote a list whose items were "2", "]\\n[\\n  {" and " ," (JSON it broke into pieces); the
    first two were taken for questions, each answered by every article in one call, and screened. An
    item with no letter is no question: dropped, and a list with no question is asked again."""
    lists = [["2", " ,", "--"], ["Why did it close?", "3.", "Who pays?"]]
    asked = []

    def responder(call):
        if call.wants("questions"):
            asked.append("questions")
            return {"questions": lists[len(asked) - 1]}
        return {"answers": []}

    scripted(responder)
    articles = [(f"a{i}", f"[a{i}] Article {i}.\nThe bridge closed.") for i in range(3)]
    ref = ReferenceBuilder(num_questions=3, clustering="exact", diversity_filter=False)(articles=articles)
    assert asked.count("questions") == 2 and ref.questions == ["Why did it close?", "Who pays?"]


def test_reference_clustering_failures_fall_back_to_identical_wording(event):
    # numbers outside the answer list: re-asked, then identical answers grouped and the failure recorded
    scripted(reference_responder(groups=lambda call: {"groups": [[0, 99]]}))
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles]
    ref = ReferenceBuilder(num_questions=3)(articles=articles)
    why = ref.screening[0]
    assert why["clustering_error"].startswith("clustering failed") and why["clusters"] == 8
    assert why["kept"]  # still diverse: the filter's conflicting answers sit in different clusters


def test_reference_builder_without_the_filter_keeps_every_question_answered_enough(event):
    seen = []
    scripted(reference_responder(seen=seen))
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles]
    ref = ReferenceBuilder(num_questions=3, clustering="exact", diversity_filter=False)(articles=articles)
    assert [q["question"] for q in ref.question_answers] == ["Why did it close?", "When did it close?"]
    assert len(ref.question_answers[0]["answer_groups"]) == 10  # every wording is its own cluster
    assert len(ref.question_answers[1]["answer_groups"]) == 1  # "on Monday" ten times
    assert not any(c.wants("groups") or c.wants("diverse") for c in seen)


@pytest.mark.parametrize("name, shared, differs", [
    ("ExtractAnswers", ["article"], ["question"]),  # one article, many questions
    ("FilterAnswers", ["articles"], ["question", "answers"]),  # the event's articles, many questions
    ("ExtractImportantSentences", ["num_sentences"], ["title", "sentences"]),
    ("JudgeCoverageOfQA", ["summary"], ["question_and_answers"]),  # one summary, many QA pairs
    ("JudgeFaithfulnessBinary", ["summary"], ["article"]),  # one summary, many articles
    ("JudgeFaithfulnessLikert", ["summary"], ["article"]),
    ("CompareSummaries", ["criterion", "reference"], ["summary_a", "summary_b"]),  # both orders of one case
])
def test_prompts_put_what_calls_share_before_what_differs(name, shared, differs):
    fields = list(getattr(signatures, name).input_fields)
    assert max(fields.index(f) for f in shared) < min(fields.index(f) for f in differs)


# ---------------------------------------------------------------------------
# judges: ratings outside the scale are re-asked, then recorded as failures


def test_likert_rating_outside_the_scale_is_reasked():
    lm = scripted(lambda call: {"explanation": "e", "rating": 11 if call.attempt == 0 else 7})
    r = RatingJudge(JudgeCoverageOfAllQAs, "likert")(summary="s", questions_and_answers="q")
    assert r.rating == 7 and r.attempts == 2 and r.error is None
    assert [c.attempt for c in lm.backend.calls] == [0, 1]


@pytest.mark.parametrize("written", ["7/10", "7 / 10", "7 out of 10", "Rating: 7", "**7**", "7.", "[[7]]",
                                     "Rating: [[7]]", "7 (mostly covered)", "7/10 - most answers are there"])
def test_a_rating_written_with_its_scale_or_a_label_is_read_as_that_rating(written):
    """Without the answer schema enforced, judges write a rating as '7/10' or 'Rating: 7': read as 7,
    not re-asked until the judgment is recorded as failed."""
    lm = scripted(lambda call: {"explanation": "e", "rating": written})
    r = RatingJudge(JudgeCoverageOfAllQAs, "likert")(summary="s", questions_and_answers="q")
    assert (r.rating, r.attempts, r.error) == (7, 1, None)
    assert len(lm.backend.calls) == 1


@pytest.mark.parametrize("written", ["7.5", "7-8", "7 or 8", "between 6 and 8", "seven", "7/8", "7 out of 100", "70%"])
def test_a_rating_naming_no_single_whole_number_on_the_scale_is_refused(written):
    lm = scripted(lambda call: {"explanation": "e", "rating": written})
    r = RatingJudge(JudgeCoverageOfAllQAs, "likert")(summary="s", questions_and_answers="q")
    assert r.rating is None and r.error and len(lm.backend.calls) == 3


@pytest.mark.parametrize("answer", [{"explanation": "e", "rating": 0}, {"explanation": "e", "rating": 12},
                                    "Rating: [[7]]", {"explanation": "e"}])
def test_likert_failures_are_recorded_not_guessed(answer):
    lm = scripted(lambda call: answer)
    r = RatingJudge(JudgeCoverageOfAllQAs, "likert", tries=3)(summary="s", questions_and_answers="q")
    assert r.rating is None and r.error
    assert len(lm.backend.calls) == 3


def test_binary_coverage_per_qa_pair_and_likert_over_all(event):
    summary = "The sources disagree about the cause: corrosion, fatigue or a barge strike."

    def responder(call):
        if call.wants("rating") and "question_and_answers" in call.inputs:
            covered = "caused the crack" in call.inputs["question_and_answers"]
            return {"explanation": "e", "rating": 1 if covered else 0}
        return {"explanation": "e", "rating": 4}

    lm = scripted(responder)
    binary = CoverageJudge("binary")(summary=summary, qa_pairs=event.question_answers)
    assert len(binary.details) == 6 and binary.failed == 0
    assert binary.score == pytest.approx(1 / 6, abs=1e-3)
    assert all(c.inputs["summary"] == summary for c in lm.backend.calls)
    likert = CoverageJudge("likert")(summary=summary, qa_pairs=event.question_answers)
    assert likert.score == 4 and len(lm.backend.calls) == 7


def test_an_article_too_long_for_the_judge_is_a_failed_judgment_not_the_end_of_the_run(event):
    """A server refusing one article's prompt as too long for its window ended the whole run (the
    summaries and every other judgment unwritten): that judgment fails, with the server's reason."""
    from booklens.lm import ContextWindowExceeded

    def responder(call):
        text = call.inputs.get("article") or call.inputs.get("reference") or ""
        if event.articles[3].content.strip()[:60] in text:
            raise ContextWindowExceeded("the prompt (9100 tokens) does not fit the 8192-token context window")
        return {"explanation": "e", "rating": 7, "verdict": "A"}

    scripted(responder)
    r = FaithfulnessJudge("likert")(summary="s", articles=event.articles)
    assert r.score == 7 and r.failed == 1
    failed = [d for d in r.details if d["rating"] is None]
    assert failed[0]["key"] == event.articles[3].aid and "does not fit" in failed[0]["error"]
    cases = pairwise_cases(event, "faithfulness")
    pairs = judge_pairs(PairwiseJudge("faithfulness"), [(cid, ref, "one", "two") for cid, ref in cases])
    assert sum(1 for p in pairs if p["winner"] is None) == 1 and "does not fit" in pairs[3]["error"]


def test_binary_faithfulness_rejects_likert_values(event):
    scripted(lambda call: {"explanation": "e", "rating": 5})
    r = FaithfulnessJudge("binary")(summary="s", articles=event.articles[:2])
    assert r.score is None and r.failed == 2
    assert all("outside the binary scale" in d["error"] for d in r.details)


# ---------------------------------------------------------------------------
# pairwise comparison and position bias


def test_the_pairwise_judge_can_describe_every_criterion():
    assert set(signatures.CRITERION_DESCRIPTIONS) == set(CRITERIA)


def test_judge_that_always_picks_the_second_position(event):
    lm = scripted(lambda call: {"explanation": "B reads better", "verdict": "B"})
    judge = PairwiseJudge("faithfulness")
    cases = [(cid, ref, "summary one", "summary two") for cid, ref in pairwise_cases(event, "faithfulness")]
    pairs = judge_pairs(judge, cases)
    assert len(pairs) == 10 and len(lm.backend.calls) == 20
    # the two orders really were swapped
    first, second = lm.backend.calls[0].inputs, lm.backend.calls[1].inputs
    assert (first["summary_a"], first["summary_b"]) == ("summary one", "summary two")
    assert (second["summary_a"], second["summary_b"]) == ("summary two", "summary one")
    assert all(p["winner"] == "tie" for p in pairs)  # one win each way: aggregated to a tie
    result = position_bias([(p["first_order"], p["second_order"]) for p in pairs])
    assert result["second_pct"] == 100.0
    assert result["first_pct"] == 0.0
    assert result["consistency_pct"] == 0.0
    assert result["cases"] == 10 and result["verdict_second_pct"] == 100.0
    assert "100.00" in format_position(result, "Faithfulness")


@pytest.mark.parametrize("written, read, winner", [(("a", "b"), ("A", "B"), "1"), (("A", "b."), ("A", "B"), "1"),
                                                  (("Tie", " TIE "), ("tie", "tie"), "tie"),
                                                  (("b", "a"), ("B", "A"), "2")])
def test_pairwise_verdicts_written_another_way_are_read_as_the_verdict_they_name(written, read, winner):
    answers = iter(written)
    lm = scripted(lambda call: {"explanation": "because", "verdict": next(answers)})
    r = PairwiseJudge("coverage")(reference="ref", summary_1="one", summary_2="two")
    assert (r.first_order, r.second_order, r.winner, r.error) == (*read, winner, None)
    assert len(lm.backend.calls) == 2


@pytest.mark.parametrize("written, read", [("Summary A", "A"), ("summary b", "B"), ("Summary B is better", "B"),
                                           ("A is better.", "A"), ("**Summary A**", "A"), ("It is a tie", "tie"),
                                           ("Tie: neither is better", "tie")])
def test_a_pairwise_verdict_naming_its_summary_is_read_as_that_verdict(written, read):
    """'Summary A' names the verdict A: read so, not re-asked until the comparison is recorded as failed."""
    lm = scripted(lambda call: {"explanation": "because", "verdict": written})
    r = PairwiseJudge("coverage")(reference="ref", summary_1="one", summary_2="two")
    assert (r.first_order, r.second_order, r.error) == (read, read, None)
    assert len(lm.backend.calls) == 2


@pytest.mark.parametrize("written", ["A or B", "Summary A and summary B", "Neither", "B is worse", "Not A"])
def test_a_pairwise_verdict_naming_no_single_verdict_is_refused(written):
    lm = scripted(lambda call: {"explanation": "because", "verdict": written})
    r = PairwiseJudge("coverage")(reference="ref", summary_1="one", summary_2="two")
    assert r.first_order is None and r.error and len(lm.backend.calls) == 6


def test_position_bias_arithmetic():
    pairs = [("A", "A"),    # first position wins both times
             ("B", "B"),    # second position wins both times
             ("A", "B"),    # summary 1 wins both orders: consistent
             ("B", "A"),    # summary 2 wins both orders: consistent
             ("tie", "tie"),  # consistent tie
             ("A", "tie"),  # neither
             (None, "A")]   # judge failed
    r = position_bias(pairs)
    assert r["cases"] == 6 and r["failed"] == 1
    assert r["first_pct"] == pytest.approx(100 / 6, abs=0.01)
    assert r["second_pct"] == pytest.approx(100 / 6, abs=0.01)
    assert r["consistency_pct"] == 50.0


def test_both_way_aggregation():
    assert aggregate_both_orders("A", "B") == "1"
    assert aggregate_both_orders("B", "A") == "2"
    assert aggregate_both_orders("A", "A") == "tie"
    assert aggregate_both_orders("A", "tie") == "1"
    assert aggregate_both_orders("tie", "A") == "2"


# ---------------------------------------------------------------------------
# verbosity


def test_verbosity_construction():
    s = "The bridge closed.  Sources differ on why.\n"
    ext = repeat_summary(s)
    assert ext == "The bridge closed.  Sources differ on why.\n\nThe bridge closed.  Sources differ on why."
    assert ext.split("\n\n")[0] == ext.split("\n\n")[1] == s.strip()
    assert repeat_summary(s, times=1) == s.strip()


def test_verbosity_judges_see_the_repeated_summary(event):
    summary = "Sources differ on the cause."
    seen = []

    def responder(call):
        seen.append(call.inputs)
        if call.wants("verdict"):
            return {"explanation": "shorter", "verdict": "A"}
        return {"explanation": "e", "rating": 8 if call.inputs["summary"] == summary else 5}

    scripted(responder)
    judge = FaithfulnessJudge("likert")
    orig = judge(summary=summary, articles=event.articles[:3])
    ext = judge(summary=repeat_summary(summary), articles=event.articles[:3])
    assert seen[3]["summary"] == summary + "\n\n" + summary
    single = verbosity_single([d["rating"] for d in orig.details], [d["rating"] for d in ext.details])
    assert single["original_pct"] == 100.0 and single["extended_pct"] == 0.0 and single["cases"] == 3
    pairs = judge_pairs(PairwiseJudge("faithfulness"),
                        [(a.aid, a.as_text(), summary, repeat_summary(summary)) for a in event.articles[:3]])
    pw = verbosity_pairwise([(p["first_order"], p["second_order"]) for p in pairs])
    # a judge that always picks the first shown: both orders cancel out
    assert pw["tie_pct"] == 100.0 and pw["position"]["first_pct"] == 100.0


def test_verbosity_single_arithmetic():
    r = verbosity_single([5, 5, 3, None], [4, 5, 6, 2])
    assert r["cases"] == 3 and r["failed"] == 1
    assert r["original_pct"] == pytest.approx(33.33) and r["extended_pct"] == pytest.approx(33.33)
    assert r["tie_pct"] == pytest.approx(33.33)
    json.dumps(r)


def test_a_summary_cut_off_at_the_token_limit_is_kept_and_flagged(event):
    lm = scripted(lambda call: {"summary": "Sources disagree on the cause and the"}, window=16384)
    lm.backend.finish_reason = "length"
    pred = DiverseSummarizer("direct")(articles=article_texts(event))
    assert pred.summary == "Sources disagree on the cause and the" and pred.cut_off is True
    lm.backend.finish_reason = "stop"
    assert DiverseSummarizer("direct")(articles=article_texts(event)[:3]).cut_off is False


def test_extraction_rejects_numbers_outside_the_article_and_takes_short_articles_whole(event):
    asked: list[int] = []

    def responder(call):
        if call.wants("picks"):
            asked.append(call.attempt)
            return {"picks": [0, 99]}  # never a sentence of the article
        return {"summary": "Sources disagree."}

    lm = scripted(responder, window=4096)
    summarizer = DiverseSummarizer("extract", num_sentences=2)
    article = article_texts(event)[0]
    assert summarizer.extract_sentences(article) == []  # re-asked, then recorded as nothing picked
    assert asked == [0, 1, 2]

    short = "[x] A short report (example.org)\nThe bridge closed on Monday. Nobody knows for how long."
    calls_before = len(lm.backend.calls)
    assert summarizer.extract_sentences(short) == ["The bridge closed on Monday.", "Nobody knows for how long."]
    assert len(lm.backend.calls) == calls_before  # nothing to choose, no LM call


@pytest.mark.parametrize("picks", [["[3]", "[5]"], "[3], [5]", ["Sentence 3", "Sentence 5"], ["3", "5"]])
def test_sentence_numbers_written_as_the_prompt_shows_them_are_read(event, picks):
    """The sentences are shown as '[3] ...': a model without its schema enforced answers '[3]'. Refused,
    the article was summarized from nothing ('- (none)') with no error anywhere."""
    lm = scripted(lambda call: {"picks": picks}, window=4096)
    article = article_texts(event)[0]
    got = DiverseSummarizer("extract", num_sentences=2).extract_sentences(article)
    sentences = [s.strip() for s in split_sentences(article.split("\n", 1)[1]) if s.strip()]
    assert got == [sentences[2], sentences[4]] and len(lm.backend.calls) == 1


def test_an_article_no_sentence_was_picked_from_is_recorded_and_none_at_all_is_no_summary(event):
    """An article whose picks stay invalid is summarized as '- (none)': the row says which, and with
    no sentence from any article there is nothing to summarize (nor to judge)."""
    first = event.articles[0].aid

    def responder(call):
        if call.wants("picks"):
            bad = call.inputs["title"].startswith(f"[{first}]")
            return {"picks": [0, 99] if bad else [1, 2]}
        return {"summary": "Sources disagree."}

    lm = scripted(responder, window=4096)
    row = summarize_events([event], method="extract", sentences=2, judge=False)[0]
    assert row["summary"] == "Sources disagree." and row["error"] is None
    assert len(row["extract_errors"]) == 1 and row["extract_errors"][0].startswith(f"[{first}]")
    assert "sentence numbers run from 1 to" in row["extract_errors"][0]

    lm = scripted(lambda call: {"picks": [0]} if call.wants("picks") else {"summary": "Nothing."}, window=4096)
    row = summarize_events([event], method="extract", sentences=2, judge=False)[0]
    assert row["summary"] is None and "no sentence was picked from any of the 10 articles" in row["error"]
    assert len(row["extract_errors"]) == 10
    assert not any(c.wants("summary") for c in lm.backend.calls)


def picks_everything(call):
    return {"picks": list(range(1, 11))} if call.wants("picks") else {"summary": "Sources disagree."}


def test_extracts_no_pick_could_fit_are_refused_before_any_pick_naming_the_sentences_that_fit(event):
    """At 4096 tokens no 10 sentences of each article fit the summarizer's prompt; the picks were asked
    (one call per article longer than that) and the line then said "lower --sentences", naming no value.
    Now no pick is asked, and the line names the most sentences every pick of which fits."""
    lm = scripted(picks_everything, window=4096)
    row = summarize_events([event], method="extract", sentences=10, judge=False)[0]
    assert row["summary"] is None and row["error"] == ("no pick of 10 sentences per article can fit the context "
                                                       "window (4096 tokens); lower sentences to 5 or less")
    assert lm.backend.calls == []
    scripted(picks_everything, window=4096)
    assert summarize_events([event], method="extract", sentences=5, judge=False)[0]["summary"] == "Sources disagree."


def test_picked_sentences_too_long_name_the_sentences_that_fit_and_a_window_too_small_for_one_names_its_own(event):
    """Picks that could fit but did not (the longest sentences) name a --sentences that fits whatever is
    picked; where not even one sentence per article fits (the default 1024 tokens kept for the summary
    fill half of 2048), the line names the window that does, as "lower --sentences" did not."""
    lm = scripted(picks_everything, window=3072)
    row = summarize_events([event], method="extract", sentences=4, judge=False)[0]
    assert row["error"] == ("the extracted sentences do not fit the context window (3072 tokens); lower sentences "
                            "to 2 or less")  # summarize_events' keyword; the command names --sentences
    assert sum(1 for c in lm.backend.calls if c.wants("picks")) == 10
    scripted(picks_everything, window=3072)
    assert summarize_events([event], method="extract", sentences=2, judge=False)[0]["summary"] == "Sources disagree."

    lm = scripted(picks_everything, window=2048)
    row = summarize_events([event], method="extract", sentences=10, judge=False)[0]
    assert row["error"] == ("no pick of 10 sentences per article can fit the context window (2048 tokens) beside the "
                            "1024 tokens kept for the summary, and one sentence from each of the 10 articles needs a "
                            "window of 2,350 tokens or more")
    assert lm.backend.calls == []
    scripted(picks_everything, window=2350)
    assert summarize_events([event], method="extract", sentences=1, judge=False)[0]["summary"] == "Sources disagree."


def test_a_server_that_states_no_window_and_refuses_the_articles_names_the_window_to_plan_for(event):
    """llama-cpp-python's server states no window: the articles were planned for 8192 tokens, sent whole,
    refused naming 2048, and the line said "use smaller inputs", not the context_window that makes
    `auto` extract sentences instead (the keyword of this library call; the command names its option)."""
    from booklens.lm import ContextWindowExceeded

    def responder(call):
        raise ContextWindowExceeded("the prompt (3727 tokens) and its answer budget (1024 tokens) do not fit the "
                                    "2048-token context window of 'openai/smol': use smaller inputs, or a model or "
                                    "server with a larger context", window=2048)

    scripted(responder, window=None)
    row = summarize_events([event], method="auto", judge=False)[0]
    assert row["method"] == "direct" and row["error"] == (
        "the prompt (3727 tokens) and its answer budget (1024 tokens) do not fit the 2048-token context window of "
        "'openai/smol': diverse summarization plans for a 8192-token window; set context_window to 2048 or less")


@pytest.mark.parametrize("written, read", [("corrosion", ["corrosion"]), (None, []), ("", [])])
def test_extracted_answers_written_as_one_string_or_null_are_read(event, written, read):
    """A lone answer written as a string was lost (the article counted as not answering) after three
    calls; `null` for none cost three calls too."""
    def responder(call):
        if call.wants("questions"):
            return {"questions": ["Why did it close?"]}
        if call.wants("answers"):
            return {"answers": written}
        raise AssertionError(call.output_fields)

    lm = scripted(responder)
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles[:3]]
    ref = ReferenceBuilder(num_questions=1, clustering="exact", diversity_filter=False)(articles=articles)
    assert ref.screening[0]["answers"] == 3 * len(read)
    assert len(lm.backend.calls) == 1 + 3


def test_articles_whose_answers_never_parsed_are_counted_apart_from_articles_without_an_answer(event):
    """An article whose answer extraction failed was counted as not answering: a question could be
    dropped for 'too few articles answering' when the model's replies were what failed."""
    def responder(call):
        if call.wants("questions"):
            return {"questions": ["Why did it close?"]}
        if call.wants("answers"):
            return "garbage" if call.inputs["article"].startswith(("[a01]", "[a02]")) else {"answers": ["rust"]}
        raise AssertionError(call.output_fields)

    scripted(responder)
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles[:3]]
    ref = ReferenceBuilder(num_questions=1, clustering="exact", diversity_filter=False,
                           min_answer_share=0.5)(articles=articles)
    why = ref.screening[0]
    assert why["articles_answering"] == 1 and why["extraction_failures"] == 2 and not why["kept"]
    assert why["extraction_error"].startswith("a01: ")
    # Half of 3 articles is 1.5: the rule keeps a question 2 articles answer, so it says 2.
    assert why["reason"] == "answered by 1 of 3 articles (needs at least 2); 2 articles gave no valid answer"

    # an article too long for the window is such an article too, not the end of the run
    from booklens.lm import ContextWindowExceeded

    def too_long(call):
        if call.wants("answers") and call.inputs["article"].startswith("[a01]"):
            raise ContextWindowExceeded("the prompt (9100 tokens) does not fit the 8192-token context window")
        return responder(call)

    scripted(too_long)
    ref = ReferenceBuilder(num_questions=1, clustering="exact", diversity_filter=False,
                           min_answer_share=0.5)(articles=articles)
    assert ref.screening[0]["extraction_failures"] == 2
    assert ref.screening[0]["extraction_error"].startswith("a01: the prompt (9100 tokens) does not fit")


def test_an_article_too_long_to_pick_from_whole_is_picked_from_as_far_as_fits():
    """One article far longer than the others made the whole event fail ('too long to pick sentences
    from'): its sentences are now offered as far as they fit, and the record says where they stop."""
    payload = json.loads(FIXTURE.read_text())[0]
    payload["articles"][3]["content"] = " ".join(f"The council met for the {i}th time about the bridge."
                                                 for i in range(1, 1500))
    event = parse_events([payload])[0]
    offered: list[int] = []

    def responder(call):
        if call.wants("picks"):
            offered.append(len(json.loads(call.inputs["sentences"])))
            return {"picks": [1, 2]}
        return {"summary": "Sources disagree."}

    lm = scripted(responder, window=8192)
    row = summarize_events([event], method="extract", sentences=2, judge=False)[0]
    assert row["summary"] == "Sources disagree." and row["error"] is None and row["extract_errors"] == []
    assert len(row["extract_notes"]) == 1 and row["extract_notes"][0].startswith("[a04]")
    shown = max(offered)
    assert 2 < shown < 1499 and f"the first {shown} of 1499 sentences" in row["extract_notes"][0]
    summarizer = DiverseSummarizer("extract", num_sentences=2)
    article = article_texts(event)[3]
    numbered = [f"[{i}] {s}" for i, s in enumerate(split_sentences(article.split("\n", 1)[1])[:shown], 1)]
    from booklens.programs.base import prompt_tokens
    assert prompt_tokens(summarizer.extract, title=article.split("\n")[0], sentences=numbered,
                         num_sentences=2) <= summarizer.budget()


def test_answer_numbers_written_as_the_prompt_shows_them_are_read(event):
    """Answers are shown as '[n] (aid) answer': the clustering and the filter read '[n]' as n."""
    def bracketed(reply):
        if "groups" in reply:
            return {"groups": [[f"[{n}]" for n in g] for g in reply["groups"]]}
        return {k: [f"[{n}]" for n in v] for k, v in reply.items()}

    plain, seen = reference_responder(), []

    def responder(call):
        seen.append(call)
        reply = plain(call)
        return bracketed(reply) if call.wants("groups") or call.wants("invalid", "diverse") else reply

    scripted(responder)
    articles = [(a.aid, f"[{a.aid}] {a.as_text()}") for a in event.articles]
    ref = ReferenceBuilder(num_questions=3)(articles=articles)
    kept = ref.screening[0]
    assert kept["kept"] and kept["invalid_answers"] == 2 and kept["diverse_clusters"] == 3 and kept["clusters"] == 3
    assert kept["clustering_error"] is None and kept["filter_error"] is None
    assert sum(1 for c in seen if c.wants("groups") or c.wants("diverse")) == 5  # none re-asked


def test_a_title_over_several_lines_stays_on_the_heading_line(event):
    """The summarizer's article text is one heading line, then the content: a line break in a
    title would end the heading early and send the title's tail to the sentences to pick from."""
    seen: list = []

    def responder(call):
        if call.wants("picks"):
            seen.append(call.inputs)
            return {"picks": [1]}
        return {"summary": "Sources disagree."}

    data = event.model_dump()
    data["articles"][0]["title"] = "Harbor bridge\nclosed after   inspection"
    data["articles"][0]["domain"] = " news.example\n"
    ev = parse_events([data])[0]
    texts = article_texts(ev)
    assert texts[0].split("\n", 1)[0] == "[a01] Harbor bridge closed after inspection (news.example)"
    scripted(responder, window=4096)
    DiverseSummarizer("extract", num_sentences=2)(articles=texts)
    sentences = [s.strip() for s in split_sentences(ev.articles[0].content) if s.strip()]
    assert seen[0]["title"] == "[a01] Harbor bridge closed after inspection (news.example)"
    assert json.loads(seen[0]["sentences"]) == [f"[{i}] {s}" for i, s in enumerate(sentences, 1)]


def test_articles_without_title_or_domain_are_extracted_from_like_any_other(event):
    """The first line of an article text is its heading even when the article has no title or
    domain ('[aid]' alone), so every sentence of the content can be picked: none is taken for the
    heading or passed through whole."""
    seen: list = []

    def responder(call):
        if call.wants("picks"):
            seen.append(call.inputs)
            return {"picks": [1, 2]}
        return {"summary": "Sources disagree."}

    untitled = event.model_dump()
    for a in untitled["articles"]:
        a["title"] = a["domain"] = ""
    one_paragraph = json.loads(json.dumps(untitled))
    for a in one_paragraph["articles"]:
        a["content"] = " ".join(a["content"].split())
    for data in (one_paragraph, untitled):
        seen.clear()
        ev = parse_events([data])[0]
        texts = article_texts(ev)
        assert texts[0].split("\n", 1)[0] == "[a01]"
        scripted(responder, window=4096)
        pred = DiverseSummarizer("extract", num_sentences=2)(articles=texts)
        assert len(seen) == 10  # one extraction per article
        for article, asked, extract in zip(ev.articles, seen, pred.extracts):
            sentences = [s.strip() for s in split_sentences(article.content) if s.strip()]
            assert asked["title"] == f"[{article.aid}]"
            assert json.loads(asked["sentences"]) == [f"[{i}] {s}" for i, s in enumerate(sentences, 1)]
            assert extract == f"[{article.aid}]\n- {sentences[0]}\n- {sentences[1]}"

    # A text with nothing after its heading line is refused before any call.
    calls = len(seen)
    with pytest.raises(BooklensError, match=r"^article 2 has no content after its heading line: an article text "
                                            r"is a heading line \('\[aid\] title \(domain\)', or '\[aid\]'\), then "
                                            r"the content$"):
        DiverseSummarizer("extract", num_sentences=2)(articles=[texts[0], "[a02] The bridge closed on Monday."])
    assert len(seen) == calls

    # A long untitled article is measured whole and named by its heading, not its first paragraph.
    untitled["articles"][0]["content"] = "\n\n".join(f"Sentence {i} of a long feature about the bridge."
                                                     for i in range(1500))
    scripted(responder, window=4096)
    rows = summarize_events(parse_events([untitled]), method="extract", sentences=2, judge=False)
    assert rows[0]["summary"] == "Sources disagree."
    assert rows[0]["extract_notes"][0].startswith("[a01]: picked from the first ")


def test_an_event_too_large_for_the_window_gets_an_error_and_the_others_go_on(event):
    def responder(call):
        if call.wants("picks"):
            return {"picks": [1, 2]}
        return {"summary": "Sources disagree on the toll."}

    lm = scripted(responder, window=4096)
    long_event = event.model_dump()
    long_event["eid"] = "long"
    # one sentence longer than the window: no part of the article can be offered
    long_event["articles"][0]["content"] = ("It began " + " ".join(f"with part {i} of a long feature about the bridge"
                                                                 for i in range(1500)) + ". It ended. Nobody knew why.")
    events = [parse_events([small_event()])[0], parse_events([long_event])[0]]
    rows = summarize_events(events, method="extract", sentences=2, judge=False)
    assert rows[0]["summary"] == "Sources disagree on the toll." and rows[0]["error"] is None
    assert rows[1]["summary"] is None and "too long to pick sentences from" in rows[1]["error"]
    # The article that cannot fit is never sent (the server would refuse it).
    assert not any("part 1499" in json.dumps(call.inputs) for call in lm.backend.calls)


def test_an_event_too_large_to_build_references_for_is_a_reference_error_not_the_end_of_the_run(event):
    """A server refusing the question-generation prompt (or the filter's) as too long for its window
    ended the whole `diverse` run, every other event's summary and judgments unwritten: the event
    gets no generated references (the reason is its reference_error), or the question is dropped or
    its answers grouped by wording (the screening says why), and the run goes on."""
    from booklens.lm import ContextWindowExceeded

    too_long = ContextWindowExceeded("the prompt (9100 tokens) does not fit the 8192-token context window")
    base = reference_responder()

    def responder(call):
        if call.wants("questions") and "Later report" in call.inputs["articles"]:
            raise too_long
        if call.wants("invalid", "diverse") and call.inputs["question"] == "Why did it close?":
            raise too_long
        if call.wants("groups") and call.inputs["question"] == "When did it close?":
            raise too_long
        if call.wants("summary"):
            return {"summary": "Sources disagree."}
        return base(call)

    scripted(responder, window=16384)
    first = event.model_copy(update={"eid": "e1", "question_answers": []})
    later = first.model_copy(update={"eid": "e2", "articles": [
        a.model_copy(update={"content": "Later report. " + a.content}) for a in first.articles]})
    rows = summarize_events([later, first], generate_questions=3, judge=False)
    assert rows[0]["summary"] == "Sources disagree." and rows[0]["generated_question_answers"] == []
    assert rows[0]["reference_error"].startswith("the prompt (9100 tokens) does not fit")
    why = rows[1]["reference_screening"][0]
    assert not why["kept"] and why["filter_error"].startswith("the prompt (9100 tokens) does not fit")
    assert rows[1]["reference_error"] is None
    when = rows[1]["reference_screening"][2]  # its answers grouped by identical wording instead
    assert when["clustering_error"].startswith("clustering failed (the prompt (9100 tokens) does not fit")


@pytest.mark.parametrize("judge", [True, False], ids=["judged", "not-judged"])
def test_an_event_whose_summary_failed_costs_no_reference_calls(event, judge):
    """References are built to judge a summary's coverage against: an event whose summary failed has
    none to judge, so no questions are generated for it (the record says why), and the other events
    still get theirs."""
    from booklens.lm import ContextWindowExceeded

    base = reference_responder()
    seen = []

    def responder(call):
        seen.append(call)
        if call.wants("summary"):
            if "Later report" in json.dumps(call.inputs):
                raise ContextWindowExceeded("the prompt (9100 tokens) does not fit the 8192-token context window")
            return {"summary": "Sources disagree."}
        if call.wants("rating"):
            return {"rating": 5, "explanation": "fine"}
        return base(call)

    scripted(responder, window=16384)
    first = event.model_copy(update={"eid": "e1", "question_answers": []})
    later = first.model_copy(update={"eid": "e2", "articles": [
        a.model_copy(update={"content": "Later report. " + a.content}) for a in first.articles]})
    rows = summarize_events([later, first], method="direct", generate_questions=3, judge=judge,
                            faithfulness=("likert",) if judge else ())
    assert rows[0]["summary"] is None and rows[0]["references"] is None
    assert rows[0]["references_skipped"] == "the event has no summary to judge against them"
    assert "generated_questions" not in rows[0]
    asked = [json.dumps(call.inputs) for call in seen if call.wants("questions")]
    assert len(asked) == 1 and "Later report" not in asked[0]  # the other event's only
    assert rows[1]["summary"] == "Sources disagree." and rows[1]["references"] == "generated"
    assert "references_skipped" not in rows[1]


def test_an_event_too_large_under_auto_is_recorded_with_the_method_that_failed(event):
    """`--method auto` turned to extract-then-summarize for an event too long to read whole; when that
    failed too, the row (and the command's heading) said `auto`, as if no method had been chosen."""
    def responder(call):
        if call.wants("picks"):
            return {"picks": [1, 2]}
        return {"summary": "Sources disagree on the toll."}

    scripted(responder, window=4096)
    long_event = event.model_dump()
    long_event["articles"][0]["content"] = ("It began " + " ".join(f"with part {i} of a long feature about the bridge"
                                                                 for i in range(1500)) + ". It ended. Nobody knew why.")
    rows = summarize_events([parse_events([long_event])[0]], method="auto", sentences=2, judge=False)
    assert rows[0]["summary"] is None and "too long to pick sentences from" in rows[0]["error"]
    assert rows[0]["method"] == "extract"


def test_a_summary_prompt_the_server_refuses_as_too_long_under_auto_is_recorded_as_direct(event):
    """The articles counted as fitting, so auto went direct, but the server's window was smaller: the
    event fails alone, and its row names the method that was tried."""
    from booklens.lm import ContextWindowExceeded

    def responder(call):
        if call.wants("summary"):
            raise ContextWindowExceeded("the prompt (9100 tokens) does not fit the 8192-token context window")
        return {"explanation": "fine", "rating": 1}

    scripted(responder)
    rows = summarize_events([event], method="auto", judge=False)
    assert rows[0]["summary"] is None and "does not fit the 8192-token context window" in rows[0]["error"]
    assert rows[0]["method"] == "direct"


def test_the_articles_a_kept_question_needs_are_whole_and_keep_the_same_questions():
    """The share of the articles a question needs (30% by default) was said as a fraction ("needs
    1.5"); it is the whole number of articles the rule asks for, and keeps exactly what it kept."""
    from booklens.programs.diverse import articles_needed

    for share in (0.3, 0.5, 0.25, 0.1, 1 / 3):
        for n in range(1, 61):
            needed = articles_needed(share, n)
            assert isinstance(needed, int)
            for answering in range(n + 1):
                assert (answering < needed) == (answering < max(1, share * n)), (share, n, answering)
    assert [articles_needed(0.3, n) for n in (3, 5, 7, 10)] == [1, 2, 3, 3]


# ---------------------------------------------------------------------------
# the programs called from Python with inputs of the wrong type


def _rated(call):
    return {"explanation": "e", "rating": 1, "verdict": "A", "summary": "Sources differ.", "picks": [1]}


@pytest.mark.parametrize("call, message", [
    (lambda e: CoverageJudge("binary")(summary=None, qa_pairs=e.question_answers), "the summary is empty"),
    (lambda e: CoverageJudge("likert")(summary=["One.", "Two."], qa_pairs=e.question_answers),
     "the summary must be text, not list"),
    (lambda e: FaithfulnessJudge("likert")(summary=None, articles=e.articles), "the summary is empty"),
    (lambda e: PairwiseJudge("coverage")(reference=e.qa_text(), summary_1=None, summary_2="Two."),
     "the summary is empty"),
    (lambda e: CoverageJudge("binary")(summary="S.", qa_pairs="What caused it?"),
     "qa_pairs must be a list of reference QA pairs ({question, answer_groups}), not one string"),
    (lambda e: CoverageJudge("binary")(summary="S.", qa_pairs=["What caused it?"]),
     "qa_pairs must be a list of reference QA pairs ({question, answer_groups}), not a list holding str"),
    (lambda e: FaithfulnessJudge("likert")(summary="S.", articles=["one article", "another"]),
     "articles must be a list of articles ({aid, content, ...}), not a list holding str"),
    (lambda e: rate_event("faithfullness", "likert", e, "S."), "unknown criterion 'faithfullness': use coverage or "
                                                               "faithfulness"),
    (lambda e: DiverseSummarizer("extract", num_sentences="3"), "the number of sentences per article must be at "
                                                                "least 1 (got '3')"),
    (lambda e: DiverseSummarizer(context_window="8192"), "context_window must be at least 256 (got '8192')"),
    (lambda e: DiverseSummarizer()(articles=[1, 2]),
     "articles must be article texts (article_texts(event)) or articles, not a list holding int"),
    (lambda e: ReferenceBuilder("2"), "generate_questions must be at least 1 (got '2')"),
    (lambda e: ReferenceBuilder(2)(articles=article_texts(e)),
     "articles must be (aid, text) pairs, not a list holding str"),
    (lambda e: summarize_events(FIXTURE, judge=False), "events must be a list of events (load_events(path)), "
                                                       "not PosixPath"),
    (lambda e: summarize_events([e], faithfulness="likert"),
     "faithfulness must be a list of protocols (binary, likert), not one string"),
])
def test_the_programs_refuse_inputs_of_the_wrong_type_in_one_line_before_any_call(event, call, message):
    """Called from Python with a value of the wrong type, a program said so in an AttributeError or a
    TypeError from deep inside, or judged it: a summary of None as the text 'None', a misspelt
    criterion as faithfulness. Now one line names what it takes, and no call is made."""
    lm = scripted(_rated)
    with pytest.raises(BooklensError) as caught:
        call(event)
    assert str(caught.value) == message
    assert lm.backend.calls == []


def test_the_programs_take_articles_and_references_as_objects_or_as_the_files_write_them(event):
    """The judges and the summarizer take what `load_events` gives (Article, QuestionAnswers) and what
    the DiverseSumm file holds (dicts, as `to_examples` passes references on), with the same prompts."""
    lm = scripted(_rated)
    as_objects = CoverageJudge("binary")(summary="S.", qa_pairs=event.question_answers)
    as_dicts = CoverageJudge("binary")(summary="S.", qa_pairs=[qa.model_dump() for qa in event.question_answers])
    assert as_dicts.score == as_objects.score == 1.0 and len(as_dicts.details) == 6
    assert [c.inputs for c in lm.backend.calls[6:]] == [c.inputs for c in lm.backend.calls[:6]]
    calls = len(lm.backend.calls)
    FaithfulnessJudge("binary")(summary="S.", articles=event.articles[:2])
    FaithfulnessJudge("binary")(summary="S.", articles=[a.model_dump() for a in event.articles[:2]])
    assert [c.inputs for c in lm.backend.calls[calls + 2:]] == [c.inputs for c in lm.backend.calls[calls:calls + 2]]
    calls = len(lm.backend.calls)
    DiverseSummarizer("direct")(articles=article_texts(event))
    DiverseSummarizer("direct")(articles=event.articles)
    assert lm.backend.calls[calls + 1].inputs == lm.backend.calls[calls].inputs


# ---------------------------------------------------------------------------
# summaries without a word


@pytest.mark.parametrize("summary", ["...", "\u200b\u200b", " — * — "])
def test_a_summaries_file_whose_summary_has_no_word_is_refused(summary):
    """A summary of punctuation or invisible characters was judged: with nothing in it to contradict
    an article, the faithfulness judges rated it faithful. The other commands refuse such a summary."""
    with pytest.raises(BooklensError) as caught:
        parse_summaries({"e1": "Sources differ on the toll.", "e2": summary})
    assert str(caught.value) == ("summaries: the summary of event 'e2' has no words (only punctuation, symbols or "
                                 "invisible characters)")


def test_a_generated_summary_without_a_word_is_asked_again_and_never_kept(event):
    """The summarizer kept '...' as the event's summary, and `diverse` judged it (faithful to every
    article). It is re-asked as an empty one is; one that never has a word is no summary."""
    answers = iter(["...", "Sources differ on the toll."])
    lm = scripted(lambda call: {"summary": next(answers)})
    pred = DiverseSummarizer("direct")(articles=article_texts(event)[:3])
    assert pred.summary == "Sources differ on the toll." and pred.attempts == 2 and len(lm.backend.calls) == 2
    lm = scripted(lambda call: {"summary": "\u200b…"})
    pred = DiverseSummarizer("direct")(articles=article_texts(event)[:3])
    assert pred.summary is None and len(lm.backend.calls) == 3 and "no words" in pred.error


# ---------------------------------------------------------------------------
# resuming


def test_a_run_a_backend_failure_stopped_resumes_with_exactly_the_calls_it_lacks(tmp_path):
    """Stopped by the backend after 20 of its calls (summaries, sentence picks, references, judges),
    a `diverse` run rerun on the same cache asks for the others only, and writes what an
    uninterrupted run writes."""
    from booklens.diverse_runs import run_diverse
    from booklens.errors import LMError

    given = json.loads(FIXTURE.read_text())[0]
    other = {**given, "eid": "ev-0002", "question_answers": [],
             "articles": [{**a, "content": "Update. " + a["content"]} for a in given["articles"]]}
    events = tmp_path / "events.json"
    events.write_text(json.dumps([given, other]))

    def run(cache, fail_after=None):
        calls = []

        def responder(call):
            calls.append(call)
            if fail_after is not None and len(calls) > fail_after:
                raise LMError("the server went away")
            likert = "questions_and_answers" in call.inputs or "1 to 10" in call.system
            answer = {"summary": "Sources differ on the cause.", "explanation": "e", "rating": 7 if likert else 1,
                      "picks": [1, 2, 3], "questions": ["What caused the crack?", "How long will it last?"],
                      "answers": ["corrosion"], "groups": [[1, 2]], "invalid": [], "diverse": [1, 2]}
            return {name: answer[name] for name in call.output_fields}

        lm = ScriptedLM(responder, cache_dir=cache)
        return run_diverse(events, lm=lm, method="extract", generate_questions=2, faithfulness="both",
                           concurrency=1), calls

    whole, calls = run(tmp_path / "whole")
    total = len(calls)
    with pytest.raises(LMError, match="the server went away"):
        run(tmp_path / "stopped", fail_after=20)
    resumed, calls = run(tmp_path / "stopped")
    assert total == 93 and len(calls) == total - 20
    assert resumed["usage"]["calls"] == total and resumed["usage"]["cached_calls"] == 20
    assert resumed["events"] == whole["events"]
