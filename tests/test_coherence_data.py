"""The released BooookScore annotations: Table 2 and the human-annotation scores reproduce.

Needs `../shared/data/booookscore` (skipped with a reason when absent).
"""

from __future__ import annotations

from pathlib import Path

import booklens  # noqa: F401
import pytest

from booklens.data import booookscore as bs
from booklens.errors import BooklensError
from booklens.judges import COHERENCE_REFERENCE_KAPPA
from booklens.metrics.booookscore import build_set
from booklens.records import read_json_file

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "booookscore"

pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"BooookScore data not found at {DATA}")


@pytest.fixture(scope="module")
def gpt4_sets():
    return {config: bs.load_gpt4_config(config, DATA, stats=False) for config in bs.GPT4_CONFIGS}


@pytest.fixture(scope="module")
def human_sets():
    return {config: bs.load_human_config(config, DATA, stats=False) for config in bs.HUMAN_CONFIGS}


@pytest.mark.parametrize("config", [c for c in bs.GPT4_CONFIGS if not c.startswith("chatgpt")])
def test_table2_booookscore_within_0_6_points(gpt4_sets, config):
    results, notes = gpt4_sets[config]
    assert len(results) == 100  # every summary counts, annotated or not
    system = build_set(results)
    assert abs(100 * system.system_score - bs.PAPER_TABLE2[config]) <= 0.6, (config, system.system_score)
    assert notes == []  # every annotated sentence is one of our sentences: the splitter agrees with NLTK


def test_table2_chatgpt_difference_is_the_known_one(gpt4_sets):
    # The released ChatGPT annotations partly refer to sentences of uncleaned summaries
    # (9 and 21 annotated sentences are not in the cleaned summaries), so the scores differ.
    hier, hier_notes = gpt4_sets["chatgpt-2048-hier"]
    inc, inc_notes = gpt4_sets["chatgpt-2048-inc"]
    assert 100 * build_set(hier).system_score == pytest.approx(84.82, abs=0.005)
    assert 100 * build_set(inc).system_score == pytest.approx(68.89, abs=0.005)
    assert len(hier_notes) == 9 and len(inc_notes) == 21


def test_human_scores_follow_footnote_12(human_sets):
    inc = build_set(human_sets["gpt4-4096-inc"])
    hier = build_set(human_sets["gpt4-4096-hier"])
    assert 100 * inc.system_score == pytest.approx(bs.PAPER_HUMAN["gpt4-4096-inc"], abs=0.1)
    assert 100 * hier.system_score == pytest.approx(bs.PAPER_HUMAN["gpt4-4096-hier"], abs=0.1)
    # counting every sentence a span touches instead is stricter (both copies of a repeated passage count)
    assert 100 * inc.system_score_sentences == pytest.approx(79.01, abs=0.05)
    assert 100 * hier.system_score_sentences == pytest.approx(86.40, abs=0.05)
    assert inc.n_sentences == 4660 and hier.n_sentences == 3396
    # annotations: 840 (inc) and 353 (hier), as in Section 3
    assert sum(r.n_annotations for r in human_sets["gpt4-4096-inc"].values()) == 840
    assert sum(r.n_annotations for r in human_sets["gpt4-4096-hier"].values()) == 353


def test_table1_error_rates_per_sentence(human_sets):
    table1 = {  # inc / hier, % errors per sentence
        "entity omission": (7.3, 3.71), "event omission": (4.25, 2.27), "causal omission": (2.75, 1.21),
        "discontinuity": (2.23, 1.56), "salience": (1.42, 1.03), "language": (0.82, 0.71),
        "inconsistency": (0.97, 1.03), "duplication": (2.12, 1.18),
    }
    inc = build_set(human_sets["gpt4-4096-inc"]).error_type_rates
    hier = build_set(human_sets["gpt4-4096-hier"]).error_type_rates
    for t, (i, h) in table1.items():
        assert inc[t] == pytest.approx(i, abs=0.01), t
        assert hier[t] == pytest.approx(h, abs=0.01), t


