"""BooookScore metrics (Eq. 1, footnote 12, Table 1/2 columns) and agreement statistics."""

from __future__ import annotations

import booklens  # noqa: F401
import pytest

from booklens.data.booookscore import (
    human_match_notes,
    human_results,
    parse_human_annotations,
    parse_sentence_annotations,
    results_from_json,
)
from booklens.data.splits import books_in_split, split_by_book
from booklens.errors import BooklensError
from booklens.metrics.agreement import agreement, binary_agreement, cohen_kappa, confusion_match, format_agreement
from booklens.metrics.booookscore import (
    annotation_booookscore,
    booookscore,
    build_set,
    error_type_rates,
    finish_result,
    novel_trigram_pct,
    repeated_trigram_pct,
    system_score,
    trigrams,
)
from booklens.records import CoherenceResult, SentenceAnnotation

SUMMARY = ("Mara keeps the lighthouse with her father. Zed appears at the door. "
           "Her father gets sick. Mara keeps the lamp burning. Mara keeps the lamp burning. "
           "In spring she leaves the island.")


def test_eq1_counts_only_answered_sentences():
    assert booookscore([False, True, False, False]) == 0.75
    assert booookscore([False, None, True, None]) == 0.5
    assert booookscore([None, None]) is None
    anns = [SentenceAnnotation(index=0, sentence="a", confusing=False),
            SentenceAnnotation(index=1, sentence="b", confusing=None, status="failed", error="x")]
    assert booookscore(anns) == 1.0
    assert system_score([0.5, 1.0, None]) == 0.75
    assert annotation_booookscore(3, 10) == pytest.approx(0.7)
    assert annotation_booookscore(12, 10) == 0.0


def test_error_type_rates_count_each_annotation_over_all_sentences():
    rates = error_type_rates([["entity omission"], ["entity omission", "salience"]], 20)
    assert rates["entity omission"] == pytest.approx(10.0)
    assert rates["salience"] == pytest.approx(5.0)
    assert rates["language"] == 0.0
    assert len(rates) == 8


def test_error_type_rates_are_over_the_judged_sentences():
    """A sentence the judge gave no valid answer for is left out of the rates, as of the score: it
    does not count as a sentence free of every error."""
    from booklens.metrics.booookscore import finish_result
    from booklens.records import CoherenceResult

    sentences = [SentenceAnnotation(index=0, sentence="a", confusing=True, types=["entity omission"]),
                 SentenceAnnotation(index=1, sentence="b", confusing=False),
                 SentenceAnnotation(index=2, sentence="c", confusing=None, status="failed", error="x"),
                 SentenceAnnotation(index=3, sentence="d", confusing=None, status="failed", error="x")]
    result = finish_result(CoherenceResult(summary="a b c d", sentences=sentences), stats=False)
    system = build_set({"s": result})
    assert (system.system_score, system.n_sentences, system.n_failed) == (0.5, 4, 2)
    assert system.error_type_rates["entity omission"] == pytest.approx(50.0)  # 1 of 2 judged, not of 4

def test_trigram_statistics():
    assert repeated_trigram_pct("a b c a b c") == pytest.approx(100 * 1 / 4)
    assert repeated_trigram_pct("one two") is None
    assert novel_trigram_pct("the cat sat on the mat", "the cat sat down") == pytest.approx(100 * 3 / 4)
    assert novel_trigram_pct("the cat sat", "the cat sat") == 0.0


def test_kappa_of_no_agreement_beyond_chance_is_exactly_zero():
    # 1 of 3 reference positives, none predicted: p_o = p_e = 2/3, which floats made -1.1e-16 ("-0.000")
    assert cohen_kappa([False, False, False], [True, False, False]) == 0.0
    row = binary_agreement([False] * 3, [True, False, False])
    assert row["kappa"] == 0.0 and "-0.000" not in format_agreement(_report_with(row))
    # the bootstrap's statistic agrees with it on the same counts
    import numpy as np

    from booklens.metrics.bootstrap import kappa_of

    assert kappa_of(np.array([[0.0, 0.0, 1.0, 2.0]]))[0] == 0.0
    a = [True] * 25 + [False] * 25
    b = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    assert kappa_of(np.array([[20.0, 5.0, 10.0, 15.0]]))[0] == pytest.approx(cohen_kappa(a, b)) == pytest.approx(0.4)
    assert np.isnan(kappa_of(np.array([[0.0, 0.0, 0.0, 4.0]]))[0])  # both sides constant: undefined


