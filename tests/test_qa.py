"""NovelQA: loader, context routing (whole book vs retrieval vs closed-book), answer checks,
the generative judge, and the accuracy / position / evidence metrics. Scripted LM only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from booklens.data.novelqa import QAPrediction, check_setting, load_questions, parse_questions
from booklens.errors import BooklensError
from booklens.lm import configure
from booklens.metrics.qa import (
    accuracy,
    accuracy_by_position,
    accuracy_by_type,
    evidence_recall,
    format_report,
    format_type_table,
    qa_report,
)
from booklens.programs.qa import AnswerJudge, BookQA, EvidenceJudge, answer_questions
from booklens.qa_runs import run_book_qa
from booklens.testing import ScriptedLM

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "qa"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))


def make_book(n_paragraphs: int = 120) -> str:
    """A synthetic book: filler paragraphs with one paragraph that answers the test question."""
    filler = ("The rain fell on the quiet village and the clerk counted the barrels in the cellar again. "
              "Nobody spoke of the harvest, and the lamps were lit early in every house along the lane.")
    paragraphs = [f"Chapter {i // 10 + 1}. {filler}" for i in range(n_paragraphs)]
    paragraphs[n_paragraphs // 2] = ("Captain Orrin Vell sailed the lighthouse tender Marigold to the island of "
                                     "Pellmark every Thursday to deliver the lamp oil.")
    return "\n\n".join(paragraphs)


QUESTION = {
    "QID": "T-1", "Question": "Which ship did Captain Orrin Vell sail to Pellmark?",
    "Options": {"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"},
    "Answer": "The Marigold", "Gold": "B",
    "Evidences": ["Captain Orrin Vell sailed the lighthouse tender Marigold to the island of Pellmark"],
    "Aspect": "plot", "Complexity": "sh",
}


def scripted(responder, window=8192):
    lm = ScriptedLM(responder, context_window=window)
    configure(lm)
    return lm


# ---------------------------------------------------------------------------
# loader


def test_team_question_files_load_and_cover_the_types():
    files = sorted(EXAMPLES.glob("*.json"))
    assert len(files) >= 3
    questions = [q for f in files for q in load_questions(f)]
    assert len(questions) >= 40
    assert {q.complexity for q in questions} == {"mh", "sh", "dtl"}
    assert len({q.aspect for q in questions}) == 7
    for q in questions:
        check_setting([q], "mc")
        assert q.gold in q.options and q.answer and q.evidences


@pytest.mark.parametrize("payload, message", [
    ({"not": "a list"}, "expected a JSON list"),
    ([], "empty"),
    (["just a string"], "question 1 is str"),
    ([{k: v for k, v in QUESTION.items() if k != "Question"}], "missing field 'Question'"),
    ([{**QUESTION, "Aspect": "weather"}], "Aspect must be one of"),
    ([{**QUESTION, "Complexity": "hard"}], "Complexity must be one of"),
    ([{**QUESTION, "Gold": "E"}], "not one of the options"),
    ([QUESTION, QUESTION], "duplicate QID"),
    # the same QID with a space after it: two answers under one QID, once its spaces are read past
    ([QUESTION, {**QUESTION, "QID": "T-1 "}], "question 2 (T-1 ): duplicate QID T-1"),
    ([{**QUESTION, "QID": True}], "QID: must be text or a number, not true"),
    ([{**QUESTION, "Question": "   "}], "Question: must not be blank"),
    ([{**QUESTION, "Gold": True}], "Gold: true is not an option letter"),  # not read as index 1 (B)
    ([{**QUESTION, "Options": {"a": "x", "A": "y", "B": "z"}}], "option keys 'a' and 'A' are the same letter A"),
    ([{**QUESTION, "Options": {"A": "", "B": " ", "C": "", "D": ""}}], "Options: every option is blank"),
    ([{**QUESTION, "Options": ["", " "], "Gold": 0}], "Options: every option is blank"),
    # the value as written in the file, not the letter it would map to ('H', '@')
    ([{**QUESTION, "Gold": 7}], "Gold: 7 is not the index of an option (0 to 3)"),
    ([{**QUESTION, "Gold": -1}], "Gold: -1 is not the index of an option (0 to 3)"),
    ([{**QUESTION, "Gold": " e "}], "Gold: ' e ' is not one of the options A, B, C, D"),
    # a fifth option: the answer field takes A-D, so a right answer E would be refused as unparseable
    ([{**QUESTION, "Options": {**QUESTION["Options"], "E": "None of them"}, "Gold": "E"}],
     "Options: options are A-D (NovelQA's four choices), got E"),
    ([{**QUESTION, "QID": " "}], "QID: must not be blank"),
])
def test_wrong_shapes_are_one_line_errors(payload, message):
    with pytest.raises(BooklensError) as err:
        parse_questions(payload, source="q.json")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options, problem", [
    ({"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": ""}, "option D is blank"),
    ({"A": "The Heron", "B": " \t", "C": "The Swift", "D": "The Lantern"}, "option B is blank"),
    (["The Heron", "The Marigold", "", "The Lantern"], "option C is blank"),
    ({"A": "The Heron", "B": "The Marigold", "C": "the  MARIGOLD ", "D": "The Lantern"},
     "options B and C have the same text 'the  MARIGOLD'"),
])
def test_options_a_reader_cannot_tell_apart_are_refused_when_the_file_is_loaded(tmp_path, options, problem):
    """A blank option or two options with one text (whatever their case and spacing) leave the answer
    unscorable: the file is refused, naming the file and the question."""
    path = tmp_path / "q.json"
    path.write_text(json.dumps([{**QUESTION, "QID": "T-0"}, {**QUESTION, "Options": options}]), encoding="utf-8")
    with pytest.raises(BooklensError) as err:
        load_questions(path)
    assert str(err.value) == f"{path}: question 2 (T-1): Options: {problem}"


@pytest.mark.parametrize("gold, line", [
    ("E", "q.json: question 1 (T-1): Gold: 'E' is not one of the options A, B, C, D"),
    (7, "q.json: question 1 (T-1): Gold: 7 is not the index of an option (0 to 3)"),
])
def test_a_gold_the_options_lack_is_quoted_once(gold, line):
    """The error line quoted the file's value, then again as '(got 'E')'."""
    with pytest.raises(BooklensError) as err:
        parse_questions([{**QUESTION, "Gold": gold}], source="q.json")
    assert str(err.value) == line


def test_variants_are_normalized():
    q = parse_questions([{**QUESTION, "Options": ["w", "x", "y", "z"], "Aspect": "chara", "Complexity": "detail",
                          "Evidences": "one quote", "Gold": 1}])[0]
    assert q.options == {"A": "w", "B": "x", "C": "y", "D": "z"}
    assert (q.aspect, q.complexity, q.evidences, q.gold) == ("character", "dtl", ["one quote"], "B")


def test_mc_needs_options_gen_does_not():
    qs = parse_questions([{k: v for k, v in QUESTION.items() if k not in ("Options", "Gold")}])
    with pytest.raises(BooklensError, match="no Options"):
        check_setting(qs, "mc")
    check_setting(qs, "gen")