def test_every_human_span_is_located(human_sets):
    for results in human_sets.values():
        assert all(not r.notes for r in results.values())


def test_repeated_passages_are_marked_on_their_copies():
    """The human files give spans as text. A relation linking a passage to its copy (the same text twice),
    or a b span that would land on span a, goes to the next place after a; a single labelled
    duplication over a repeated text goes to a later copy. Every other span stays on the first place of
    its text, as `_locate` finds it."""
    counts = {}
    for config in bs.HUMAN_CONFIGS:
        raw = read_json_file(DATA / "human" / f"summary-{config}.json", "file")
        moved_b = same_text = same_text_repeated = moved_singles = 0
        newly = cleared = confusing = 0
        for book, a in bs.load_human_annotations(DATA / "human" / f"summary-{config}.json").items():
            offsets = bs.sentence_offsets(a.summary, a.sentences)

            def first(span):
                found = bs._locate(a.summary, span.span)
                return bs._covered(offsets, *found)

            before: set[int] = set()
            for single, given in zip(a.singles, raw[book]["singles"]):
                before.update(first(single))
                if single.sentences != first(single):
                    assert "duplication" in single.labels and a.summary.count(given["span"]) > 1
                    moved_singles += 1
            for r, given in zip(a.relations, raw[book]["relations"]):
                assert r.a.sentences == first(r.a)
                before.update(first(r.a) + first(r.b))
                same_text += given["span_a"] == given["span_b"]
                same_text_repeated += given["span_a"] == given["span_b"] and a.summary.count(given["span_a"]) > 1
                if (r.b.start, r.b.end) != bs._locate(a.summary, r.b.span):
                    assert r.b.start >= r.a.end and bs._locate(a.summary, r.b.span)[0] < r.a.end
                    moved_b += 1
            after = {s.index for s in a.sentence_annotations() if s.confusing}
            newly += len(after - before)
            cleared += len(before - after)
            confusing += len(after)
        counts[config] = (same_text, same_text_repeated, moved_b, moved_singles, newly, cleared, confusing)
    # inc: 17 of 177 relations give one text twice, 16 of them a text said more than once; with the 10
    # whose b would land on a and is said again, 26 b spans move. Three duplication singles move (two in
    # camp-zero, the first of central-places' two identical singles; the second stays on the first copy).
    # 22 sentences become confusing; one becomes clean: camp-zero's first copy of "With the revelation of
    # White Alice ...", whose single asks why it is mentioned "here again".
    assert counts["gpt4-4096-inc"] == (17, 16, 26, 3, 22, 1, 984)
    assert counts["gpt4-4096-hier"] == (4, 4, 5, 0, 4, 0, 453)


def test_examples_split_by_book(human_sets):
    results = human_sets["gpt4-4096-inc"]
    splits = bs.split_examples(results)
    assert set(splits) == {"train", "dev", "test"}
    books = {name: {ex.book for ex in exs} for name, exs in splits.items()}
    assert [len(books[n]) for n in ("train", "dev", "test")] == [40, 20, 40]
    assert not (books["train"] & books["test"] or books["dev"] & books["test"] or books["train"] & books["dev"])
    assert sum(len(v) for v in splits.values()) == 4660
    ex = splits["test"][0]
    assert set(ex.inputs().keys()) == {"summary", "sentence"}
    assert ex.verdict in ("confusion", "no confusion") and isinstance(ex.error_types, list)
    assert ex.sentence in ex.summary
    # the same books are in the same split for the other configuration and the GPT-4 sets (same 100 books)
    hier_books = {n: {ex.book for ex in exs} for n, exs in bs.split_examples(human_sets["gpt4-4096-hier"]).items()}
    assert hier_books == books
    again = bs.split_results(results)
    assert {n: set(v) for n, v in again.items()} == books