def _report_with(row):
    from booklens.records import COHERENCE_ERROR_TYPES

    return {"a": "a.json", "b": "b.json", "books": 1, "sentences": row["n"], "skipped_sentences": 0,
            "only_in_a": 0, "only_in_b": 0, "confusing": row, "per_type": {t: row for t in COHERENCE_ERROR_TYPES},
            "system_score_a": None, "system_score_b": None, "system_score_diff": None,
            "score_methods": {"a": ["sentences"], "b": ["sentences"]}}


def test_agreement_by_hand_on_ten_sentences():
    """A marks sentences 0-2 (salience), B marks 1-4 (1-2 salience, 3-4 language): the counts and
    every figure of the table, computed by hand."""
    sentences = [f"Sentence number {w} is here." for w in "one two three four five six seven eight nine ten".split()]
    summaries = {"bk": " ".join(sentences)}
    a = results_from_json({"bk": {sentences[i]: {"questions": "Q?", "types": ["salience"]} for i in (0, 1, 2)}},
                          summaries)
    b = results_from_json({"bk": {sentences[i]: {"questions": "Q?", "types": ["salience" if i < 3 else "language"]}
                                  for i in (1, 2, 3, 4)}}, summaries)
    report = agreement(a, b)
    c = report["confusing"]
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (2, 1, 2, 5)
    # p_o = 0.7, p_e = 0.3 * 0.4 + 0.7 * 0.6 = 0.54: kappa = 0.16 / 0.46
    assert (c["precision"], c["recall"], c["f1"], c["accuracy"]) == pytest.approx((2 / 3, 0.5, 4 / 7, 0.7))
    assert c["kappa"] == pytest.approx(0.16 / 0.46)
    salience = report["per_type"]["salience"]  # tp 2, fp 1, fn 0, tn 7: p_o 0.9, p_e 0.62
    assert (salience["precision"], salience["recall"], salience["f1"]) == pytest.approx((2 / 3, 1.0, 0.8))
    assert salience["kappa"] == pytest.approx(0.28 / 0.38)
    assert report["per_type"]["language"]["kappa"] == 0.0
    assert (report["system_score_a"], report["system_score_b"]) == pytest.approx((0.7, 0.6))
    table = format_agreement(report)
    assert table.startswith("Agreement of A (A) with B (B, reference): 1 book, 10 sentences")
    assert "| confusing | 30.0 | 40.0 | 0.667 | 0.500 | 0.571 | 0.348 | 0.700 |" in table
    assert "| language | 0.0 | 20.0 | - | 0.000 | 0.000 | 0.000 | 0.800 |" in table


def test_sentence_annotations_of_other_summaries_are_refused_not_counted_as_clean():
    # One sentence of a summary written the same way by chance matched; the other two did not. Counted, the
    # two would be clean sentences in figures computed against the wrong text.
    summaries = {"b": "The story begins. Ann rows out. Ben waits."}
    data = {"b": {"The story begins.": {"questions": "?", "types": ["salience"]},
                  "Cal flies a kite.": {"questions": "?", "types": ["language"]},
                  "Dee sings alone.": {"questions": "?", "types": ["language"]}}}
    with pytest.raises(BooklensError, match="2 of the 3 annotated sentences .* are not in their summaries"):
        parse_sentence_annotations(data, summaries)
    data["b"].pop("Dee sings alone.")  # half of them: the release's own kind of noise, noted
    results, notes = parse_sentence_annotations(data, summaries)
    assert (notes.annotated, notes.ignored) == (2, 1) and results["b"].score == pytest.approx(2 / 3)


def test_human_spans_not_found_in_their_summary_are_counted_in_the_notes():
    from booklens.data.booookscore import annotation_set_from_json

    data = human_data()
    data["lighthouse"]["singles"].append({"id": "s3", "span": "A sentence from another summary.",
                                          "questions": "?", "labels": ["language"]})
    results, notes = annotation_set_from_json(data)
    assert (notes.annotated, notes.ignored) == (4 + 1, 1)  # two singles, one relation of two spans, the stray
    assert notes.summary_line() == "1 of 5 human-annotated spans are not in their summaries and were ignored"
    assert "A sentence from another summary." in notes[0]
    assert annotation_set_from_json(human_data())[1].ignored == 0