def test_a_question_with_a_single_option_is_not_said_to_have_none():
    qs = parse_questions([{**QUESTION, "Options": {"A": "The Marigold"}, "Gold": "A"}])
    with pytest.raises(BooklensError) as err:
        check_setting(qs, "mc", source="q.json")
    assert str(err.value) == ("q.json: question T-1 has one option (A); the multiple-choice setting (--setting mc) "
                              "needs two or more (use --setting gen for free-text answers)")


# ---------------------------------------------------------------------------
# routing by context size


def test_whole_book_when_it_fits_retrieval_when_it_does_not():
    book = make_book()
    q = parse_questions([QUESTION])
    seen = []

    def responder(call):
        seen.append(call.inputs["context"])
        return {"answer": "B"}

    scripted(responder, window=32768)
    big = answer_questions(BookQA("mc", "book"), book, q)[0]
    assert big.context_mode == "whole-book"
    assert seen[-1] == book.strip() or book.strip() in seen[-1]
    assert big.correct is True and big.gold_evidence_in_context == 1.0

    scripted(responder, window=2048)
    small = answer_questions(BookQA("mc", "book"), book, q)[0]
    assert small.context_mode == "retrieval"
    assert len(seen[-1]) < len(book) // 2
    assert "Marigold" in seen[-1]  # the ranked stretch holds the answer
    assert small.gold_evidence_in_context == 1.0 and small.passages

    # the same small window with top-k retrieval: k passages, the relevant one among them
    scripted(responder, window=2048)
    top = answer_questions(BookQA("mc", "bm25", k=2, passage_tokens=64), book, q)[0]
    assert top.context_mode == "retrieval" and len(top.passages) <= 2
    assert "Marigold" in seen[-1]


def test_questions_may_come_from_a_generator():
    """A notebook's `(q for q in questions if ...)` was read once to locate the gold evidence and
    found empty when the questions were asked: no answer, no error."""
    asked = []
    scripted(lambda call: asked.append(call.inputs["question"]) or {"answer": "B"}, window=32768)
    questions = parse_questions([{**QUESTION, "QID": f"G-{n}"} for n in range(3)])
    records = answer_questions(BookQA("mc", "book"), make_book(), (q for q in questions))
    assert [r.qid for r in records] == ["G-0", "G-1", "G-2"] and len(asked) == 3
    assert all(r.correct for r in records)


@pytest.mark.parametrize("evidence, rank_mode, window", [("dense", "bm25", 8192), ("hybrid", "bm25", 8192),
                                                         ("book", "hybrid", 2048)])
def test_the_book_is_embedded_before_the_questions_are_shared_out(monkeypatch, evidence, rank_mode, window):
    """The first question's worker embedded the book (some 100 s for a novel) while the others
    waited, and Ctrl-C then waited for that embedding to end, since the calls in flight end
    first. Like verify, qa now builds the index in the calling thread, where Ctrl-C stops it."""
    import threading

    import booklens.retrieval.index as retrieval

    embedded_in = []

    def fake_embed(texts, batch_size=32):
        import numpy as np

        if len(texts) > 1:  # the book's windows, not a query
            embedded_in.append(threading.current_thread() is threading.main_thread())
        vectors = np.ones((len(texts), 8), dtype="float32")
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    monkeypatch.setattr(retrieval, "embed", fake_embed)
    scripted(lambda call: {"answer": "B"}, window=window)
    questions = parse_questions([{**QUESTION, "QID": f"T-{n}"} for n in range(4)])
    records = answer_questions(BookQA("mc", evidence, k=2, rank_mode=rank_mode), make_book(), questions,
                               concurrency=4)
    assert all(r.context_mode == "retrieval" and r.correct for r in records)
    assert embedded_in == [True]


def test_a_retrieved_passage_larger_than_the_budget_is_cut_to_fit_not_dropped():
    from booklens.text import count_tokens

    book = make_book(400)
    seen = []
    scripted(lambda call: seen.append(call.inputs["context"]) or {"answer": "B"}, window=1024)
    program = BookQA("mc", "bm25", k=2, passage_tokens=4096)
    budget = program.context_budget(QUESTION["Question"], "A. x\nB. y")
    record = answer_questions(program, book, parse_questions([QUESTION]))[0]
    assert record.context_mode == "retrieval" and len(record.passages) == 1
    assert 0 < count_tokens(seen[-1]) <= budget
    piece = record.passages[0]
    assert book[piece["start"]:piece["end"]] == seen[-1]  # the offsets name the piece that was read


@pytest.mark.parametrize("evidence", ["bm25", "book"])
def test_retrieved_passages_with_the_marks_between_them_fit_the_budget(evidence):
    """The passages were fitted by their own tokens, not by the text the model reads: the blank
    lines and '[...]' marks between them went over the budget (here by 93 tokens; by 34 for k = 40
    on Pride and Prejudice in an 8K window)."""
    from booklens.text import count_tokens

    lines = [f'The clerk of house {i} asked, "Did Captain Orrin Vell take the Marigold to Pellmark today?"'
             if i % 3 == 0 else f'"Nobody in lane {i} spoke of the harvest," the widow said, "and the lamps were lit early."'
             for i in range(300)]
    seen = []
    scripted(lambda call: seen.append(call.inputs["context"]) or {"answer": "B"}, window=2048)
    program = BookQA("mc", evidence, k=60, passage_tokens=32)
    question = parse_questions([QUESTION])[0]
    budget = program.context_budget(question.question, question.options_text())
    record = answer_questions(program, "\n\n".join(lines), [question])[0]
    assert record.context_mode == "retrieval" and len(record.passages) > 30
    assert count_tokens(seen[-1]) <= budget == 1201
    assert record.context_tokens == count_tokens(seen[-1])  # what the model read, marks and all
    if evidence == "bm25":
        assert record.passages_dropped == 60 - len(record.passages)

def test_context_budget_respects_the_window():
    from booklens.text import count_tokens

    book = make_book(400)
    seen = []
    scripted(lambda call: seen.append(call.inputs["context"]) or {"answer": "B"}, window=3000)
    answer_questions(BookQA("mc", "book"), book, parse_questions([QUESTION]))
    assert count_tokens(seen[-1]) < 3000 * 0.8


@pytest.mark.parametrize("evidence", ["none", "given", "bm25", "book"])
def test_a_question_whose_prompt_cannot_fit_the_window_is_refused_by_name_before_any_call(evidence):
    """One question whose options alone outgrow the window stopped the run after the questions before
    it had been asked, with a line naming no question; closed-book, its prompt went to the model whole."""
    long = {**QUESTION, "QID": "T-2", "Options": {**QUESTION["Options"], "A": "the heron and the gull " * 2000}}
    questions = parse_questions([QUESTION, long, {**QUESTION, "QID": "T-3"}])
    lm = scripted(lambda call: {"answer": "B"})
    fits = "do not fit" if evidence == "none" else "leave no room for the book in"
    with pytest.raises(BooklensError, match=rf"^question T-2: the prompt \(\d+ tokens with its options\) and its "
                                            rf"answer \(48\) {fits} the 6553 tokens of the 8192-token context window "
                                            r"a prompt may fill$"):
        answer_questions(BookQA("mc", evidence), make_book(), questions, concurrency=1)
    assert len(lm.backend.calls) == 0
    # a prompt that fits, closed-book, is asked as before
    assert answer_questions(BookQA("mc", evidence), make_book(), questions[:1])[0].correct is True