def test_wrong_shape_of_a_real_file_is_reported(tmp_path):
    from booklens.errors import BooklensError

    with pytest.raises(BooklensError, match="not in the summaries"):
        bs.load_sentence_annotations(DATA / "gpt4" / "gpt4-2048-hier.json",
                                     _write(tmp_path / "s.json", '{"other-book.epub": "A b."}'))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_gpt4_against_humans_on_the_same_summaries(human_sets):
    """The precision-study file carries GPT-4's sentence annotations of 88 of the 100 incremental
    summaries the humans annotated: the reference point for any annotator's agreement."""
    from booklens.metrics.agreement import agreement

    gpt4, notes = bs.parse_validation_study(
        read_json_file(DATA / "human" / "annotations-gpt4-4096-inc.json", "file"), stats=False)
    assert len(gpt4) == 88 and notes == []
    # 672: a flagged sentence said twice in a summary is confusing at both copies (3 such copies)
    assert sum(r.n_confusing for r in gpt4.values()) == 672
    report = agreement(gpt4, human_sets["gpt4-4096-inc"], name_a="gpt4", name_b="human")
    assert report["books"] == 88 and report["only_in_b"] == 12
    c = report["confusing"]
    assert c["precision"] == pytest.approx(0.348, abs=0.002)
    assert c["recall"] == pytest.approx(0.259, abs=0.002)
    assert c["kappa"] == pytest.approx(0.134, abs=0.002)
    # the bar a judge's calibration is held to is this figure, as stored (four decimals), not a
    # rounder one: a judge between the two would be below GPT-4 and not told so
    assert round(c["kappa"], 4) == COHERENCE_REFERENCE_KAPPA


@pytest.mark.parametrize("data, problem", [
    ({"kind": "booklens.coherence_set", "results": {"a": {"summary": 3}}},
     "coherence set: results.a.summary: Input should be a valid string (got 3)"),
    ({"kind": "booklens.coherence", "n_sentences": 2}, "coherence result: missing field 'summary'"),
])
def test_an_invalid_score_file_is_one_line_naming_its_first_problem(data, problem):
    with pytest.raises(BooklensError) as excinfo:
        bs.results_from_json(data, what="scores.json")
    message = str(excinfo.value)
    assert message == f"scores.json is not a valid booklens {problem}" and "\n" not in message


def test_a_copy_of_a_human_annotation_file_in_the_folder_is_refused(tmp_path):
    """Two files holding the same summary of a book (a copy left beside the original) would count
    every summary twice in a calibration: twice the sentences and narrower intervals than the data
    give. inc and hier summaries of one book differ and both count."""
    import json

    summary = "Ann sails. Ben waits."
    data = {"b": {"summary": summary, "singles": [], "relations": []}}
    (tmp_path / "summary-gpt4-4096-hier.json").write_text(json.dumps(data))
    (tmp_path / "summary-gpt4-4096-inc.json").write_text(
        json.dumps({"b": {"summary": "Ann sails away. Ben waits at home.", "singles": [], "relations": []}}))
    assert len(bs.load_human_summaries(tmp_path)) == 2
    (tmp_path / "summary-gpt4-4096-hier-copy.json").write_text(json.dumps(data))
    with pytest.raises(BooklensError, match=r"the summary of book 'b' is in both summary-gpt4-4096-hier-copy.json "
                                            r"and summary-gpt4-4096-hier.json") as caught:
        bs.load_human_summaries(tmp_path)
    assert "\n" not in str(caught.value)


def test_score_annotations_is_the_library_call_of_score_annotations(tmp_path, shared_dir):
    """`booklens score --annotations` as a library call, on BooookScore's human annotations: the test
    split's books are those `select_books` draws, in order, and the set is the humans'."""
    from booklens.data.booookscore import load_human_annotations, score_annotations
    from booklens.data.splits import books_in_split, select_books

    path = shared_dir / "data" / "booookscore" / "human" / "summary-gpt4-4096-inc.json"
    books = list(load_human_annotations(path))
    test = select_books(books, "test")
    assert test == sorted(books_in_split(books, "test")) and 0 < len(test) < len(books)
    record, gist = score_annotations(path, split="test")
    assert record.annotator == "human" and list(record.results) == test
    assert list(score_annotations(path, limit=2)[0].results) == sorted(books)[:2]
    assert select_books(["b", "a", "c"]) == ["b", "a", "c"]  # neither given: the order as given