def test_kappa_and_binary_agreement():
    assert cohen_kappa([True, False, True, False], [True, False, True, False]) == 1.0
    assert cohen_kappa([True, True, False, False], [False, False, True, True]) == -1.0
    assert cohen_kappa([False, False], [False, False]) is None
    # textbook example: 20 yes/yes, 5 yes/no, 10 no/yes, 15 no/no -> kappa 0.4
    a = [True] * 25 + [False] * 25
    b = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    row = binary_agreement(a, b)
    assert row["kappa"] == pytest.approx(0.4)
    assert row["precision"] == pytest.approx(20 / 25)
    assert row["recall"] == pytest.approx(20 / 30)
    assert row["f1"] == pytest.approx(2 * 0.8 * (2 / 3) / (0.8 + 2 / 3))


def human_data():
    return {"lighthouse": {
        "summary": SUMMARY,
        "singles": [
            {"id": "s1", "span": "Zed", "questions": "Who is Zed?", "labels": ["entity omission"]},
            # one span over two consecutive sentences
            {"id": "s2", "span": "Her father gets sick. Mara keeps", "questions": "Why does this matter?",
             "labels": ["salience"]},
        ],
        "relations": [
            {"id_a": "r1", "id_b": "r2", "span_a": "Mara keeps the lamp burning.",
             "span_b": "In spring she leaves", "shared_questions": "Why is this repeated?", "same": True,
             "shared_labels": ["duplication"]},
        ],
    }}


def test_human_spans_map_to_sentences_and_footnote_score():
    human = parse_human_annotations(human_data())["lighthouse"]
    assert len(human.sentences) == 6
    assert human.singles[0].sentences == [1]
    assert human.singles[1].sentences == [2, 3]
    assert human.relations[0].sentences == [3, 5]
    flags = [s.confusing for s in human.sentence_annotations()]
    assert flags == [False, True, True, True, False, True]
    result = human.to_result()
    # footnote 12: the two-sentence span and the relation count as one confusing sentence each
    assert result.n_annotations == 3
    assert result.score == pytest.approx(1 - 3 / 6)
    assert result.score_sentences == pytest.approx(2 / 6)
    assert result.annotation_types == [["entity omission"], ["salience"], ["duplication"]]
    assert result.sentences[3].types == ["salience", "duplication"]


def test_sentence_annotations_every_summary_counts():
    summaries = {"lighthouse": SUMMARY, "other": "A calm story. Nothing happens."}
    data = {"lighthouse": {"Zed appears at the door.": {"questions": "Who is Zed? Why now?",
                                                        "types": ["entity omission"]},
                           "This sentence is not there.": {"questions": "?", "types": ["language"]}}}
    results, notes = parse_sentence_annotations(data, summaries)
    assert set(results) == {"lighthouse", "other"}
    assert results["other"].score == 1.0  # absent from the annotation file: no confusing sentence
    assert results["lighthouse"].score == pytest.approx(5 / 6)
    assert results["lighthouse"].sentences[1].questions == ["Who is Zed?", "Why now?"]
    assert any("not in the summary" in n for n in notes)
    system = build_set(results)
    assert system.system_score == pytest.approx((5 / 6 + 1) / 2)


def test_a_sentence_label_keyed_by_text_marks_every_copy_of_that_text():
    """Released sentence labels are keyed by the sentence's text, so a sentence the summary says twice
    has one label for both copies (the judge was asked the same prompt for each). Marking the first
    copy only counted the other as clean: "Mara keeps the lamp burning." is sentences 3 and 4."""
    data = {"lighthouse": {"Mara keeps the lamp burning.": {"questions": "Why again?", "types": ["duplication"]}}}
    results, _ = parse_sentence_annotations(data, {"lighthouse": SUMMARY})
    result = results["lighthouse"]
    assert [s.index for s in result.sentences if s.confusing] == [3, 4]
    assert result.sentences[4].types == ["duplication"]
    assert result.score == pytest.approx(4 / 6)
    # the same with whitespace the summary does not have
    loose = {"lighthouse": {"Mara keeps  the lamp\nburning.": {"questions": "Why again?", "types": ["duplication"]}}}
    results, _ = parse_sentence_annotations(loose, {"lighthouse": SUMMARY})
    assert [s.index for s in results["lighthouse"].sentences if s.confusing] == [3, 4]