def test_closed_book_and_given_evidence():
    book = make_book()
    q = parse_questions([QUESTION])
    calls = []
    lm = scripted(lambda call: calls.append(call) or {"answer": "B"})
    closed = answer_questions(BookQA("mc", "none"), book, q, book_title="The Lamp")[0]
    assert closed.context_mode == "closed-book" and closed.context_tokens == 0
    assert "context" not in calls[-1].inputs and calls[-1].inputs["book_title"] == "The Lamp"
    given = answer_questions(BookQA("mc", "given"), book, q)[0]
    assert given.context_mode == "given"
    assert calls[-1].inputs["context"] == QUESTION["Evidences"][0]
    assert len(lm.backend.calls) == 2
    # no annotated evidence: the question is asked, and counted, closed-book, not "given" an empty context
    bare = answer_questions(BookQA("mc", "given"), book, parse_questions([{**QUESTION, "Evidences": []}]),
                            book_title="The Lamp")[0]
    assert bare.context_mode == "closed-book" and "context" not in calls[-1].inputs


def test_given_evidence_cut_to_fit_counts_only_what_was_shown():
    """Given evidence longer than the window is cut: the evidence cut off was not in the context,
    and the record says so (it said 100% whenever any evidence was given)."""
    book = make_book()
    paragraphs = book.split("\n\n")
    long_quote = "\n\n".join(paragraphs[:30])  # about 1,230 tokens, more than the 2K window leaves
    q = parse_questions([{**QUESTION, "Evidences": [long_quote, QUESTION["Evidences"][0]]}])
    calls = []
    scripted(lambda call: calls.append(call) or {"answer": "B"}, window=2048)
    cut = answer_questions(BookQA("mc", "given"), book, q)[0]
    assert cut.context_mode == "given" and cut.gold_evidence_located == 2
    assert QUESTION["Evidences"][0] not in calls[-1].inputs["context"]
    assert cut.gold_evidence_in_context == 0.5  # the long quote, nearly whole; not the short one after it
    scripted(lambda call: {"answer": "B"}, window=8192)
    whole = answer_questions(BookQA("mc", "given"), book, q)[0]
    assert whole.gold_evidence_in_context == 1.0


@pytest.mark.parametrize("field, value", [("Gold", "x" * 5000), ("Aspect", "x" * 5000),
                                          ("Options", {"A" * 5000: "x", "B": "y"}), ("QID", "q" * 5000)])
def test_a_long_value_in_the_question_file_is_quoted_short_in_its_error_line(field, value):
    """A passage pasted where a letter goes was quoted whole: an error line of 5,000 characters."""
    payload = [{**QUESTION, field: value}]
    if field == "QID":  # a long QID is fine; its question's own error names it
        payload = [{**QUESTION, "QID": value, "Gold": "E"}, {**QUESTION, "QID": value}]
    with pytest.raises(BooklensError) as caught:
        parse_questions(payload, source="q.json")
    assert len(str(caught.value)) < 300, str(caught.value)


def test_a_question_keyed_by_one_qid_carrying_another_is_refused():
    """{"Q1": {"QID": "Q2", ...}}: which one is meant is a guess (the entry's won, silently)."""
    entry = {k: v for k, v in QUESTION.items() if k != "QID"}
    with pytest.raises(BooklensError, match="question Q1 carries another QID, 'Q2'"):
        parse_questions({"Q1": {**entry, "QID": "Q2"}})
    assert [q.qid for q in parse_questions({"Q1": {**entry, "QID": "Q1"}, "Q2": entry})] == ["Q1", "Q2"]


def test_options_written_as_numbers_are_their_text():
    """"A": 1862 (a year, a count) is the option "1862", as a list or keyed by letter; true or
    null is still refused."""
    keyed = parse_questions([{**QUESTION, "Options": {"A": 1862, "B": 1863.0, "C": 2.5, "D": "never"},
                              "Gold": "A"}])[0]
    assert keyed.options == {"A": "1862", "B": "1863", "C": "2.5", "D": "never"}
    listed = parse_questions([{**QUESTION, "Options": [3, 4, 5, 6], "Gold": "B"}])[0]
    assert listed.options == {"A": "3", "B": "4", "C": "5", "D": "6"}
    for bad in ({"A": True, "B": "x"}, [None, "x"]):
        with pytest.raises(BooklensError, match="must be text"):
            parse_questions([{**QUESTION, "Options": bad, "Gold": "B"}])


def test_a_reference_answer_written_as_a_number_is_its_text():
    """"Answer": 7 (a count, as the times questions ask for) is the answer "7", as an option
    written as a number is its text: it refused the whole file, in the mc setting too, where the
    answer is not even read."""
    counted, year = parse_questions([{**QUESTION, "QID": "T-7", "Answer": 7},
                                     {**QUESTION, "QID": "T-8", "Answer": 1862.0}])
    assert (counted.answer, year.answer) == ("7", "1862")
    for bad in (True, [7]):
        with pytest.raises(BooklensError, match="Answer: "):
            parse_questions([{**QUESTION, "Answer": bad}])


def test_letters_outside_the_options_are_reasked_then_recorded_as_failures():
    three = {**QUESTION, "Options": {"A": "x", "B": "The Marigold", "C": "y"}}
    q = parse_questions([three])
    lm = scripted(lambda call: {"answer": "D"})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert rec.prediction is None and rec.correct is False
    assert "not one of the options" in rec.error and rec.attempts == 3
    assert len(lm.backend.calls) == 3

    lm = scripted(lambda call: {"answer": "D"} if call.attempt == 0 else {"answer": "B"})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert rec.prediction == "B" and rec.correct is True and rec.attempts == 2


@pytest.mark.parametrize("written", ["b", " B ", "(b)", "B.", "**B**", "\u201cB\u201d", "\u2018B\u2019", "__B__", "_B_"])
def test_an_option_letter_written_another_way_is_read_as_that_letter(written):
    """Without the answer schema enforced, a model may write the right letter in lower case or with
    brackets: read as the letter it names, not re-asked until the question is counted wrong."""
    q = parse_questions([QUESTION])
    lm = scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts, rec.error) == ("B", True, 1, None)
    assert len(lm.backend.calls) == 1


@pytest.mark.parametrize("written", ["B. The Marigold", "B) The Marigold", "(B) The Marigold", "B: The Marigold",
                                     "**B.** The Marigold", "B - The Marigold", "The answer is B", "The answer is (B).",
                                     "Answer: B", "Option B", "option b", "The correct answer is B. The Marigold",
                                     "B. Henry V.", "B. Plan B", "**Answer:** B", "**Answer**: (B) The Marigold",
                                     "*Answer:* B.", "**Answer:** **B**", "\u201cB. The Marigold\u201d",
                                     "Answer: \u201cB\u201d", "The answer is 'B'.", "the answer is 'b'"])
def test_an_option_letter_given_with_its_text_or_in_a_phrase_is_read_as_that_letter(written):
    """A chat model without its schema enforced often writes the letter with the option's text or in a
    phrase; each re-ask gets the same, so the question ended counted wrong after three calls."""
    q = parse_questions([QUESTION])
    lm = scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts, rec.error) == ("B", True, 1, None)
    assert len(lm.backend.calls) == 1


@pytest.mark.parametrize("written", ["A, B", "A or B", "AB", "The Osprey", "A ship", "the answer is a ship",
                                     "B. or C.", "Not B", "**Answer:** B or C", "**Answer:** a ship",
                                     "the answer is 'a' ship", "Answer: \u201cB\u201d or \u201cC\u201d"])
def test_an_answer_naming_no_single_letter_is_still_refused(written):
    q = parse_questions([QUESTION])
    scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts) == (None, False, 3)


@pytest.mark.parametrize("evidence, quote", [("book", False), ("none", False), ("book", True)])
@pytest.mark.parametrize("written", ["The Marigold", "the marigold.", "**The Marigold**", '"The Marigold"',
                                     "  THE  MARIGOLD  ", "The Marigold.", "\u201cThe Marigold\u201d",
                                     "\u2018The Marigold.\u2019", "__The Marigold__"])
def test_an_answer_written_as_one_options_text_is_read_as_its_letter(written, evidence, quote):
    """A model without its schema enforced may answer with the option's text alone ("The Marigold" for
    option B): the same on every re-ask, so the question ended counted wrong after three calls."""
    q = parse_questions([QUESTION])
    lm = scripted(lambda call: {"evidence": ["Captain Orrin Vell sailed"], "answer": written} if call.wants("evidence")
                  else {"answer": written})
    rec = answer_questions(BookQA("mc", evidence, quote_evidence=quote), make_book(20), q, evidence_recall="overlap")[0]
    assert (rec.prediction, rec.correct, rec.attempts, rec.error) == ("B", True, 1, None)
    assert len(lm.backend.calls) == 1


@pytest.mark.parametrize("option, written", [
    ("E\u0301lodie Ferrand", "\u00c9lodie Ferrand"),   # the file's accent a combining mark, the model's one letter
    ("\u00c9lodie Ferrand", "E\u0301lodie Ferrand"),   # and the other way round
    ("The Marigold", "\uff22"),                         # a full-width B, as models write it among CJK text
])
def test_an_answer_is_read_whatever_the_composing_of_its_letters(option, written):
    """The same text composed another way (NFC against NFD) or in full-width letters was no option's
    text and no letter: re-asked, then counted wrong after three calls."""
    q = parse_questions([{**QUESTION, "Options": {**QUESTION["Options"], "B": option}}])
    lm = scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "none"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts) == ("B", True, 1)
    assert len(lm.backend.calls) == 1


def test_an_options_text_that_starts_like_a_letter_of_no_option_is_read_as_its_letter():
    """"J. Smith" starts as a letter would, but J is no option: it is the text of option C."""
    q = parse_questions([{**QUESTION, "Options": {"A": "The Heron", "B": "The Marigold", "C": "J. Smith",
                                                  "D": "The Lantern"}, "Gold": "C"}])
    lm = scripted(lambda call: {"answer": "j. smith"})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts) == ("C", True, 1) and len(lm.backend.calls) == 1


def test_an_options_whole_text_that_starts_like_another_letter_is_that_option():
    """Option C is "A. Lincoln": the answer "A. Lincoln" is its text whole, not option A with some
    words after it (option A is not Lincoln). Letters with their own option's text still read as before."""
    options = {"A": "Grant", "B": "Lee", "C": "A. Lincoln", "D": "Davis"}
    q = parse_questions([{**QUESTION, "Options": options, "Gold": "C"}])
    for written, letter in (("A. Lincoln", "C"), ("a. lincoln", "C"), ("C. A. Lincoln", "C"), ("A. Grant", "A")):
        scripted(lambda call: {"answer": written})
        rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
        assert (rec.prediction, rec.attempts) == (letter, 1), written


@pytest.mark.parametrize("options, written", [
    ({"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"}, "The Osprey"),
    ({"A": "The Heron", "B": "The Marigold", "C": "the marigold.", "D": "The Lantern"}, "The Marigold"),
    ({"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"}, "The Marigold or The Swift"),
])
def test_an_answer_matching_no_options_text_or_two_is_still_refused(options, written):
    q = parse_questions([{**QUESTION, "Options": options}])
    lm = scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts) == (None, False, 3)
    assert len(lm.backend.calls) == 3


@pytest.mark.parametrize("written", ["", "**", "."])
def test_a_blank_answer_is_not_read_as_a_blank_options_letter(written):
    """A blank option (D: "", which the loader refuses but a question built in code may have): an
    answer with no words is still no answer, not the letter of the option whose text is as blank."""
    options = {"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": ""}
    q = [parse_questions([QUESTION])[0].model_copy(update={"options": options})]
    lm = scripted(lambda call: {"answer": written})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), q)[0]
    assert (rec.prediction, rec.correct, rec.attempts) == (None, False, 3)
    assert len(lm.backend.calls) == 3


def test_reading_an_options_text_leaves_the_prompt_and_schema_as_the_signature_has_them():
    """Reading the options' texts must not change what is sent: a changed prompt or schema would
    miss every cached call."""
    import dspy

    from booklens.programs.base import Predict
    from booklens.signatures.qa import AnswerMultipleChoice

    book, q = make_book(20), parse_questions([QUESTION])[0]
    lm = scripted(lambda call: {"answer": "The Marigold"})
    assert BookQA("mc", "book")(book=book, question=q.question, options=q.options_text()).answer == "B"
    plain = ScriptedLM(lambda call: {"answer": "B"})
    with dspy.context(lm=plain):
        Predict(AnswerMultipleChoice)(context=book, question=q.question, options=q.options_text())
    sent, expected = lm.backend.calls[0], plain.backend.calls[0]
    assert sent.messages == expected.messages and sent.request["schema"] == expected.request["schema"]


def test_a_verdict_written_in_capitals_is_read_as_the_verdict():
    q = parse_questions([QUESTION])
    scripted(lambda call: {"reason": "same ship", "verdict": "Correct"} if call.wants("verdict")
             else {"answer": "the tender Marigold"})
    rec = answer_questions(BookQA("gen", "book"), make_book(20), q)[0]
    assert (rec.correct, rec.error) == (True, None)


@pytest.mark.parametrize("written, correct", [
    ("Verdict: correct", True), ("Incorrect - it names the wrong ship", False),
    ("Incorrect. The ship was the Marigold.", False), ("The answer is correct", True),
    ("The student's answer is incorrect.", False), ("**Correct**: same ship", True),
    ("**Verdict:** incorrect", False), ("**Verdict**: Correct", True)])