@pytest.mark.parametrize("data, summaries, pattern", [
    ([1, 2], {"b": "x."}, "must be a JSON object"),
    ({"b": {"s.": {"questions": "q", "types": ["nonsense"]}}}, {"b": "s."}, "unknown error type"),
    ({"b": {"s.": {"questions": "q", "types": ["language"]}}}, {"c": "s."}, "not in the summaries"),
    ({"b": ["s."]}, {"b": "s."}, "expected null or an object"),
])
def test_sentence_annotations_bad_shapes(data, summaries, pattern):
    with pytest.raises(BooklensError, match=pattern):
        parse_sentence_annotations(data, summaries)


REPEATING = ("Mara keeps the lamp. Zed rows in from the old harbour. Mara keeps the lamp. The storm ends. "
             "Mara keeps the lamp. Zed rows in from the old harbour. The harbour freezes.")


def _flagged(human):
    return [s.index for s in human.sentence_annotations() if s.confusing]


def test_a_relation_linking_a_passage_to_its_copy_marks_both_copies():
    """The files give spans as text, without offsets. An annotator who links a repeated passage to its
    copy gives the same text twice; both spans on the first occurrence left the copy a reader trips
    over counted clean. Span b goes to the next occurrence after span a."""
    relation = {"span_a": "Mara keeps the lamp.", "span_b": "Mara keeps the lamp.",
                "shared_questions": "Why is this said again?", "shared_labels": ["duplication"]}
    human = parse_human_annotations({"b": {"summary": REPEATING, "singles": [], "relations": [relation]}})["b"]
    r = human.relations[0]
    assert (r.a.sentences, r.b.sentences) == ([0], [2])  # the third copy stays clean
    assert r.b.start == REPEATING.index("Mara keeps the lamp.", 1)
    marked = human.sentence_annotations()
    assert _flagged(human) == [0, 2]
    assert marked[2].types == ["duplication"] and marked[2].questions == ["Why is this said again?"]
    assert human.to_result().score == pytest.approx(1 - 1 / 7)  # footnote 12: still one confusion

    # b nested in a lands inside a as well: it goes past a to the next place it is said
    nested = {**relation, "span_a": "rows in from the old harbour", "span_b": "old harbour"}
    # the same text said once, or two spans in different places, stay where they are
    once = {**relation, "span_a": "The storm ends.", "span_b": "The storm ends."}
    apart = {**relation, "span_a": "The harbour freezes.", "span_b": "Zed rows in"}
    # whitespace the summary does not have: the loose search finds both copies
    loose = {**relation, "span_a": "Mara  keeps\nthe lamp.", "span_b": "Mara keeps the\tlamp."}
    human = parse_human_annotations({"b": {"summary": REPEATING, "singles": [],
                                           "relations": [nested, once, apart, loose]}})["b"]
    assert [(r.a.sentences, r.b.sentences) for r in human.relations] == [
        ([1], [5]), ([3], [3]), ([6], [1]), ([0], [2])]
    assert human.unlocated == 0


def test_a_duplication_single_over_repeated_text_marks_a_later_copy():
    """A single labelled duplication asks why a passage is said again: the copy is where that
    confusion is, not the first mention. Several such singles of one text take the later copies in
    order, then the first. Other singles (an entity named again and again) stay on the first mention."""
    def single(span, labels=("duplication",)):
        return {"span": span, "questions": "Why again?", "labels": list(labels)}

    entry = {"summary": REPEATING, "relations": [], "singles": [
        single("Zed rows in from the old harbour."),
        single("Mara keeps the lamp."), single("Mara keeps the lamp."), single("Mara keeps the lamp."),
        single("Zed", ["entity omission"]),
        single("The storm ends."),  # said once
        single("Zed  rows in from\nthe old harbour."),  # loose, the second single of this text
    ]}
    human = parse_human_annotations({"b": entry})["b"]
    assert [s.sentences for s in human.singles] == [[5], [2], [4], [0], [1], [3], [1]]
    assert human.unlocated == 0
    assert human.sentence_annotations()[5].types == ["duplication"]