def test_a_verdict_with_a_label_or_its_reason_is_read_as_that_verdict(written, correct):
    """A judge that writes 'Incorrect - it names the wrong ship' left the question unscored after three
    calls: accuracy is over scored questions, so wrong answers dropped that way raised it."""
    q = parse_questions([QUESTION])
    lm = scripted(lambda call: {"reason": "r", "verdict": written} if call.wants("verdict")
                  else {"answer": "the tender Marigold"})
    rec = answer_questions(BookQA("gen", "book"), make_book(20), q)[0]
    assert (rec.correct, rec.error) == (correct, None) and len(lm.backend.calls) == 2


@pytest.mark.parametrize("written", ["not correct", "partially correct", "Correct - though partly incorrect",
                                     "correct or incorrect", "yes", "**Verdict:** correct or incorrect"])
def test_a_verdict_naming_no_single_value_is_still_refused(written):
    q = parse_questions([QUESTION])
    scripted(lambda call: {"reason": "r", "verdict": written} if call.wants("verdict")
             else {"answer": "the tender Marigold"})
    rec = answer_questions(BookQA("gen", "book"), make_book(20), q)[0]
    assert rec.correct is None and rec.error.startswith("judge: ")


def test_an_option_written_over_several_lines_is_shown_on_one():
    """The options reach the model one per line ('LETTER. text'): a line break inside an option's
    text would show a line that reads as an option of its own ('B. ...' twice)."""
    q = parse_questions([{**QUESTION, "Options": {"A": "The Heron,\nB. the old one", "B": "The  Marigold\n",
                                                  "C": "The Swift", "D": "The Lantern"}}])[0]
    assert q.options_text().splitlines() == ["A. The Heron, B. the old one", "B. The Marigold", "C. The Swift",
                                            "D. The Lantern"]
    lm = scripted(lambda call: {"answer": "B"})
    rec = answer_questions(BookQA("mc", "book"), make_book(20), [q])[0]
    assert rec.correct is True
    assert lm.backend.calls[0].inputs["options"] == q.options_text()


@pytest.mark.parametrize("quote", [False, True])
def test_a_judge_prompt_too_long_for_the_window_costs_its_question_only(quote):
    """Gold evidence too long for the judges' window (the answer's `given` context cuts it, bm25 does not
    show it) stopped the whole run at the first verdict, every answer's result lost, and so again on
    every rerun: that verdict (or evidence score) fails, recorded, and the others are given."""
    from booklens.lm.base import ContextWindowExceeded

    long = {**QUESTION, "QID": "T-2", "Evidences": [QUESTION["Evidences"][0] + ". " + "The tide came in. " * 3000]}
    questions = parse_questions([QUESTION, long, {**QUESTION, "QID": "T-3", "Question": "Which ship sails?"}])

    def answer(call):
        if sum(len(m["content"]) for m in call.messages) > 8192 * 3:
            raise ContextWindowExceeded("the prompt (30000 tokens) does not fit the 8192-token context window")
        if call.wants("verdict"):
            return {"reason": "same ship", "verdict": "correct"}
        if call.wants("correctness"):
            return {"correctness": 80, "relevance": 90, "sufficiency": 70}
        return {"answer": "The Marigold", "evidence": ["Captain Orrin Vell sailed the lighthouse tender Marigold"]}

    scripted(answer)
    records = answer_questions(BookQA("gen", "bm25", quote_evidence=quote), make_book(), questions)
    assert [r.correct for r in records] == [True, None, True]
    assert records[1].error == "judge: the prompt (30000 tokens) does not fit the 8192-token context window"
    if quote:
        assert [r.evidence_score for r in records] == [80.0, None, 80.0]
        assert records[1].evidence_error == "the prompt (30000 tokens) does not fit the 8192-token context window"


def test_evidence_handed_to_the_programs_as_one_string_is_one_quote():
    """A quote given as a string, not a list of them, was read character by character: `given` showed
    the model 'C', 'a', 'p', ... a paragraph each, and the judges were handed a list of letters."""
    import json as _json

    quote = QUESTION["Evidences"][0]
    seen = []
    scripted(lambda call: seen.append(call.inputs) or (
        {"reason": "same", "verdict": "correct"} if call.wants("verdict")
        else {"correctness": 90, "relevance": 90, "sufficiency": 90} if call.wants("correctness")
        else {"answer": "B"}))
    pred = BookQA("mc", "given")(book=make_book(20), question=QUESTION["Question"],
                                 options="A. The Heron\nB. The Marigold", gold_evidence=quote)
    assert pred.context_mode == "given" and seen[-1]["context"] == quote
    AnswerJudge()(question="Which ship?", correct_answer="The Marigold", student_answer="the Marigold",
                  evidence=quote)
    assert _json.loads(seen[-1]["supporting_evidence"]) == [quote]
    scored = EvidenceJudge()(question="Which ship?", correct_answer="The Marigold", correct_evidence=quote,
                             student_answer="the Marigold", student_evidence=quote)
    assert _json.loads(seen[-1]["correct_evidence"]) == [quote]
    assert _json.loads(seen[-1]["student_evidence"]) == [quote] and scored.mean == 90.0
    assert len(seen) == 3


@pytest.mark.parametrize("call, message", [
    (lambda: BookQA("mc", "bm25", k="5"), r"^k must be at least 1 \(got '5'\)$"),
    (lambda: BookQA("mc", "book", context_window="8192"),
     r"^context_window must be at least 1 \(got '8192'\)$"),
    (lambda: BookQA("mc", "none")(book=Path("book.txt"), question="Which ship?", options="A. x\nB. y"),
     r"^book must be the book's text, not PosixPath \(booklens\.text\.read_book reads a file\)$"),
    (lambda: BookQA("mc", "none")(book="text", question=None, options="A. x\nB. y"),
     r"^question must be text, not NoneType$"),
    (lambda: BookQA("mc", "none")(book="text", question="Which ship?", options={"A": "x", "B": "y"}),
     r"^options must be text, not dict: one 'LETTER\. text' line per option"),
    (lambda: BookQA("mc", "given")(book="text", question="Which ship?", options="A. x\nB. y", gold_evidence=[1]),
     r"^gold_evidence must be a list of quotes \(text\), not list holding int$"),
    (lambda: AnswerJudge()(question="Which ship?", correct_answer=None, student_answer="x"),
     r"^correct_answer must be text, not NoneType$"),
    (lambda: EvidenceJudge()(question="Which ship?", correct_answer="x", correct_evidence=5, student_answer="x",
                             student_evidence=["y"]), r"^correct_evidence must be a list of quotes \(text\), not int$"),
])
def test_the_programs_refuse_inputs_of_the_wrong_kind_in_one_line(call, message):
    """A Path for the book, a dict of options or a non-numeric k stopped in an AttributeError or TypeError
    deep in the program; a question of None was asked as the text 'None'."""
    lm = scripted(lambda call: {"answer": "B"})
    with pytest.raises(BooklensError, match=message):
        call()
    assert len(lm.backend.calls) == 0