@pytest.mark.parametrize("data, pattern", [
    ({"b": {"summary": "", "singles": [], "relations": []}}, "non-empty string"),
    ({"b": {"summary": "A b.", "singles": {}, "relations": []}}, "must be lists"),
    ({"b": {"summary": "A b.", "singles": [{"questions": "q"}], "relations": []}}, "expected an object with 'span'"),
    ({"b": {"summary": "A b.", "singles": [], "relations": [{"span_a": "A"}]}}, "span_b"),
    # without either list the entry would read as a summary the humans found nothing in: all clean labels
    ({"b": {"summary": "A b."}}, "no 'singles' or 'relations': not human span annotations$"),
    ({"b": {"summary": "A b.", "annotations": []}}, "the shape of the precision-study file"),
])
def test_human_annotations_bad_shapes(data, pattern):
    with pytest.raises(BooklensError, match=pattern):
        parse_human_annotations(data)


def test_agreement_of_human_and_sentence_sets():
    human = results_from_json(human_data())
    gpt = results_from_json({"lighthouse": {"Zed appears at the door.": {"questions": "Who?",
                                                                         "types": ["entity omission"]},
                                            "Mara keeps the lighthouse with her father.": {
                                                "questions": "Which lighthouse?", "types": ["entity omission"]}}},
                            {"lighthouse": SUMMARY})
    report = agreement(gpt, human, name_a="gpt", name_b="human")
    c = report["confusing"]
    assert (c["tp"], c["fp"], c["fn"], c["tn"]) == (1, 1, 3, 1)
    assert c["precision"] == pytest.approx(0.5) and c["recall"] == pytest.approx(0.25)
    assert c["f1"] == pytest.approx(2 / 6)
    assert report["per_type"]["entity omission"]["tp"] == 1
    assert report["per_type"]["entity omission"]["fp"] == 1
    assert report["system_score_a"] == pytest.approx(4 / 6)
    assert report["system_score_b"] == pytest.approx(3 / 6)  # footnote score of the human set
    assert report["system_score_diff"] == pytest.approx(1 / 6)
    table = format_agreement(report)
    assert "| confusing |" in table and "entity omission" in table and "A - B 16.7 points" in table
    # a different summary under the same book name cannot be compared sentence by sentence
    other = results_from_json({"lighthouse": {}}, {"lighthouse": "A different text. Entirely."})
    with pytest.raises(BooklensError, match="different summary"):
        agreement(other, human)
    with pytest.raises(BooklensError, match="no book in common"):
        agreement(results_from_json({"x": {}}, {"x": "A b."}), human)


def test_confusion_match_metric():
    import dspy

    ex = dspy.Example(verdict="confusion", error_types=["entity omission", "causal omission"])
    assert confusion_match(ex, dspy.Prediction(verdict="no confusion", error_types=[])) == 0.0
    assert confusion_match(ex, dspy.Prediction(verdict="confusion", error_types=["entity omission"])) == 0.75
    no = dspy.Example(verdict="no confusion", error_types=[])
    assert confusion_match(no, dspy.Prediction(verdict="no confusion", error_types=[])) == 1.0


def test_split_by_book_is_deterministic_and_disjoint():
    items = [{"book": f"b{i % 10}", "i": i} for i in range(50)]
    one = split_by_book(items, "book", seed=3)
    two = split_by_book(list(reversed(items)), "book", seed=3)
    assert {k: {x["book"] for x in v} for k, v in one.items()} == {k: {x["book"] for x in v} for k, v in two.items()}
    books = [{x["book"] for x in v} for v in one.values()]
    assert sum(len(b) for b in books) == 10 and not (books[0] & books[1] or books[0] & books[2] or books[1] & books[2])
    assert [len(b) for b in books] == [4, 2, 4]
    lists = split_by_book(items, lambda x: x["book"], seed=3, fractions=[0.5, 0.5])
    assert len(lists) == 2 and sum(len(x) for x in lists) == 50
    assert set(books_in_split([f"b{i}" for i in range(10)], "test", seed=3)) == books[2]
    with pytest.raises(ValueError):
        split_by_book(items, "book", fractions=[0.5, 0.2])