def test_generative_answers_are_judged():
    book = make_book(20)
    q = parse_questions([QUESTION])

    def responder(call):
        if call.wants("verdict"):
            ok = "Marigold" in call.inputs["student_answer"]
            return {"reason": "same ship" if ok else "wrong ship", "verdict": "correct" if ok else "incorrect"}
        return {"answer": "the tender Marigold"}

    scripted(responder)
    rec = answer_questions(BookQA("gen", "book"), book, q)[0]
    assert rec.prediction == "the tender Marigold" and rec.gold == "The Marigold"
    assert rec.correct is True and rec.judge_reason == "same ship"

    # a judge that never gives a verdict: the question is recorded unscored, not guessed
    scripted(lambda call: "no json here" if call.wants("verdict") else {"answer": "Heron"})
    rec = answer_questions(BookQA("gen", "book"), book, q)[0]
    assert rec.correct is None and rec.error.startswith("judge:")


def test_a_blank_reference_answer_is_no_reference_in_the_gen_setting():
    """An empty or blank Answer is a question without a reference, as a blank Gold letter is: the
    judge would otherwise grade the model's answer against nothing and the question be scored."""
    book = make_book(20)
    q = parse_questions([{**QUESTION, "QID": "T-2", "Answer": ""}, {**QUESTION, "QID": "T-3", "Answer": "  "}])
    assert [x.answer for x in q] == [None, None]
    lm = scripted(lambda call: {"reason": "no reference", "verdict": "correct"} if call.wants("verdict")
                  else {"answer": "the tender Marigold"})
    records = answer_questions(BookQA("gen", "book"), book, q)
    assert [(r.gold, r.correct) for r in records] == [(None, None), (None, None)]
    assert not any(call.wants("verdict") for call in lm.backend.calls)


def test_answer_judge_program():
    lm = scripted(lambda call: {"reason": "rough number", "verdict": "incorrect"})
    v = AnswerJudge()(question="How many?", correct_answer="3", student_answer="a few", book_title="The Lamp")
    assert v.correct is False and v.reason == "rough number"
    # what stays the same for a book and a question comes first, the graded answer last
    content = lm.backend.calls[0].messages[-1]["content"]
    order = [content.index(f"[[ ## {name} ## ]]") for name in
             ("book_title", "question", "correct_answer", "supporting_evidence", "student_answer")]
    assert order == sorted(order)


@pytest.mark.parametrize("name, shared, differs", [
    ("AnswerMultipleChoice", ["context"], ["question", "options"]),  # one book, many questions
    ("AnswerQuestion", ["context"], ["question"]),
    ("JudgeAnswer", ["book_title", "question", "correct_answer", "supporting_evidence"], ["student_answer"]),
    ("ScoreEvidence", ["book_title", "question", "correct_answer", "correct_evidence"],
     ["student_answer", "student_evidence"]),
])
def test_prompts_put_what_calls_share_before_what_differs(name, shared, differs):
    from booklens.signatures import qa as signatures

    fields = list(getattr(signatures, name).input_fields)
    assert max(fields.index(f) for f in shared) < min(fields.index(f) for f in differs)


def evidence_scorer(scores=(80, 90, 70)):
    def responder(call):
        if call.wants("correctness"):
            return dict(zip(("correctness", "relevance", "sufficiency"), scores))
        return {"evidence": ["Captain Orrin Vell sailed the lighthouse tender Marigold"], "answer": "B"}

    return responder


def test_quoted_evidence_is_scored_by_the_llm_judge_and_by_overlap():
    book = make_book(20)
    lm = scripted(evidence_scorer())
    rec = answer_questions(BookQA("mc", "book", quote_evidence=True), book, parse_questions([QUESTION]),
                           book_title="The Lamp")[0]
    assert rec.quoted_evidence and rec.quote_recall == 1.0
    assert rec.evidence_scores == {"correctness": 80, "relevance": 90, "sufficiency": 70} and rec.evidence_score == 80
    judge_call = lm.backend.calls[-1]
    # the judge reads the gold option's text, the model's choice and both sets of evidence
    assert judge_call.inputs["correct_answer"] == "B. The Marigold" == judge_call.inputs["student_answer"]
    assert "Orrin Vell" in judge_call.inputs["correct_evidence"] and judge_call.inputs["book_title"] == "The Lamp"
    content = judge_call.messages[-1]["content"]
    assert content.index("[[ ## book_title ## ]]") < content.index("[[ ## student_evidence ## ]]")
    assert len(lm.backend.calls) == 2  # one answer, one evidence score

    # unrelated quotes: no overlap; overlap mode makes no judge call
    lm = scripted(lambda call: {"evidence": ["The rain fell on the quiet village"], "answer": "B"})
    rec = answer_questions(BookQA("mc", "book", quote_evidence=True), book, parse_questions([QUESTION]),
                           evidence_recall="overlap")[0]
    assert rec.quote_recall == 0.0 and rec.evidence_scores is None and len(lm.backend.calls) == 1


def test_evidence_judge_scores_no_quotes_as_zero_and_reasks_out_of_range_scores():
    lm = scripted(lambda call: {"correctness": 140, "relevance": 50, "sufficiency": 50})
    judge = EvidenceJudge()
    none = judge(question="q", correct_answer="a", correct_evidence=["e"], student_answer="a", student_evidence=[" "])
    assert none.scores == {"correctness": 0, "relevance": 0, "sufficiency": 0} and len(lm.backend.calls) == 0
    bad = judge(question="q", correct_answer="a", correct_evidence=["e"], student_answer="a", student_evidence=["x"])
    assert bad.scores is None and "correctness 140" in bad.error and len(lm.backend.calls) == 3


@pytest.mark.parametrize("written, quotes", [("Captain Orrin Vell sailed the lighthouse tender Marigold",
                                             ["Captain Orrin Vell sailed the lighthouse tender Marigold"]),
                                            (None, []), ("", [])])
def test_quotes_written_as_one_string_or_null_do_not_cost_the_answer(written, quotes):
    """With --quote-evidence, a lone quote written as a string, or `null` for none, made the whole
    answer unparseable: a right letter was re-asked, then counted wrong."""
    q = parse_questions([QUESTION])
    lm = scripted(lambda call: {"evidence": written, "answer": "B"})
    rec = answer_questions(BookQA("mc", "book", quote_evidence=True), make_book(20), q,
                           evidence_recall="overlap")[0]
    assert (rec.prediction, rec.correct, rec.attempts, rec.error) == ("B", True, 1, None)
    assert rec.quoted_evidence == quotes and len(lm.backend.calls) == 1


def test_evidence_scores_written_with_their_scale_are_read_as_those_scores():
    lm = scripted(lambda call: {"correctness": "80/100", "relevance": "Relevance: 90", "sufficiency": "**70**"})
    got = EvidenceJudge()(question="q", correct_answer="a", correct_evidence=["e"], student_answer="a",
                          student_evidence=["x"])
    assert got.scores == {"correctness": 80, "relevance": 90, "sufficiency": 70} and got.error is None
    assert len(lm.backend.calls) == 1


def test_evidence_scores_written_as_percentages_are_read_on_their_0_to_100_scale():
    lm = scripted(lambda call: {"correctness": "80%", "relevance": "90 %", "sufficiency": "70"})
    got = EvidenceJudge()(question="q", correct_answer="a", correct_evidence=["e"], student_answer="a",
                          student_evidence=["x"])
    assert got.scores == {"correctness": 80, "relevance": 90, "sufficiency": 70} and len(lm.backend.calls) == 1


def test_evidence_recall_options_with_nothing_to_score_are_refused(tmp_path):
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION]))
    with pytest.raises(BooklensError, match="^quote_evidence asks for quotes from the context, and evidence none"):
        run_book_qa(tmp_path / "book.txt", questions, evidence="none", quote_evidence=True)
    with pytest.raises(BooklensError, match="^evidence_recall scores the quotes that quote_evidence asks for"):
        run_book_qa(tmp_path / "book.txt", questions, evidence_recall="overlap")


@pytest.mark.parametrize("setting, evidence, options, says", [
    ("mc", "book", {}, "; evidence book: every question is shown the book or passages of it"),
    ("mc", "bm25", {}, "; evidence bm25: every question is shown the book or passages of it"),
    ("mc", "given", {}, "; evidence given: every question is shown its gold evidence"),
    ("mc", "book", {"quote_evidence": True, "evidence_recall": "overlap"},
     "; evidence_recall overlap: the quotes are scored without a judge"),
])
def test_a_title_no_prompt_names_is_refused_before_any_call(tmp_path, setting, evidence, options, says):
    """Only the closed-book prompts and the judges (gen answers, LLM-scored evidence) name the book: in
    multiple choice over the book, `--title` was taken, recorded as the run's title, and changed no prompt."""
    book = tmp_path / "the_lamp.txt"
    book.write_text(make_book(20), encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION]))
    lm = ScriptedLM(lambda call: {"answer": "B"})
    with pytest.raises(BooklensError, match="^title names the book in the closed-book and judge prompts") as err:
        run_book_qa(book, questions, setting=setting, evidence=evidence, title="The Lamp", lm=lm, **options)
    assert says in str(err.value)
    assert lm.backend.calls == []


@pytest.mark.parametrize("setting, evidence, options, evidences", [
    ("gen", "book", {}, ["the Marigold"]),  # the answer judge
    ("mc", "none", {}, ["the Marigold"]),  # closed book
    ("mc", "given", {}, []),  # a question without gold evidence is asked closed book
    ("mc", "book", {"quote_evidence": True}, ["the Marigold"]),  # the evidence judge
])
def test_a_title_a_prompt_names_is_taken(tmp_path, setting, evidence, options, evidences):
    book = tmp_path / "the_lamp.txt"
    book.write_text(make_book(20), encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{**QUESTION, "Evidences": evidences}]))

    def answer(call):
        if call.wants("verdict"):
            return {"reason": "same ship", "verdict": "correct"}
        if call.wants("correctness"):
            return {"correctness": 50, "relevance": 50, "sufficiency": 50}
        return {"answer": "B" if setting == "mc" else "The Marigold", "evidence": ["the Marigold"]}

    lm = ScriptedLM(answer)
    result = run_book_qa(book, questions, setting=setting, evidence=evidence, title="Zanzibar Tales", lm=lm,
                         **options)
    assert result["title"] == "Zanzibar Tales"
    assert sum("Zanzibar Tales" in json.dumps(call.messages) for call in lm.backend.calls) == 1


def test_run_book_qa_reports_the_llm_scored_evidence_recall(tmp_path):
    book = tmp_path / "the_lamp.txt"
    book.write_text(make_book(20), encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION, {**QUESTION, "QID": "T-2", "Evidences": ["The keeper's reasoning."]}]))
    lm = ScriptedLM(evidence_scorer((40, 60, 20)))
    result = run_book_qa(book, questions, quote_evidence=True, lm=lm, cache_dir=tmp_path / "cache", concurrency=2)
    assert result["kind"] == "booklens.qa" and result["context_modes"] == {"whole-book": 2}
    assert result["usage"]["calls"] == 4 and result["evidence_recall"] == "llm"
    llm = result["report"]["evidence"]["llm"]
    assert llm == {"correctness": 40.0, "relevance": 60.0, "sufficiency": 20.0, "avg": 40.0, "questions": 2,
                   "failed": 0}
    # the second question's evidence is reasoning, not a quote: no overlap figure, but the judge scores it
    assert result["report"]["evidence"]["quote_questions"] == 1
    assert "correctness 40.0, relevance 60.0, sufficiency 20.0, avg 40.0 (2 questions)" in format_report(
        result["report"])
    assert any(c.inputs.get("book_title") == "The Lamp" for c in lm.backend.calls)
    json.dumps(result)

    # retrieval keeps the book's index where every command looks for it, so it is built once
    from booklens.retrieval import index_dir

    run_book_qa(book, questions, evidence="bm25", k=1, passage_tokens=64, lm=lm, cache_dir=tmp_path / "cache")
    assert len(list(index_dir(tmp_path / "cache").iterdir())) == 1

    with pytest.raises(BooklensError, match="no Options"):
        questions.write_text(json.dumps([{k: v for k, v in QUESTION.items() if k != "Options"}]))
        run_book_qa(book, questions, lm=lm)


def test_the_qa_record_holds_the_settings_behind_its_figures(tmp_path):
    """The record named the evidence mode and k, but not the window that decides whole book or
    retrieval, the title the closed-book and judge prompts name, --limit or the position split."""
    book = tmp_path / "the_lamp.txt"
    book.write_text(make_book(20), encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([QUESTION, {**QUESTION, "QID": "T-2"}]))
    lm = ScriptedLM(lambda call: {"answer": "B"})
    result = run_book_qa(book, questions, evidence="none", title="Lamp", limit=1, position_threshold=500,
                         context_window=2048, lm=lm, cache_dir=tmp_path / "cache")
    assert {key: result[key] for key in ("context_window", "title", "limit", "position_threshold",
                                         "quote_evidence")} == {
        "context_window": 2048, "title": "Lamp", "limit": 1, "position_threshold": 500, "quote_evidence": False}
    default = run_book_qa(book, questions, lm=lm, cache_dir=tmp_path / "cache")
    assert (default["context_window"], default["title"], default["limit"]) == (None, "The Lamp", None)


# ---------------------------------------------------------------------------
# metrics


def _rec(qid, complexity, aspect, correct, pos=None, in_ctx=None, error=None):
    return QAPrediction(qid=qid, aspect=aspect, complexity=complexity, setting="mc", context_mode="retrieval",
                        evidence_mode="bm25", correct=correct, gold_evidence_start_token=pos,
                        gold_evidence_in_context=in_ctx, error=error)