def test_novel_trigrams_do_not_count_a_quote_or_dash_style_as_new_words():
    # The book's typography (curly quotes, Gutenberg's "--") and the summary's (straight quotes, an em
    # dash) differ in style only: a passage copied from the book is no novel wording.
    book = "\u201cYou do not depend on her,\u201d said Mrs. Bennet\u2019s sister--not unkindly--and left."
    copied = "\"You do not depend on her,\" said Mrs. Bennet's sister \u2014 not unkindly \u2014 and left."
    assert novel_trigram_pct(copied, book) == 0.0
    assert novel_trigram_pct(book, copied) == 0.0
    # Words still count as written: a changed word makes its three trigrams novel.
    changed = "\"You do not depend on him,\" said Mrs. Bennet's sister \u2014 not unkindly \u2014 and left."
    assert novel_trigram_pct(changed, book) == pytest.approx(100 * 3 / len(trigrams(changed)))
    assert repeated_trigram_pct("Ann\u2019s cat \u2014 Ann's cat --") == pytest.approx(100 * 1 / 4)


def test_a_set_of_summaries_carries_the_bootstrap_interval_of_its_mean_over_summaries():
    def result(flags):
        sentences = [SentenceAnnotation(index=i, sentence=f"s{i}", confusing=f) for i, f in enumerate(flags)]
        return finish_result(CoherenceResult(summary="x", sentences=sentences), stats=False)

    # Two summaries scoring 50 and 100: a resample holds one twice or both, so the mean's 95%
    # interval runs from 50 to 100.
    two = build_set({"a": result([True, False]), "b": result([False, False])})
    assert two.system_score == pytest.approx(0.75)
    assert two.system_score_ci95 == pytest.approx([0.5, 1.0])
    # One summary, or none scored, gives no interval (each resample repeats it).
    assert build_set({"a": result([True, False])}).system_score_ci95 is None
    unjudged = SentenceAnnotation(index=0, sentence="s", confusing=None, status="failed", error="x")
    none_scored = finish_result(CoherenceResult(summary="x", sentences=[unjudged]), stats=False)
    assert build_set({"a": result([True, False]), "b": none_scored}).system_score_ci95 is None


def test_trigrams_of_chinese_and_japanese_text_are_taken_over_characters():
    # No spaces separate their words: read as \w runs, a clause was one "word", and a summary
    # that reuses half of a book's clause shared no trigram with it.
    book = "玛拉和父亲住在灯塔里。冬天的一个夜晚，泽德来到门口。"
    assert trigrams("泽德来到") == [("泽", "德", "来"), ("德", "来", "到")]
    assert novel_trigram_pct("泽德来到门口。", book) == 0.0
    assert novel_trigram_pct("泽德来到灯塔。", book) == pytest.approx(100 * 3 / 5)
    assert repeated_trigram_pct("灯塔灯塔灯塔") == pytest.approx(100 * 2 / 4)
    assert trigrams("Zoë sees 灯塔 now") == [("Zoë", "sees", "灯"), ("sees", "灯", "塔"), ("灯", "塔", "now")]


def test_a_span_not_in_its_summary_is_left_out_of_every_figure_as_its_note_says():
    summary = "Mara keeps the lamp. Zed comes. The ship lands. The end comes."
    data = {"b": {"summary": summary, "singles": [
        {"span": "Zed", "questions": "Who is Zed?", "labels": ["entity omission"]},
        {"span": "Bob", "questions": "Who is Bob?", "labels": ["salience"]}],  # in no sentence
        "relations": [
            {"span_a": "Kim", "span_b": "Lee", "shared_questions": "q", "shared_labels": ["inconsistency"]},
            {"span_a": "The ship lands", "span_b": "Ann", "shared_questions": "q", "shared_labels": ["discontinuity"]}]}}
    human = parse_human_annotations(data)
    result = human_results(human)["b"]
    # Placed: the single on "Zed" and the relation with one span found; 2 of 4 sentences.
    assert result.n_annotations == 2
    assert result.score == pytest.approx(1 - 2 / 4)
    assert result.annotation_types == [["entity omission"], ["discontinuity"]]
    assert human_match_notes(human).ignored == 4  # Bob, Kim, Lee, Ann