def test_accuracy_tables():
    recs = [_rec("1", "mh", "times", True, 10), _rec("2", "mh", "times", False, 150_000),
            _rec("3", "sh", "plot", True, 99_999), _rec("4", "dtl", "plot", False, 100_000, error="x"),
            _rec("5", "dtl", "plot", None)]
    assert accuracy(recs) == {"n": 4, "correct": 2, "accuracy": 50.0, "unscored": 1, "failed": 1, "failed_unscored": 0}
    t = accuracy_by_type(recs)
    assert t["mh"]["times"]["accuracy"] == 50.0 and t["mh"]["times"]["n"] == 2
    assert t["avg"]["plot"] == {"n": 2, "correct": 1, "accuracy": 50.0}
    assert t["sh"]["times"]["n"] == 0 and t["sh"]["times"]["accuracy"] is None
    assert t["avg"]["avg"]["accuracy"] == 50.0
    p = accuracy_by_position(recs)
    assert p["pre-100K"]["n"] == 2 and p["pre-100K"]["accuracy"] == 100.0
    assert p["post-100K"]["n"] == 2 and p["post-100K"]["accuracy"] == 0.0
    text = format_type_table(t)
    assert text.splitlines()[0].split() == ["chara", "mean", "plot", "relat", "settg", "span", "times", "avg"]
    assert "-" in text and "50.0 (2)" in text
    assert "pre-100K: 100.0 (2)" in format_report(qa_report(recs))
    assert list(accuracy_by_position(recs, 1500)) == ["pre-1.5K", "post-1.5K", "unlocated"]
    assert list(accuracy_by_position(recs, 500)) == ["pre-500", "post-500", "unlocated"]


def test_evidence_recall_means():
    recs = [_rec("1", "mh", "times", True, in_ctx=1.0), _rec("2", "sh", "plot", True, in_ctx=0.5),
            _rec("3", "sh", "plot", True)]
    ev = evidence_recall(recs)
    assert ev["context_recall"] == 75.0 and ev["context_questions"] == 2 and ev["quote_recall"] is None
    assert ev["llm"]["questions"] == 0 and ev["llm"]["avg"] is None


def test_report_is_json_serializable():
    recs = [_rec("1", "mh", "times", True, 10)]
    json.dumps(qa_report(recs))


def test_quote_overlap_counts_words_of_any_script():
    """The overlap of the model's quotes with the gold ones counts words as BM25 does: a Russian or
    Chinese gold quote had no word at all ([a-z0-9] only) and was left out of the figure."""
    from booklens.metrics.qa import EvidenceSpan, quote_recall

    russian = EvidenceSpan("Смотритель зажёг большой фонарь", 0, 31)
    chinese = EvidenceSpan("守灯人点亮了大灯", 40, 48)
    assert quote_recall([russian, chinese], ["смотритель зажёг фонарь", "守灯人点亮"]) == 1.0
    assert quote_recall([russian, chinese], ["the keeper lit the lamp"]) == 0.0


def test_option_letters_are_not_search_terms():
    """A multiple-choice question is searched by its words and its options' words, not by the options'
    letters: 'b' and 'c' are rare in a book, so a passage that happens to hold them (a list marked
    b) and c), a grid reference) outranked passages about the question."""
    from booklens.retrieval.index import bm25_tokens

    book = make_book(120).split("\n\n")
    book[10] = "The inventory listed crate b, crate c, shelf b and shelf c, and row b next to row c."
    book = "\n\n".join(book)
    seen = []
    scripted(lambda call: seen.append(call.inputs["context"]) or {"answer": "B"})
    program = BookQA("mc", "bm25", k=3, passage_tokens=64)
    options = parse_questions([QUESTION])[0].options_text()
    assert {"b", "c"} <= set(bm25_tokens(options))  # the letters would be terms if searched
    answer_questions(program, book, parse_questions([QUESTION]))
    assert "Marigold" in seen[-1]
    assert "crate b" not in seen[-1]


@pytest.mark.parametrize("setting", ["mc", "gen"])
def test_a_run_stopped_by_the_backend_at_one_question_resumes_with_only_the_calls_it_lacks(tmp_path, setting):
    """The backend fails at the fourth of six questions: the rerun asks that question and the two after it
    (and, in gen, the six verdicts), not the three answered before the failure."""
    from booklens.errors import LMError

    book = tmp_path / "the_lamp.txt"
    book.write_text(make_book(20), encoding="utf-8")
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{**QUESTION, "QID": f"T-{i}", "Question": f"Question {i}: which ship?"}
                                     for i in range(1, 7)]), encoding="utf-8")

    def answer(call):
        if call.wants("verdict"):
            return {"reason": "same ship", "verdict": "correct"}
        return {"answer": "B" if setting == "mc" else "The Marigold"}

    def failing(call):
        if call.inputs.get("question", "").startswith("Question 4"):
            raise LMError("the server went away")
        return answer(call)

    first = ScriptedLM(failing, cache_dir=tmp_path / "cache")
    with pytest.raises(BooklensError, match="the server went away"):
        run_book_qa(book, questions, setting=setting, lm=first, cache_dir=tmp_path / "cache", concurrency=1)
    assert len(first.backend.calls) == 4
    second = ScriptedLM(answer, cache_dir=tmp_path / "cache")
    result = run_book_qa(book, questions, setting=setting, lm=second, cache_dir=tmp_path / "cache", concurrency=1)
    asked = [(call.inputs["question"][:10], "verdict" in call.output_fields) for call in second.backend.calls]
    answers = [(f"Question {i}", False) for i in (4, 5, 6)]
    verdicts = [(f"Question {i}", True) for i in range(1, 7)] if setting == "gen" else []
    assert asked == answers + verdicts
    assert result["report"]["overall"]["correct"] == 6


def test_examples_carry_the_gold_evidence_the_given_mode_reads():
    """`to_examples` left the gold evidence out of the inputs: a `given`-mode BookQA run on the examples
    asked every question closed-book, as if none had evidence."""
    from booklens.data.novelqa import to_examples

    seen = []
    scripted(lambda call: seen.append(call.inputs) or {"answer": "B"})
    example = to_examples(parse_questions([QUESTION]), make_book(20))[0]
    pred = BookQA("mc", "given")(**example.inputs())
    assert pred.context_mode == "given" and seen[-1]["context"] == QUESTION["Evidences"][0]
    assert (pred.answer, example.gold) == ("B", "B")


def test_given_evidence_cut_to_the_budget_ends_on_a_whole_word(monkeypatch):
    """A cut at a token boundary can fall inside a word ('unsett|led'): the model read a fragment.
    The evidence shown ends at its last whole word, within the budget, and counts its own tokens."""
    from booklens.text import count_tokens

    quote = ("Wickham's expostulations about Hertfordshire drew commendations from Lydia, and the perpetual "
             "commendations of Miss Bingley unsettled Elizabeth entirely. ") * 6
    program = BookQA("mc", "given")
    split = 0
    for budget in range(64, 160):
        monkeypatch.setattr(program, "context_budget", lambda *args, budget=budget, **kwargs: budget)
        shown = program.select_context("", "Who is unsettled?", "A. Jane\nB. Elizabeth", gold_evidence=[quote])
        assert quote.startswith(shown["text"]) and shown["tokens"] == count_tokens(shown["text"]) <= budget
        split += shown["text"][-1].isalnum() and quote[len(shown["text"])].isalnum()
    assert split == 0
