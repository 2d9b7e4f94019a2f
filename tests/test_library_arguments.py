"""Library callers skip the commands' option checks: the library functions check what they are
handed themselves, with the one-line `BooklensError` a command would print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import booklens  # noqa: F401 - offline settings before dspy imports litellm
import dspy

from booklens.errors import BooklensError
from booklens.testing import PipelineResponder, ScriptedLM

BOOK_TEXT = " ".join(f"Mara walked to the mill on day {n} and met Tom there." for n in range(200))
SUMMARY = "Mara finds the key. Tom hides the letter from Mara. Mara reads the letter at dawn."


def pipeline_lm(**options):
    responder = PipelineResponder()
    return ScriptedLM(lambda call: responder({"messages": call.messages}), **options)


@pytest.fixture
def book(tmp_path) -> Path:
    path = tmp_path / "book.txt"
    path.write_text(BOOK_TEXT)
    return path


def test_run_book_takes_paths_given_as_strings(tmp_path, book):
    """`run_book("book.txt", "runs/book")` runs every step, as with `Path`s: not an AttributeError,
    nor a run whose coherence step failed with an internal error."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import SystemConfig, run_book

    system = SystemConfig(chunk_size=256, context_window=2048, max_summary_tokens=128)
    run = run_book(str(book), str(tmp_path / "run"), system, lms=FixedLMPool(pipeline_lm(), cache_dir=tmp_path / "c"),
                   concurrency=1, notify=lambda message: None)
    assert run.failures == {}
    assert run.scores["booookscore"] is not None
    assert (tmp_path / "run" / "run.json").is_file()


@pytest.mark.parametrize("claims, message", [
    ("Mara finds the key.", "a list of claims"),           # a str would be verified character by character
    (["Mara finds the key.", "  "], "claim 2 is empty"),   # an empty claim would be 'verified' like any other
    (["Mara finds the key.", None], "claim 2 is empty"),
    (["Mara finds the key.", "..."], "claim 2 has no words"),  # nothing in it to be false: 'faithful'
])
def test_verify_claims_refuses_claims_that_are_not_a_list_of_sentences(tmp_path, claims, message):
    from booklens.steps import verify_claims

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
        verify_claims(claims=claims, book_text=BOOK_TEXT, cache_dir=tmp_path / "c")
    assert lm.backend.calls == []


SMALL = {"chunk_size": 256, "context_window": 2048, "max_summary_tokens": 128}


@pytest.mark.parametrize("call, message", [
    (lambda book, tmp: __import__("booklens.steps").steps.summarize_book(book, concurrency=0, **SMALL),
     "concurrency must be at least 1"),
    (lambda book, tmp: __import__("booklens.steps").steps.summarize_book(book, max_regenerations=-1, **SMALL),
     r"max_regenerations must be from 0 to 10 \(got -1\)"),
    (lambda book, tmp: __import__("booklens.steps").steps.score_summaries({"a": SUMMARY}, concurrency=0),
     "concurrency must be at least 1"),
    (lambda book, tmp: __import__("booklens.steps").steps.score_summaries({"a": SUMMARY}, batch_size=0),
     "batch_size must be at least 1"),
    (lambda book, tmp: __import__("booklens.steps").steps.score_summaries({"a": SUMMARY}, tries=0),
     r"tries must be from 1 to 10 \(got 0\)"),
    (lambda book, tmp: __import__("booklens.steps").steps.verify_claims(
        claims=["Mara finds the key."], book_text=BOOK_TEXT, concurrency=-2, cache_dir=tmp),
     "concurrency must be at least 1"),
])
def test_steps_refuse_counts_the_commands_refuse(tmp_path, book, call, message):
    """Concurrency 0 ran (recorded as 0 in the summary's config), -1 regenerations were recorded,
    batch size 0 was a ValueError: each is now the commands' one-line error, before any call."""
    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
        call(book, tmp_path / "c")
    assert lm.backend.calls == []


def _question_file(tmp_path: Path) -> Path:
    path = tmp_path / "q.json"
    path.write_text('[{"QID": "T-1", "Question": "Where does Mara walk?", "Options": {"A": "To the sea", '
                    '"B": "To the mill"}, "Answer": "To the mill", "Gold": "B", "Evidences": [], '
                    '"Aspect": "plot", "Complexity": "sh"}]')
    return path


@pytest.mark.parametrize("call", [
    lambda book, tmp: __import__("booklens.lm").lm.FixedLMPool(pipeline_lm(), cache_dir=5),
    lambda book, tmp: __import__("booklens.steps").steps.verify_claims(claims=["Mara finds the key."],
                                                                       book_text=BOOK_TEXT, cache_dir=5),
    lambda book, tmp: __import__("booklens.qa_runs").qa_runs.run_book_qa(book, _question_file(tmp),
                                                                         lm=pipeline_lm(), cache_dir=5),
    lambda book, tmp: __import__("booklens.judges").judges.load_store(cache_dir=["c"]),
])
def test_a_cache_dir_that_is_no_path_is_named(tmp_path, book, call):
    """`cache_dir=5` had been a TypeError from pathlib deep inside the entry point."""
    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=r"^cache_dir must be a path, not (5|\['c'\])$"):
        call(book, tmp_path)
    assert lm.backend.calls == []


def test_run_book_refuses_concurrency_below_one(tmp_path, book):
    from booklens.lm import FixedLMPool
    from booklens.pipeline import SystemConfig, run_book

    with pytest.raises(BooklensError, match="concurrency must be at least 1"):
        run_book(book, tmp_path / "run", SystemConfig(**SMALL), lms=FixedLMPool(pipeline_lm()), concurrency=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("summaries, message", [
    ({}, "no summaries to score"),                           # score_coherence: a StopIteration
    (SUMMARY, "a mapping of names to summaries"),            # an AttributeError ('str' has no 'items')
    ({"a": None}, "the summary 'a' is empty"),               # a TypeError deep in the sentence splitter
])
def test_score_coherence_refuses_summaries_it_cannot_score(summaries, message):
    from booklens.steps import score_coherence

    lm = pipeline_lm()
    for as_set in (True, False):
        with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
            score_coherence(summaries, as_set=as_set)
    assert lm.backend.calls == []


def test_run_book_qa_leaves_dspy_settings_alone_and_runs_on_any_thread(tmp_path):
    """`run_book_qa(lm=...)` ran its LM through `dspy.configure`: it replaced the caller's own DSPy LM
    for the rest of the process, and on a second thread it stopped with DSPy's RuntimeError
    ('dspy.settings can only be changed by the thread that initially configured it')."""
    import json
    import threading

    from booklens.qa_runs import run_book_qa

    book = tmp_path / "the_lamp.txt"
    book.write_text(BOOK_TEXT)
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"QID": "T-1", "Question": "Where does Mara walk?", "Aspect": "plot",
                                      "Complexity": "sh", "Options": {"A": "To the sea", "B": "To the mill"},
                                      "Answer": "To the mill", "Gold": "B", "Evidences": []}]))
    first, second = (ScriptedLM(lambda call: {"answer": "B"}) for _ in range(2))
    before = dspy.settings.lm
    assert run_book_qa(book, questions, lm=first, cache_dir=tmp_path / "c")["predictions"][0]["correct"] is True
    assert dspy.settings.lm is before  # the process's DSPy settings are as they were
    outcome = {}

    def on_a_thread():
        try:
            outcome["result"] = run_book_qa(book, questions, lm=second, cache_dir=tmp_path / "c")
        except Exception as exc:  # reported by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    assert len(first.backend.calls) == 1 and len(second.backend.calls) == 1


def test_run_book_qa_takes_paths_as_strings_and_refuses_a_limit_below_one(tmp_path):
    """A str book stopped with an AttributeError (after the LM was set up); limit=-1 silently left
    out the last question and limit=0 answered every one."""
    import json

    from booklens.qa_runs import run_book_qa

    book = tmp_path / "the_lamp.txt"
    book.write_text(BOOK_TEXT)
    questions = tmp_path / "q.json"
    question = {"QID": "T-1", "Question": "Where does Mara walk?", "Aspect": "plot", "Complexity": "sh",
                "Options": {"A": "To the sea", "B": "To the mill"}, "Answer": "To the mill", "Gold": "B",
                "Evidences": []}
    questions.write_text(json.dumps([question, {**question, "QID": "T-2"}]))
    lm = ScriptedLM(lambda call: {"answer": "B"})
    result = run_book_qa(str(book), str(questions), lm=lm, cache_dir=tmp_path / "c")
    assert len(result["predictions"]) == 2 and result["book"] == str(book)
    for limit in (0, -1):
        with pytest.raises(BooklensError, match="limit must be at least 1"):
            run_book_qa(book, questions, lm=lm, limit=limit, cache_dir=tmp_path / "c")
    with pytest.raises(BooklensError, match="concurrency must be at least 1"):
        run_book_qa(book, questions, lm=lm, concurrency=0, cache_dir=tmp_path / "c")
    # Not an LM: the same line `configure` gives (it was an AttributeError on `.label` after the work).
    with pytest.raises(BooklensError, match=r"^lm takes an LM, not object: build one with booklens\.lm\.make_lm"):
        run_book_qa(book, questions, lm=object(), cache_dir=tmp_path / "c")
    assert len(lm.backend.calls) == 2


@pytest.mark.parametrize("options, message", [
    ({"evidence": "bm25", "k": "5"}, r"^k must be at least 1 \(got '5'\)$"),               # a TypeError
    ({"evidence": "bm25", "k": 2.5}, r"^k must be at least 1 \(got 2\.5\)$"),              # 2.5 passages asked
    ({"evidence": "bm25", "passage_tokens": "64"}, r"^passage_tokens must be at least 32 "),  # a TypeError
    ({"evidence": "bm25", "passage_tokens": 10}, r"^passage_tokens must be at least 32 \(got 10\)$"),
    ({"position_threshold": 0}, r"^position_threshold must be at least 1 \(got 0\)$"),     # 'pre-0', 'post-0'
    ({"position_threshold": "100000"}, r"^position_threshold must be at least 1 "),        # a TypeError
    ({"context_window": 0}, r"^context_window must be at least 256 \(got 0\)$"),          # recorded, unused
    ({"context_window": "8192"}, r"^context_window must be at least 256 "),                # a TypeError
    ({"title": 5}, r"^title must be text, not int$"),                                      # an AttributeError
    ({"quote_evidence": "no"}, r"^quote_evidence must be True or False, not 'no'$"),  # read as True
    ({"lm_options": [("rpm", 10)]}, r"^lm_options must be a mapping of backend options"),   # a TypeError
])
def test_run_book_qa_refuses_settings_of_the_wrong_kind_in_one_line_before_any_call(tmp_path, options, message):
    """Settings the command line bounds (--k, --passage-tokens, --position-threshold, --context-window)
    or types reached `run_book_qa` unchecked: a TypeError or AttributeError, or a run with a setting no
    command takes (position 0, a window of 0 recorded as given but not applied)."""
    import json

    from booklens.qa_runs import run_book_qa

    book = tmp_path / "the_lamp.txt"
    book.write_text(BOOK_TEXT)
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"QID": "T-1", "Question": "Where does Mara walk?", "Aspect": "plot",
                                      "Complexity": "sh", "Options": {"A": "To the sea", "B": "To the mill"},
                                      "Gold": "B"}]))
    lm = ScriptedLM(lambda call: {"answer": "B"})
    with pytest.raises(BooklensError, match=message):
        run_book_qa(book, questions, lm=lm, cache_dir=tmp_path / "c", **options)
    assert len(lm.backend.calls) == 0


@pytest.mark.parametrize("text", [BOOK_TEXT.replace(". ", ".\n", 3)[:200], BOOK_TEXT],
                         ids=["lines", "one-long-line"])
def test_a_book_handed_over_as_its_text_is_refused_in_one_short_line(tmp_path, text):
    """`run_book_qa(book_text, ...)`: text with line breaks was taken for a path, and the error quoted it
    whole, over as many lines as it has; a long line of text, 11,000 characters long, was quoted whole."""
    import json

    from booklens.qa_runs import run_book_qa

    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"QID": "T-1", "Question": "Where does Mara walk?", "Aspect": "plot",
                                      "Complexity": "sh", "Options": {"A": "To the sea", "B": "To the mill"}}]))
    lm = ScriptedLM(lambda call: {"answer": "B"})
    with pytest.raises(BooklensError) as caught:
        run_book_qa(text, questions, lm=lm, cache_dir=tmp_path / "c")
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and len(message) < 200, message
    assert len(lm.backend.calls) == 0


@pytest.mark.parametrize("text", ["... ...", "\u2026", "  "])
def test_a_summary_without_words_is_refused_not_scored_perfect(tmp_path, book, text):
    """A summary of nothing but punctuation scored BooookScore 1.0 and 100% faithful (nothing in it
    to confuse or to be false); the commands refuse it when they read it, and so do the library calls."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import SystemConfig, run_book
    from booklens.steps import decompose_summary, score_summaries

    lm = pipeline_lm()
    with pytest.raises(BooklensError, match="the summary"):
        run_book(book, tmp_path / "run", SystemConfig(summary_text=text), lms=FixedLMPool(lm))
    assert not (tmp_path / "run").exists()
    with dspy.context(lm=lm):
        with pytest.raises(BooklensError, match="the summary 'a' (is empty|has no words)"):
            score_summaries({"a": text})
        with pytest.raises(BooklensError, match="the summary (is empty|has no words)"):
            decompose_summary(text)
        with pytest.raises(BooklensError, match="the summary must be text, not int"):
            decompose_summary(123)  # an AttributeError from the word check
    assert lm.backend.calls == []


@pytest.mark.parametrize("value", ["openai/gpt-4o-mini", None])
def test_configure_refuses_what_is_not_an_lm(value):
    """`configure("openai/gpt-4o-mini")` installed the string as DSPy's LM, and every program then
    failed deep inside DSPy; it names `make_lm` instead, and leaves DSPy's settings alone."""
    from booklens.lm import configure

    before = dspy.settings.lm
    with pytest.raises(BooklensError, match="make_lm"):
        configure(value)
    assert dspy.settings.lm is before


@pytest.mark.parametrize("judge, books, message", [
    ("coherance", None, "unknown judge 'coherance'"),  # was calibrated as the four-way verification judge
    ("coherence", 0, "books must be at least 1"),
    ("verification", -1, "books must be at least 1"),  # -1 silently left out one book of the sample
])
def test_calibrate_refuses_an_unknown_judge_or_books_below_one(tmp_path, judge, books, message):
    from booklens.calibration import calibrate

    with pytest.raises(BooklensError, match=message):
        calibrate(judge, None, pipeline_lm(), human_dir=tmp_path, fables_path=tmp_path / "fables", books=books)


@pytest.mark.parametrize("build, message", [
    (lambda: __import__("booklens.steps").steps.verify_claims(
        claims=["Mara finds the key."], book_text=BOOK_TEXT, mode="book", budget_tokens=0),
     "budget_tokens must be at least 64"),  # the claim was verified on no evidence at all
    (lambda: __import__("booklens.steps").steps.verify_claims(
        claims=["Mara finds the key."], book_text=BOOK_TEXT, mode="none", max_claims=0),
     "max_claims must be at least 1"),
    (lambda: __import__("programs.faithfulness").faithfulness.build_checker(evidence_mode="given", budget_tokens=-5),
     "budget_tokens must be at least 64"),
    (lambda: __import__("programs.faithfulness").faithfulness.build_verifier(tries=0), "tries must be at least 1"),
    (lambda: __import__("programs.faithfulness").faithfulness.build_decomposer(tries=0), "tries must be at least 1"),
])
def test_faithfulness_programs_refuse_budgets_and_tries_the_commands_refuse(build, message):
    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
        build()
    assert lm.backend.calls == []


@pytest.mark.parametrize("options, message", [
    ({"generate_questions": -1}, "generate_questions must be at least 0"),  # was taken as a request for questions
    ({"max_articles": 0}, "max_articles must be at least 1"),              # faithfulness judged against no article
    ({"concurrency": 0}, "concurrency must be at least 1"),
])
def test_diverse_runs_refuse_counts_the_commands_refuse(tmp_path, options, message):
    from booklens.diverse_runs import run_diverse

    events = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"
    lm = pipeline_lm()
    with pytest.raises(BooklensError, match=message):
        run_diverse(events, lm=lm, **options)
    assert lm.backend.calls == []


def test_judge_summaries_refuses_max_articles_below_one(tmp_path):
    """max_articles=0 judged faithfulness against every article, as if no limit had been given."""
    from booklens.diverse_runs import judge_summaries

    events = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"
    with pytest.raises(BooklensError, match="max_articles must be at least 1"):
        judge_summaries(events, tmp_path / "unread.json", criterion="faithfulness", max_articles=0, lm=pipeline_lm())


def test_summarize_book_without_a_book_and_make_summarizer_with_the_default_window(book):
    """summarize_book(None) was a TypeError from pathlib; make_summarizer(context_window=None), the
    value summarize_book takes for the default window, was a TypeError comparing None with an int."""
    from booklens.programs.summarizer import make_summarizer
    from booklens.steps import summarize_book
    from booklens.vocabulary import DEFAULT_CONTEXT_WINDOW

    with dspy.context(lm=pipeline_lm()), pytest.raises(BooklensError, match="the book must be a path, not None"):
        summarize_book(None)
    assert make_summarizer("hier", context_window=None).context_window == DEFAULT_CONTEXT_WINDOW


def test_programs_run_without_an_lm_say_so_instead_of_scoring_none():
    """Called before any LM was configured, the judge returned a score of None after re-asking each
    sentence three times ('unparseable answer: No LM is loaded...'), and the decomposer no claims:
    a library user's missing `dspy.configure` looked like a model that could not answer."""
    from booklens.judges import load_judge
    from booklens.programs.faithfulness import ClaimDecomposer

    with dspy.context(lm=None):
        with pytest.raises(BooklensError, match="no language model configured"):
            load_judge("coherence", concurrency=1)(summary=SUMMARY)
        with pytest.raises(BooklensError, match="no language model configured"):
            ClaimDecomposer()(summary=SUMMARY)


@pytest.mark.parametrize("summary", [None, "", "   "])
def test_the_coherence_judge_refuses_an_empty_summary_as_the_decomposer_does(summary):
    """README's `load_judge("coherence")(summary=...)`: an empty summary scored None without a word,
    None was a TypeError; the decomposer already said 'the summary is empty'."""
    from booklens.judges import load_judge

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match="the summary is empty"):
        load_judge("coherence", concurrency=1)(summary=summary)
    assert lm.backend.calls == []


@pytest.mark.parametrize("given, message", [
    ({"sentences": "Mara finds the key."}, "sentences must be a list of sentences, not one string"),
    ({"sentences": ["Mara finds the key."], "targets": "Mara finds the key."},
     "targets must be a list of sentences, not one string"),
    ({"sentences": ["Mara finds the key.", 7]}, "sentences must be a list of sentences, not a list holding int"),
    ({"sentences": ["Mara finds the key.", None]}, "not a list holding NoneType"),
    ({"sentences": 7}, "sentences must be a list of sentences, not int"),
])
def test_the_coherence_judge_refuses_sentences_that_are_not_a_list_of_sentences(given, message):
    """A string given as the sentences was judged one character at a time, a call for each, and
    scored as if it were a summary of one-letter sentences."""
    from booklens.judges import load_judge

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
        load_judge("coherence", concurrency=1)(summary=SUMMARY, **given)
    assert lm.backend.calls == []


def test_run_book_qa_counts_only_its_own_calls_when_another_run_shares_the_lm(tmp_path):
    """Usage was the difference of the shared LM's counters before and after the run, so calls
    another thread made on the same LM meanwhile were counted in this run's usage too."""
    import json
    import threading

    from booklens.qa_runs import run_book_qa

    book = tmp_path / "the_lamp.txt"
    book.write_text(BOOK_TEXT)
    files = {}
    for qid, question in (("SLOW", "Where does Mara walk?"), ("FAST", "Whom does Mara meet?")):
        files[qid] = tmp_path / f"{qid}.json"
        files[qid].write_text(json.dumps([{"QID": qid, "Question": question, "Aspect": "plot", "Complexity": "sh",
                                           "Options": {"A": "Tom", "B": "The mill"}, "Answer": "The mill",
                                           "Gold": "B", "Evidences": []}]))
    slow_started, fast_done = threading.Event(), threading.Event()

    def respond(call):
        if "Where does Mara walk?" in call.messages[-1]["content"]:
            slow_started.set()
            fast_done.wait(30)
        return {"answer": "B"}

    lm = ScriptedLM(respond)
    results = {}
    slow = threading.Thread(target=lambda: results.update(slow=run_book_qa(book, files["SLOW"], lm=lm,
                                                                           cache_dir=tmp_path / "c")))
    slow.start()
    assert slow_started.wait(30)
    results["fast"] = run_book_qa(book, files["FAST"], lm=lm, cache_dir=tmp_path / "c")
    fast_done.set()
    slow.join()
    assert len(lm.backend.calls) == 2
    assert results["fast"]["usage"]["calls"] == 1 and results["slow"]["usage"]["calls"] == 1


def test_run_book_refuses_retrieved_evidence_that_cannot_fit_the_judge_window(tmp_path):
    """A run whose judge would be shown more passages than its window holds stopped at the
    verification step, after the summary and the claims; it is refused before any call."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book

    path = tmp_path / "long.txt"
    path.write_text(" ".join(f"Mara walked to the mill on day {n} and met Tom there by the old gate."
                             for n in range(500)))
    lm = pipeline_lm(context_window=2048)
    with pytest.raises(BooklensError, match=r"^k 12 passages of up to passage_tokens 256 tokens: 3072 tokens"):
        # zero-shot: the few-shot judge's demos alone fill 2048 tokens
        run_book(path, tmp_path / "run", SystemConfig(**SMALL), JudgeConfig(k=12, zero_shot=True), lms=FixedLMPool(lm))
    assert lm.backend.calls == [] and not (tmp_path / "run").exists()


def test_run_book_shows_the_judge_the_demos_its_window_holds_beside_the_passages(tmp_path):
    """Two passages of 256 tokens fit a 2048-token judge window beside four of the verifier's six
    demos: the run refused them (advising zero-shot); now every verification shows the first four,
    the run says so once, and run.json and the verification record both say how many were shown."""
    import json

    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book
    from booklens.testing import pipeline_step

    path = tmp_path / "long.txt"
    path.write_text(" ".join(f"Mara walked to the mill on day {n} and met Tom there by the old gate."
                             for n in range(500)))
    lm = pipeline_lm(context_window=2048)
    run = run_book(path, tmp_path / "run", SystemConfig(**SMALL), JudgeConfig(k=2, steps=["faithfulness"]),
                   lms=FixedLMPool(lm), notify=lambda line: None)
    note = ("the judge is shown 4 of its 6 demos: its 2048-token context window holds no more beside 2 passages "
            "of up to 256 tokens")
    verifications = [call for call in lm.backend.calls if pipeline_step({"messages": call.messages}) == "verify"]
    assert verifications and {sum(m["role"] == "assistant" for m in call.messages) for call in verifications} == {4}
    assert not run.failures
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["judges"]["verification"]
    assert (recorded["demos"], recorded["demos_shown"], recorded["demos_note"]) == (6, 4, note)
    report = json.loads((tmp_path / "run" / "faithfulness.json").read_text())
    assert (report["judge"]["demos_shown"], report["judge"]["demos_note"]) == (4, note)


def test_run_book_refuses_a_book_budget_that_cannot_fit_the_judge_window(tmp_path):
    """evidence book with a budget_tokens larger than the judge's window failed at every claim's
    verification, after the summary and the claims; it is refused before any call."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book

    path = tmp_path / "long.txt"
    path.write_text(" ".join(f"Mara walked to the mill on day {n} and met Tom there by the old gate."
                             for n in range(500)))
    lm = pipeline_lm(context_window=2048)
    with pytest.raises(BooklensError, match=r"^budget_tokens 3000: 3000 tokens of evidence per claim, more than"):
        run_book(path, tmp_path / "run", SystemConfig(**SMALL),
                 JudgeConfig(evidence="book", budget_tokens=3000, zero_shot=True), lms=FixedLMPool(lm))
    assert lm.backend.calls == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("summary, kind", [([SUMMARY], "list"), (7, "int"), ({"a": SUMMARY}, "dict")])
@pytest.mark.parametrize("program", ["coherence judge", "claim decomposer"])
def test_the_summary_programs_name_a_summary_that_is_not_text(program, summary, kind):
    """A list of sentences handed as README's `summary=` was 'the summary is empty' to the coherence
    judge (it is not empty) and an AttributeError ('list' has no 'strip') to the decomposer."""
    from booklens.judges import load_judge
    from booklens.programs.faithfulness import ClaimDecomposer

    run = load_judge("coherence", concurrency=1) if program == "coherence judge" else ClaimDecomposer()
    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=f"^the summary must be text, not {kind}$"):
        run(summary=summary)
    assert lm.backend.calls == []


@pytest.mark.parametrize("given, message", [
    ({"system": "hier"}, r"^system must be a booklens\.pipeline\.SystemConfig, not the string 'hier'"),
    ({"judge": {"evidence": "bm25"}}, r"^judge must be a booklens\.pipeline\.JudgeConfig, not dict"),
    ({"lms": "openai/gpt-4o-mini"},
     r"^lms must be a booklens\.lm\.LMPool, not the string 'openai/gpt-4o-mini': "
     r"build one with LMPool\('openai/gpt-4o-mini'\)"),
    ({"lms": "scripted LM"}, r"^lms must be a booklens\.lm\.LMPool, not BooklensLM: .*FixedLMPool\(lm\)"),
])
def test_run_book_names_a_configuration_or_pool_of_the_wrong_kind(tmp_path, book, given, message):
    """A model name given as `lms`, or a method name as the system, was an AttributeError from inside
    the pipeline ('str' object has no attribute 'get' / 'given')."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import run_book

    lm = pipeline_lm()
    options = {"lms": FixedLMPool(lm), **given}
    if options["lms"] == "scripted LM":  # an LM where the pool goes
        options["lms"] = lm
    with pytest.raises(BooklensError, match=message):
        run_book(book, tmp_path / "run", **options)
    assert lm.backend.calls == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("build, message", [
    (lambda: __import__("booklens.lm").lm.LMPool("openai/gpt-4o-mini", concurrency=0),
     r"^concurrency must be at least 1 \(got 0\)$"),   # was run with 1 call in flight, as if asked
    (lambda: __import__("booklens.lm").lm.LMPool("openai/gpt-4o-mini", concurrency="8"),
     r"^concurrency must be at least 1 \(got '8'\)$"),  # was taken; "many" was int()'s ValueError
    (lambda: __import__("booklens.lm").lm.LMPool(5), r"^lm must be a model string .*, not int$"),
    (lambda: __import__("booklens.lm").lm.make_lm(["openai/gpt-4o-mini"]), r"^lm must be a model string .*, not list$"),
    (lambda: __import__("booklens.lm").lm.make_lm("openai/gpt-4o-mini", api_base=8000),
     r"^api_base must be a server URL .*, not int$"),
    (lambda: __import__("booklens.lm").lm.LMPool("openai/gpt-4o-mini", api_base=8000),
     r"^api_base must be a server URL .*, not int$"),
])
def test_lms_refuse_a_model_server_or_concurrency_of_the_wrong_kind(tmp_path, monkeypatch, build, message):
    """Each was an AttributeError ('int' object has no attribute 'strip') when the LM was made, or a
    concurrency quietly changed to 1."""
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path))
    with pytest.raises(BooklensError, match=message):
        build()


@pytest.mark.parametrize("call, message", [
    (lambda run, dry, table: dry(None, "sweep"), r"^the manifest must be a path, not None$"),
    (lambda run, dry, table: dry("corpus.yaml", None), r"^the sweep directory must be a path, not None$"),
    (lambda run, dry, table: run(None, "sweep", lm="openai/fake"), r"^the manifest must be a path, not None$"),
    (lambda run, dry, table: run("corpus.yaml", None, lm="openai/fake"), r"^the sweep directory must be a path"),
    (lambda run, dry, table: dry("corpus.yaml", "sweep", lm=5), r"^lm must be a model string .*, not int$"),
    (lambda run, dry, table: run("corpus.yaml", "sweep", lm="openai/fake", api_base=8000),
     r"^api_base must be a server URL .*, not int$"),
    (lambda run, dry, table: table(None, "latex"), r"^the sweep directory must be a path, not None$"),
])
def test_sweeps_name_a_manifest_directory_or_model_of_the_wrong_kind(tmp_path, monkeypatch, call, message):
    """Each was a TypeError from pathlib ('expected str, bytes or os.PathLike object, not NoneType')
    or an AttributeError ('int' object has no attribute 'strip')."""
    from booklens.sweep.run import dry_run, run_sweep
    from booklens.sweep.tables import sweep_table

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "book.txt").write_text(BOOK_TEXT)
    (tmp_path / "corpus.yaml").write_text("books: [book.txt]\nsystems:\n  - {name: h, method: hier}\n")
    with pytest.raises(BooklensError, match=message):
        call(run_sweep, dry_run, sweep_table)
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("options, message", [
    ({"chunk_size": "512"}, r"^chunk_size must be at least 64 tokens \(got '512'\)$"),  # a TypeError ('<' between str and int)
    ({"max_summary_tokens": None}, r"^max_summary_tokens must be at least 16 tokens \(got None\)$"),
    ({"context_window": 4096.5}, r"^context_window must be at least \d+ tokens \(got 4096\.5\)$"),
])
def test_make_summarizer_names_a_token_count_that_is_not_a_whole_number(options, message):
    from booklens.programs.summarizer import make_summarizer

    with pytest.raises(BooklensError, match=message):
        make_summarizer("hier", **options)


@pytest.mark.parametrize("book_text, message", [
    (123, r"^the book text must be text, not int$"),  # an AttributeError ('int' has no 'strip')
    (Path("book.txt"), r"^the book text must be text, not PosixPath: read the book with booklens\.text\.read_book"),
])
def test_verify_claims_names_a_book_text_that_is_not_text(tmp_path, book_text, message):
    from booklens.steps import verify_claims

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match=message):
        verify_claims(claims=["Mara finds the key."], book_text=book_text, cache_dir=tmp_path / "c")
    assert lm.backend.calls == []


@pytest.mark.parametrize("build, message", [
    (lambda c: c.SystemConfig(chunk_size=-3), "SystemConfig: chunk_size: Input should be greater than or equal to 64"),
    (lambda c: c.SystemConfig(max_regenerations=10**9), "SystemConfig: max_regenerations: must be from 0 to 10"),
    (lambda c: c.SystemConfig(chunk_sise=512), "SystemConfig: chunk_sise: Extra inputs are not permitted"),
    (lambda c: c.SystemConfig(level_budgets=[1, 2]),
     "SystemConfig: level_budgets.0: Input should be greater than or equal to 16"),
    (lambda c: c.JudgeConfig(k="x"), "JudgeConfig: k: Input should be a valid integer"),
    (lambda c: c.JudgeConfig(steps=["coherance"]), "JudgeConfig: steps.0: Input should be 'coherence' or"),
])
def test_a_config_record_given_a_bad_value_is_one_line_naming_the_field(build, message):
    """pydantic words a bad value over four lines (a count, the field, the problem with its input,
    a link); the configs a library caller builds say it in one, as a command would, and stay the
    ValueError they were."""
    import booklens.pipeline as configs

    with pytest.raises(ValueError) as caught:
        build(configs)
    assert isinstance(caught.value, BooklensError)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("build, message", [
    (lambda c: c.SystemConfig.model_validate({"chunk_size": 3}),
     r"^SystemConfig: chunk_size: Input should be greater than or equal to 64 \(got 3\)$"),
    (lambda c: c.JudgeConfig.model_validate({"k": "x"}), r"^JudgeConfig: k: Input should be a valid integer"),
    (lambda c: c.SystemConfig.model_validate_json('{"method": "hierr"}'), r"^SystemConfig: method: Input should be"),
    (lambda c: c.SystemConfig.model_validate("hier"),
     r"^SystemConfig: Input should be a valid dictionary or instance of SystemConfig \(got 'hier'\)$"),
])
def test_a_config_record_read_with_model_validate_is_one_line_too(build, message):
    """A config read back from JSON (a sweep's cell task, a caller's saved settings) fails as one
    built by hand does: pydantic would wrap the one-line error in its own four lines."""
    import booklens.pipeline as configs

    with pytest.raises(ValueError) as caught:
        build(configs)
    assert isinstance(caught.value, BooklensError), repr(caught.value)
    assert re.search(message, str(caught.value)) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("build, message", [
    (lambda c: c.SystemConfig(level_budgets=[1, 2]),
     "SystemConfig: level_budgets.0: Input should be greater than or equal to 16 (got 1) (and 1 more problem: "
     "level_budgets.1)"),
    (lambda c: c.SystemConfig.model_validate({"chunk_size": "x", "lm": 3, "methd": "inc"}),
     "SystemConfig: chunk_size: Input should be a valid integer, unable to parse string as an integer (got 'x') "
     "(and 2 more problems: lm, methd)"),
    (lambda c: c.JudgeConfig(k=0, batch_size=0), "JudgeConfig: k: Input should be greater than or equal to 1 (got 0) "
     "(and 1 more problem: batch_size)"),
    # an evidence mode was any string until run_book refused it: a config kept (or read back) for later
    # held a value no run takes
    (lambda c: c.JudgeConfig(evidence="hybird", k=0), "JudgeConfig: evidence: no evidence mode of a book run: use "
     "one of none, bm25, dense, hybrid, book (got 'hybird') (and 1 more problem: k)"),
    (lambda c: c.JudgeConfig.model_validate_json('{"evidence": "given"}'), "JudgeConfig: evidence: no evidence mode "
     "of a book run: use one of none, bm25, dense, hybrid, book (got 'given')"),
])
def test_a_config_record_with_several_bad_values_names_them_all_in_one_line(build, message):
    """The first problem in full, then where the others are: a caller fixing one does not meet the next
    only on the following try."""
    import booklens.pipeline as configs

    with pytest.raises(BooklensError) as caught:
        build(configs)
    assert str(caught.value) == message


def test_readmes_config_error_example_is_what_a_config_with_those_problems_says():
    """README quotes a config's first problem and, after it, the places of the others. It named
    `lm, method` after `chunk_size`, which no config can say: `method` comes before `chunk_size`, so
    a bad method is always the problem named first."""
    import booklens.pipeline as configs

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8").replace("\n", " ")
    quoted = re.search(r"as a command would \(`(SystemConfig: chunk_size: [^`]+)`, then `(\(and [^`]+\))`", readme)
    assert quoted, "README quotes a config error and the others it names"
    first, others = quoted.groups()
    places = re.fullmatch(r"\(and 2 more problems: (\w+), (\w+)\)", others).groups()
    bad = {"chunk_size": 10, "method": "x", "lm": 5, "max_summary_tokens": 1, "api_base": 5}
    with pytest.raises(BooklensError) as caught:
        configs.SystemConfig(chunk_size=10, **{place: bad[place] for place in places})
    assert str(caught.value) == f"{first} {others}"


def _qa_question():
    from booklens.data.novelqa import parse_questions

    return parse_questions([{"QID": "T-1", "Question": "Where does Mara walk?", "Aspect": "plot", "Complexity": "sh",
                             "Options": {"A": "To the sea", "B": "To the mill"}, "Answer": "To the mill",
                             "Gold": "B", "Evidences": []}])


def _answer(**given):
    from programs.qa import BookQA, answer_questions

    arguments = {"program": BookQA("mc", "book"), "book": BOOK_TEXT, "questions": _qa_question(), **given}
    return answer_questions(arguments.pop("program"), arguments.pop("book"), arguments.pop("questions"), **arguments)


def _module(name):
    import importlib

    return importlib.import_module(name)


# (call, the message's start: it names the argument). Each was a TypeError, AttributeError or
# ValueError from deep inside, or (where noted) a run that asked the LM about nothing.
WRONG_ARGUMENTS = {
    "answer_questions-program-none": (lambda tmp: _answer(program=None), r"^program must be a BookQA, not NoneType"),
    "answer_questions-program-name": (lambda tmp: _answer(program="mc"), r"^program must be a BookQA, not the string"),
    "answer_questions-book-path": (lambda tmp: _answer(book=tmp / "book.txt"),
                                   r"^the book text must be text, not PosixPath: read the book with"),
    "answer_questions-book-empty": (lambda tmp: _answer(book=""), r"^the book text is empty$"),  # asked, guessed
    "answer_questions-book-no-words": (lambda tmp: _answer(book="... \u2026"), r"^the book text has no words"),
    "answer_questions-questions-none": (lambda tmp: _answer(questions=None),
                                        r"^questions must be a list of NovelQA questions, not NoneType: read a"),
    "answer_questions-questions-file": (
        lambda tmp: _answer(questions=tmp / "q.json"),
        r"^questions must be a list of NovelQA questions, not a path: .*load_questions\(path\)"),
    "answer_questions-one-question": (lambda tmp: _answer(questions=_qa_question()[0]),
                                      r"^questions must be a list of NovelQA questions, not one question"),
    "answer_questions-records": (lambda tmp: _answer(questions=[{"QID": "T-1"}]),
                                 r"^question 1 is dict, not a NovelQA question: .*parse_questions"),
    "answer_questions-concurrency-zero": (lambda tmp: _answer(concurrency=0),  # ran on one thread
                                          r"^concurrency must be at least 1 \(got 0\)$"),
    "summarize_book-text-path": (lambda tmp: _module("booklens.steps").summarize_book(
        tmp / "book.txt", text=tmp / "book.txt", **SMALL), r"^the book text must be text, not PosixPath: read the book"),
    "summarize_book-program-int": (lambda tmp: _module("booklens.steps").summarize_book(
        tmp / "book.txt", program_path=5, **SMALL), r"^program_path must be a path, not 5"),
    "book_index-path": (lambda tmp: _module("booklens.steps").book_index(tmp / "book.txt", cache_dir=tmp / "c"),
                        r"^the book text must be text, not PosixPath"),
    "score_summaries-book-texts-str": (lambda tmp: _module("booklens.steps").score_summaries(
        {"a": SUMMARY}, book_texts=BOOK_TEXT), r"^book_texts must be a mapping of the summaries' names"),
    "score_summaries-book-text-path": (lambda tmp: _module("booklens.steps").score_summaries(
        {"a": SUMMARY}, book_texts={"a": tmp / "book.txt"}), r"^the book text of 'a' must be text, not PosixPath"),
    "score_summaries-name-int": (lambda tmp: _module("booklens.steps").score_summaries({5: SUMMARY}),
                                 r"^summaries must be named by text, not int \(5\)$"),  # pydantic's, after 3 calls
    "verify_claims-given-str": (lambda tmp: _module("booklens.steps").verify_claims(
        claims=["Mara finds the key."], book_text=None, mode="given", given="Mara found it.", cache_dir=tmp / "c"),
        r"^given must be a list of quote lists, one per claim, not str$"),  # judged on quotes 'M', 'a', ...
    "verify_claims-given-quotes-str": (lambda tmp: _module("booklens.steps").verify_claims(
        claims=["Mara finds the key."], book_text=None, mode="given", given=["Mara found it."], cache_dir=tmp / "c"),
        r"^given: the quotes of claim 1 must be a list of quotes, not one string$"),
    "verify_claims-book-int": (lambda tmp: _module("booklens.steps").verify_claims(
        claims=["Mara finds the key."], book_text=BOOK_TEXT, book=5, cache_dir=tmp / "c"),
        r"^book must be a path, not 5$"),  # recorded as the report's book '5'
    "run_book-book-text-path": (lambda tmp: _module("booklens.pipeline").run_book(
        tmp / "book.txt", tmp / "run", _module("booklens.pipeline").SystemConfig(**SMALL),
        lms=_module("booklens.lm").FixedLMPool(pipeline_lm()), book_text=tmp / "book.txt"),
        r"^the book text must be text, not PosixPath"),
    "run_diverse-cache-dir-int": (lambda tmp: _module("booklens.diverse_runs").run_diverse(
        Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json",
        lm=dspy.settings.lm, cache_dir=5), r"^cache_dir must be a path, not 5$"),  # ignored, with an LM object
    "run_sweep-cache-dir-int": (lambda tmp: _module("booklens.sweep.run").run_sweep(
        tmp / "corpus.yaml", tmp / "sweep", lm="openai/fake", cache_dir=5), r"^cache_dir must be a path, not 5$"),
    "run_sweep-ray-cpus-zero": (lambda tmp: _module("booklens.sweep.run").run_sweep(
        tmp / "corpus.yaml", tmp / "sweep", lm="openai/fake", engine="ray", ray_cpus=0),
        r"^ray_cpus must be at least 1 \(got 0\)$"),  # a local Ray on every core, as if not given
    "run_sweep-fail-fast-str": (lambda tmp: _module("booklens.sweep.run").run_sweep(
        tmp / "corpus.yaml", tmp / "sweep", lm="openai/fake", fail_fast="no"),
        r"^fail_fast must be True or False, not 'no'$"),  # read as True
    "summarize_book-flag-str": (lambda tmp: _module("booklens.steps").summarize_book(
        tmp / "book.txt", remove_artifacts="no", **SMALL), r"^remove_artifacts must be True or False, not 'no'$"),
    "summarize_book-drop-matter-str": (lambda tmp: _module("booklens.steps").summarize_book(
        tmp / "book.txt", drop_matter="no", **SMALL), r"^drop_matter must be True or False, not 'no'$"),
    "summarize_book-budgets-str": (lambda tmp: _module("booklens.steps").summarize_book(
        tmp / "book.txt", level_budgets="512", **SMALL),  # its last character taken for the final budget
        r"^level_budgets must be a list of token budgets, one per level, not the string '512'$"),
    "score_coherence-as-set-str": (lambda tmp: _module("booklens.steps").score_coherence(
        {"a": SUMMARY}, as_set="no"), r"^as_set must be True or False, not 'no'$"),  # a set, after the calls
    "score_summaries-scorer-name": (lambda tmp: _module("booklens.steps").score_summaries(
        {"a": SUMMARY}, scorer="coherence"),  # 'cannot save the compiled program as JSON'
        r"^scorer must be a coherence judge: .*, not the string 'coherence'$"),
    "decompose_summary-decomposer-name": (lambda tmp: _module("booklens.steps").decompose_summary(
        SUMMARY, decomposer="zero-shot"), r"^decomposer must be a claim decomposer: .*, not the string"),
    "verify_claims-programs-str": (lambda tmp: _module("booklens.steps").verify_claims(
        claims=["Mara finds the key."], book_text=BOOK_TEXT, programs="judge.json", cache_dir=tmp / "c"),
        r"^programs must be a mapping of tasks to programs"),
    "answer_questions-judge-name": (lambda tmp: _answer(judge="llm"),
                                    r"^judge must be an AnswerJudge, not the string 'llm'$"),
    "judge_programs-unknown-task": (lambda tmp: _module("booklens.judges").judge_programs(tasks=["coherance"]),
                                    r"^unknown judge task 'coherance' in tasks: use coherence, decomposition"),
    "sweep_table-format": (lambda tmp: _module("booklens.sweep.tables").sweep_table(tmp, "md"),
                           r"^unknown table format 'md': use markdown, latex, csv, csv-pairs$"),
    "sweep_table-not-a-sweep": (lambda tmp: _module("booklens.sweep.tables").sweep_table(tmp, "markdown"),
                                r"^\S+ is not a booklens sweep directory \(it has no \S+\): sweep_table prints the "
                                r"comparison of a sweep directory's results\.json$"),  # not `report`'s --table
    "run_book-notify-str": (lambda tmp: _module("booklens.pipeline").run_book(
        tmp / "book.txt", tmp / "run", _module("booklens.pipeline").SystemConfig(**SMALL),
        lms=_module("booklens.lm").FixedLMPool(dspy.settings.lm), notify="print"),  # after the summary's calls
        r"^notify must be a function that takes a line of text \(print\), not the string 'print'$"),
    "FixedLMPool-model-name": (lambda tmp: _module("booklens.lm").FixedLMPool("openai/gpt-4o-mini"),
                               r"^FixedLMPool takes an LM, not the string 'openai/gpt-4o-mini'"),  # failed at the call
    "run_sweep-progress-interval": (lambda tmp: _module("booklens.sweep.run").run_sweep(
        tmp / "corpus.yaml", tmp / "sweep", lm="openai/fake", progress_interval=0),  # redrawn without a pause
        r"^progress_interval must be a number of seconds above 0 \(got 0\)$"),
    "run_sweep-stream-str": (lambda tmp: _module("booklens.sweep.run").run_sweep(
        tmp / "corpus.yaml", tmp / "sweep", lm="openai/fake", stream="stderr"),
        r"^stream must be a text stream such as sys\.stderr, not the string 'stderr'$"),
    "rebuild_sweep_report-int": (lambda tmp: _module("booklens.sweep.report").rebuild_sweep_report(5),
                                 r"^the sweep directory must be a path, not 5$"),
    "rebuild_sweep_report-output-int": (lambda tmp: _module("booklens.sweep.report").rebuild_sweep_report(tmp, 5),
                                        r"^output must be a path, not 5"),
    "load_judge-program-int": (lambda tmp: _module("booklens.judges").load_judge("coherence", 5),
                               r"^program must be a path, not 5"),
    "judge_programs-artifacts-path": (lambda tmp: _module("booklens.judges").judge_programs("judge.json"),
                                      r"^artifacts must be a mapping of tasks to program files"),
    "judge_programs-artifact-int": (lambda tmp: _module("booklens.judges").judge_programs({"coherence": 5}),
                                    r"^the coherence program must be a path, not 5$"),
    "build_defaults-human-dir-none": (lambda tmp: _module("booklens.judges").build_defaults(
        None, tmp / "fables.jsonl", tmp / "judges"), r"^human_dir must be a path, not None"),
    "build_coherence_default-int": (lambda tmp: _module("booklens.judges").build_coherence_default(5),
                                    r"^human_dir must be a path, not 5"),
    "build_verification_default-none": (lambda tmp: _module("booklens.judges").build_verification_default(None),
                                        r"^fables_path must be a path, not None"),
    "calibrate-human-dir-int": (lambda tmp: _module("booklens.calibration").calibrate(
        "coherence", _module("booklens.judges").load_judge("coherence"), dspy.settings.lm, human_dir=5),
        r"^human_dir must be a path, not 5"),
    "calibrate-program-none": (lambda tmp: _module("booklens.calibration").calibrate(
        "coherence", None, dspy.settings.lm, human_dir=tmp),
        r"^program must be a judge program \(booklens\.judges\.load_judge\('coherence'\)\), not NoneType$"),
    "calibrate-program-name": (lambda tmp: _module("booklens.calibration").calibrate(
        "verification", "verification", dspy.settings.lm, fables_path=tmp / "FABLES.json"),
        r"^program must be a judge program .*, not the string 'verification'$"),
    "calibrate-lm-name": (lambda tmp: _module("booklens.calibration").calibrate(
        "coherence", _module("booklens.judges").load_judge("coherence"), "openai/gpt-4o-mini", human_dir=tmp),
        r"^lm takes an LM, not the string 'openai/gpt-4o-mini'"),  # stored as this model's, measured with another
    "coherence_sample-int": (lambda tmp: _module("booklens.calibration").coherence_sample(5),
                             r"^human_dir must be a path, not 5"),
    "coherence_sample-books-negative": (lambda tmp: _module("booklens.calibration").coherence_sample(tmp, books=-1),
                                        r"^books must be at least 1 \(got -1\)$"),  # was 'no annotation files'
    "verification_sample-none": (lambda tmp: _module("booklens.calibration").verification_sample(None),
                                 r"^fables_path must be a path, not None"),
    "calibrate_verification-none": (lambda tmp: _module("booklens.calibration").calibrate_verification(
        _module("booklens.judges").load_judge("verification"), fables_path=None),
        r"^fables_path must be a path, not None"),
}


@pytest.mark.parametrize("case", list(WRONG_ARGUMENTS))
def test_library_entry_points_name_an_argument_of_the_wrong_kind_before_any_call(tmp_path, monkeypatch, case):
    """Each entry point a notebook calls, handed a value of the wrong kind (None, a path where text
    goes or text where a path goes, one item where a list goes, a count below one): one
    `BooklensError` line naming the argument, and no LM call made."""
    call, message = WRONG_ARGUMENTS[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "book.txt").write_text(BOOK_TEXT)
    (tmp_path / "q.json").write_text("[]")
    (tmp_path / "corpus.yaml").write_text("books: [book.txt]\nsystems:\n  - {name: h, method: hier}\n")
    lm = ScriptedLM(lambda call: {"answer": "B"}) if case.startswith("answer_questions") else pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError) as caught:
        call(tmp_path)
    assert re.search(message, str(caught.value)) and "\n" not in str(caught.value), str(caught.value)
    assert lm.backend.calls == []
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_verify_claims_takes_claims_and_quotes_from_any_iterable(tmp_path):
    """A generator of claims was refused as 'not a list'; a generator of quote lists was read once to
    check it and found empty when the claims were judged."""
    from booklens.steps import verify_claims

    lm = pipeline_lm()
    claims = ["Mara finds the key.", "Tom hides the letter."]
    with dspy.context(lm=lm):
        report = verify_claims(claims=(c for c in claims), book_text=None, mode="given",
                               given=(quotes for quotes in (("Mara found the key.",), ["Tom hid it."])),
                               cache_dir=tmp_path / "c")
    assert [verdict.claim for verdict in report.claims] == claims
    assert len(lm.backend.calls) == 2


def test_verify_claims_with_max_claims_keeps_each_claims_quotes(tmp_path):
    """max_claims cuts the quotes with the claims: the verified claim is shown its own quote."""
    from booklens.steps import verify_claims

    lm = pipeline_lm()
    claims = ["Mara finds the key.", "Tom hides the letter.", "Mara reads the letter."]
    with dspy.context(lm=lm):
        report = verify_claims(claims=claims, book_text=None, mode="given", max_claims=1,
                               given=[["Mara found the key."], ["Tom hid it."], ["She read it."]],
                               cache_dir=tmp_path / "c")
    assert [verdict.claim for verdict in report.claims] == claims[:1] and report.total_claims == 3
    assert [e.text for e in report.claims[0].evidence] == ["Mara found the key."]
    assert len(lm.backend.calls) == 1


def test_level_budgets_and_verbosity_protocols_may_come_from_any_iterable(tmp_path, book):
    """A tuple or generator of level budgets was a TypeError ('generator' is not subscriptable) and a
    generator of verbosity protocols was refused as 'not a list'; both are read as the list would be."""
    import json

    from booklens.data.diversesumm import load_events
    from booklens.diverse_runs import verbosity_bias_study
    from booklens.steps import summarize_book

    with dspy.context(lm=pipeline_lm()):
        summary = summarize_book(book, level_budgets=(budget for budget in (128, 128)),
                                 **{**SMALL, "max_summary_tokens": 128})
    assert summary.config.level_budgets == [128, 128]

    events = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"
    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({load_events(events)[0].eid: "The bridge closed for repairs."}))
    lm = ScriptedLM(lambda call: {"explanation": "fine", "rating": 1})
    study = verbosity_bias_study(events, summaries, criterion="faithfulness", protocols=(p for p in ["single"]),
                                 max_articles=1, lm=lm, cache_dir=tmp_path / "c")
    assert study["protocols"] == ["single"] and len(lm.backend.calls) == 2


def test_summarize_book_from_text_alone_records_no_book_path_and_refuses_wordless_text():
    """`summarize_book(None, text=...)` recorded its book as the path "None"; a text of punctuation
    alone was chunked and sent to the model."""
    from booklens.steps import summarize_book

    lm = pipeline_lm()
    with dspy.context(lm=lm):
        with pytest.raises(BooklensError, match="the book text has no words"):
            summarize_book(text="... --- ...", **SMALL)
        assert lm.backend.calls == []
        record = summarize_book(text=BOOK_TEXT, **SMALL)
    assert record.book is None
    assert record.summary and len(lm.backend.calls) >= 1


def test_score_summaries_refuses_a_book_text_without_words():
    """`book_texts={"a": ""}` was taken as the book: every trigram of the summary counted as novel."""
    from booklens.steps import score_summaries

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError, match="the book text of 'a' is empty"):
        score_summaries({"a": SUMMARY}, book_texts={"a": ""})
    assert lm.backend.calls == []


WRONG_KINDS = {
    "compile-data": ("plan_compile", lambda d: (("verification", None, d / "a.json"), {"optimizer": "labeled"}),
                     "data must be a path, not None"),
    "compile-demos": ("plan_compile", lambda d: (("verification", d / "f.json", d / "a.json"),
                                                 {"optimizer": "labeled", "demos": "4"}), "demos must be 0 or more"),
    "compile-test-size": ("plan_compile", lambda d: (("verification", d / "f.json", d / "a.json"),
                                                     {"optimizer": "labeled", "test_size": -1}),
                          r"test_size must be 0 \(the whole split\) or more \(got -1\)"),
    "compile-flag": ("plan_compile", lambda d: (("verification", d / "f.json", d / "a.json"),
                                                {"optimizer": "labeled", "evaluate_test": "no"}),
                     "evaluate_test must be True or False"),
    "compile-task": ("plan_compile", lambda d: ((5, d / "f.json", d / "a.json"), {"optimizer": "labeled"}),
                     "task must be a name, not int"),
    "evaluate-programs": ("plan_evaluation", lambda d: (("verification", d / "f.json"), {"programs": d / "a.json"}),
                          "programs must be a list of artifact paths"),
    "evaluate-split": ("plan_evaluation", lambda d: (("verification", d / "f.json"), {"split": "validation"}),
                       "split must be one of train, dev, test"),
    "evaluate-threads": ("plan_evaluation", lambda d: (("verification", d / "f.json"), {"threads": 0}),
                         "threads must be at least 1"),
    "calibrate-judges": ("plan_calibration", lambda d: (("coherence",), {}),
                         "judges must be a list of judge names, not the string 'coherence'"),
    "calibrate-books": ("plan_calibration", lambda d: ((), {"books": 0}), "books must be at least 1"),
    "calibrate-program": ("plan_calibration", lambda d: ((), {"program": 7}), "program must be a path, not 7"),
    "annotations-limit": ("score_annotations", lambda d: ((d / "a.json",), {"limit": 0}),
                          "limit must be at least 1"),
    "annotations-path": ("score_annotations", lambda d: ((None,), {}), "annotations must be a path, not None"),
}


@pytest.mark.parametrize("case", list(WRONG_KINDS))
def test_compile_evaluate_calibrate_and_annotations_refuse_arguments_of_the_wrong_kind(tmp_path, case):
    """As the commands refuse their options: one line naming the argument, before any file is read."""
    from booklens.calibration import plan_calibration
    from booklens.data.booookscore import score_annotations
    from booklens.optimizers.workflow import plan_compile, plan_evaluation

    functions = {f.__name__: f for f in (plan_compile, plan_evaluation, plan_calibration, score_annotations)}
    name, arguments, message = WRONG_KINDS[case]
    args, kwargs = arguments(tmp_path)
    with pytest.raises(BooklensError, match=message):
        functions[name](*args, **kwargs)


def test_a_count_below_its_bound_is_named_as_the_keyword_in_python_and_as_the_option_in_a_command(tmp_path):
    """A library caller was told `--tries must be ...` of an argument spelled `tries`; a command's
    line names its option as before, from the same check."""
    from booklens.steps import score_summaries
    from booklens.testing import run_command

    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError) as raised:
        score_summaries({"a": SUMMARY}, tries=0)
    assert str(raised.value) == "tries must be from 1 to 10 (got 0)"
    with dspy.context(lm=lm), pytest.raises(BooklensError) as raised:
        score_summaries({"a": SUMMARY}, concurrency=0)
    assert str(raised.value) == "concurrency must be at least 1 (got 0)"
    assert lm.backend.calls == []
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    done = run_command(["score", summary, "--tries", "0"])
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, ["error: --tries must be from 1 to 10 (got 0)"])


DIVERSE_EVENTS = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"


def _summaries_file(tmp: Path) -> Path:
    import json

    path = tmp / "summaries.json"
    path.write_text(json.dumps({json.loads(DIVERSE_EVENTS.read_text())[0]["eid"]: "The bridge closed."}))
    return path


def _default_judge(name: str) -> Path:
    from booklens.judges import default_path

    return default_path(name)


# Settings that are not counts, refused for how they go together: each line names them as a library
# caller spells them (the keyword) and, from the same check, as a command does (the option).
# (library call, its line, command arguments, the command's line)
REFUSED_SETTINGS = {
    "load_judge-program-and-zero-shot": (
        lambda tmp: _module("booklens.judges").load_judge("coherence", _default_judge("coherence"), zero_shot=True),
        "give either program or zero_shot, not both",
        lambda tmp: ["score", tmp / "summary.txt", "--program", _default_judge("coherence"), "--zero-shot"],
        "give either --program or --zero-shot, not both"),
    "plan_calibration-program-and-zero-shot": (
        lambda tmp: _module("booklens.calibration").plan_calibration(program=_default_judge("coherence"),
                                                                     zero_shot=True),
        "give either program or zero_shot, not both",
        lambda tmp: ["calibrate", "--program", _default_judge("coherence"), "--zero-shot"],
        "give either --program or --zero-shot, not both"),
    "judge_programs-artifacts-and-zero-shot": (
        lambda tmp: _module("booklens.judges").judge_programs({"verification": _default_judge("verification")},
                                                              tasks=["verification"], zero_shot=True),
        "give either artifacts or zero_shot, not both",
        lambda tmp: ["verify", "--claims", tmp / "claims.json", "--evidence", "none", "--program",
                     _default_judge("verification"), "--zero-shot"],
        "give either --program or --zero-shot, not both"),
    "judge_programs-binary-four-way-artifact": (
        lambda tmp: _module("booklens.judges").judge_programs({"verification": _default_judge("verification")},
                                                              tasks=["verification"], binary=True),
        f"{_default_judge('verification')} is a four-way verification program; binary needs a binary one",
        lambda tmp: ["verify", "--claims", tmp / "claims.json", "--evidence", "none", "--binary", "--program",
                     _default_judge("verification")],
        f"{_default_judge('verification')} is a four-way verification program; --binary needs a binary one"),
    "plan_calibration-judge-of-another-program": (
        lambda tmp: _module("booklens.calibration").plan_calibration(["verification"],
                                                                     program=_default_judge("coherence")),
        f"{_default_judge('coherence')} is a coherence program; judges verification does not match",
        lambda tmp: ["calibrate", "--judge", "verification", "--program", _default_judge("coherence")],
        f"{_default_judge('coherence')} is a coherence program; --judge verification does not match"),
    "plan_calibration-coherence-data": (
        lambda tmp: _module("booklens.calibration").plan_calibration(["verification"], coherence_data=tmp),
        "coherence_data is for the coherence judge",
        lambda tmp: ["calibrate", "--judge", "verification", "--coherence-data", tmp],
        "--coherence-data is for the coherence judge"),
    "plan_calibration-fables-data": (
        lambda tmp: _module("booklens.calibration").plan_calibration(["coherence"], fables_data=tmp),
        "fables_data is for the verification and binary judges",
        lambda tmp: ["calibrate", "--judge", "coherence", "--fables-data", tmp],
        "--fables-data is for the verification and binary judges"),
    "plan_calibration-books-binary": (
        lambda tmp: _module("booklens.calibration").plan_calibration(["binary"], books=2),
        "the binary rater is always measured on FABLES Table 5's seven books: books does not apply",
        lambda tmp: ["calibrate", "--judge", "binary", "--books", "2"],
        "the binary rater is always measured on FABLES Table 5's seven books: --books does not apply"),
    "plan_calibration-seed-binary": (
        lambda tmp: _module("booklens.calibration").plan_calibration(["binary"], seed=3),
        "the binary rater is always measured on FABLES Table 5's seven books: seed draws no sample for it",
        lambda tmp: ["calibrate", "--judge", "binary", "--seed", "3"],
        "the binary rater is always measured on FABLES Table 5's seven books: --seed draws no sample for it"),
    "run_book_qa-k-unused": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), evidence="none",
                                                            k=3, lm=dspy.settings.lm, cache_dir=tmp / "c"),
        "k is how many passages bm25/dense/hybrid/book start from; evidence none retrieves none",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence", "none", "--k", "3"],
        "--k is how many passages bm25/dense/hybrid/book start from; evidence none retrieves none"),
    "run_book_qa-passage-tokens-unused": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), evidence="given",
                                                            passage_tokens=64, lm=dspy.settings.lm,
                                                            cache_dir=tmp / "c"),
        "passage_tokens sizes the passages cut from the book; evidence given cuts none",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence", "given",
                     "--passage-tokens", "64"],
        "--passage-tokens sizes the passages cut from the book; evidence given cuts none"),
    "run_book_qa-rank-mode-unused": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), evidence="bm25",
                                                            rank_mode="dense", lm=dspy.settings.lm,
                                                            cache_dir=tmp / "c"),
        "rank_mode ranks the passages evidence book grows its windows around; evidence bm25 ranks by its own name",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence", "bm25",
                     "--rank-mode", "dense"],
        "--rank-mode ranks the passages --evidence book grows its windows around; evidence bm25 ranks by its own "
        "name"),
    "run_book_qa-title-empty": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), title=" ",
                                                            lm=dspy.settings.lm, cache_dir=tmp / "c"),
        "title is empty: name the book, or leave it out (the file name gives the title: 'Book')",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--title", " "],
        "--title is empty: name the book, or leave it out (the file name gives the title: 'Book')"),
    "run_book_qa-title-named-by-no-prompt": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), evidence="bm25",
                                                            title="The Mill", lm=dspy.settings.lm,
                                                            cache_dir=tmp / "c"),
        "title names the book in the closed-book and judge prompts, and this run has neither (setting mc: no "
        "answer judge; evidence bm25: every question is shown the book or passages of it): leave it out",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence", "bm25", "--title",
                     "The Mill"],
        "--title names the book in the closed-book and judge prompts, and this run has neither (--setting mc: no "
        "answer judge; --evidence bm25: every question is shown the book or passages of it): leave it out"),
    "run_book_qa-quote-evidence-closed-book": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), evidence="none",
                                                            quote_evidence=True, lm=dspy.settings.lm,
                                                            cache_dir=tmp / "c"),
        "quote_evidence asks for quotes from the context, and evidence none gives none",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence", "none",
                     "--quote-evidence"],
        "--quote-evidence asks for quotes from the context, and --evidence none gives none"),
    "run_book_qa-evidence-recall-without-quotes": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp),
                                                            evidence_recall="overlap", lm=dspy.settings.lm,
                                                            cache_dir=tmp / "c"),
        "evidence_recall scores the quotes that quote_evidence asks for: add it",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--evidence-recall", "overlap"],
        "--evidence-recall scores the quotes that --quote-evidence asks for: add it"),
    "judge_summaries-per-qa": (
        lambda tmp: _module("booklens.diverse_runs").judge_summaries(DIVERSE_EVENTS, _summaries_file(tmp),
                                                                     protocol="likert", per_qa=True),
        "per_qa is for pairwise coverage (each reference QA pair a case)",
        lambda tmp: ["judge", DIVERSE_EVENTS, _summaries_file(tmp), "--protocol", "likert", "--per-qa"],
        "--per-qa is for pairwise coverage (each reference QA pair a case)"),
    "judge_summaries-max-articles": (
        lambda tmp: _module("booklens.diverse_runs").judge_summaries(DIVERSE_EVENTS, _summaries_file(tmp),
                                                                     criterion="coverage", max_articles=2),
        "max_articles limits the articles faithfulness is judged against; coverage is judged against the QA pairs",
        lambda tmp: ["judge", DIVERSE_EVENTS, _summaries_file(tmp), "--criterion", "coverage", "--max-articles",
                     "2"],
        "--max-articles limits the articles faithfulness is judged against; coverage is judged against the QA "
        "pairs"),
    "judge_summaries-second-file": (
        lambda tmp: _module("booklens.diverse_runs").judge_summaries(DIVERSE_EVENTS, _summaries_file(tmp),
                                                                     _summaries_file(tmp), protocol="likert"),
        "a second summaries file is only used with protocol pairwise",
        lambda tmp: ["judge", DIVERSE_EVENTS, _summaries_file(tmp), _summaries_file(tmp), "--protocol", "likert"],
        "a second summaries file is only used with --protocol pairwise"),
    "run_diverse-sentences-direct": (
        lambda tmp: _module("booklens.diverse_runs").run_diverse(DIVERSE_EVENTS, method="direct", sentences=3,
                                                                 lm=dspy.settings.lm),
        "sentences sets what method extract takes from each article; method direct reads the articles whole",
        lambda tmp: ["diverse", DIVERSE_EVENTS, "--method", "direct", "--sentences", "3"],
        "--sentences sets what --method extract takes from each article; --method direct reads the articles whole"),
    "run_diverse-clustering-without-questions": (
        lambda tmp: _module("booklens.diverse_runs").run_diverse(DIVERSE_EVENTS, clustering="exact",
                                                                 lm=dspy.settings.lm),
        "clustering and diversity_filter shape generated references: add generate_questions N",
        lambda tmp: ["diverse", DIVERSE_EVENTS, "--answer-clustering", "exact"],
        "--answer-clustering and --diversity-filter/--no-diversity-filter shape generated references: add "
        "--generate-questions N"),
    "run_diverse-no-judge": (
        lambda tmp: _module("booklens.diverse_runs").run_diverse(DIVERSE_EVENTS, judge=False, max_articles=2,
                                                                 lm=dspy.settings.lm),
        "faithfulness and max_articles set how summaries are judged, and judge=False judges none",
        lambda tmp: ["diverse", DIVERSE_EVENTS, "--no-judge", "--max-articles", "2"],
        "--faithfulness and --max-articles set how summaries are judged, and --no-judge judges none"),
    "run_diverse-no-faithfulness": (
        lambda tmp: _module("booklens.diverse_runs").run_diverse(DIVERSE_EVENTS, faithfulness="none", max_articles=2,
                                                                 lm=dspy.settings.lm),
        "max_articles limits the articles faithfulness is judged against; faithfulness none judges none",
        lambda tmp: ["diverse", DIVERSE_EVENTS, "--faithfulness", "none", "--max-articles", "2"],
        "--max-articles limits the articles faithfulness is judged against; --faithfulness none judges none"),
    "plan_compile-test-size-no-test": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_compile(
            "verification", tmp / "f.json", tmp / "a.json", optimizer="labeled", test_size=5, evaluate_test=False),
        "test_size sizes the test split, and evaluate_test=False scores nothing on it",
        lambda tmp: ["compile", "verification", "--data", tmp / "f.json", "--optimizer", "labeled", "--no-test",
                     "--test-size", "5", "-o", tmp / "a.json"],
        "--test-size sizes the test split, and --no-test scores nothing on it"),
    "plan_evaluation-nothing": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_evaluation("verification", tmp / "f.json",
                                                                            programs=[], zero_shot=False),
        "nothing to evaluate: give programs or drop zero_shot=False",
        lambda tmp: ["evaluate", "verification", "--data", tmp / "f.json", "--no-zero-shot"],
        "nothing to evaluate: give --program or drop --no-zero-shot"),
    "summarize_book-words-per-token": (
        lambda tmp: _module("booklens.steps").summarize_book(tmp / "book.txt", words_per_token=float("nan"),
                                                             **SMALL),
        "words_per_token must be a finite number (got nan)",
        lambda tmp: ["summarize", tmp / "book.txt", "--words-per-token", "nan"],
        "--words-per-token must be a finite number (got nan)"),
    "run_book_qa-server-for-the-embedded-model": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), lm="local",
                                                            api_base="http://127.0.0.1:9/v1", cache_dir=tmp / "c"),
        "api_base http://127.0.0.1:9/v1 names a server, but the LM is the embedded model (local), which runs in this "
        "process: to use the server, name its model (e.g. lm='openai/MODEL')",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--lm", "local", "--api-base",
                     "http://127.0.0.1:9/v1"],
        "--api-base http://127.0.0.1:9/v1 names a server, but the LM is the embedded model (local), which runs in "
        "this process: to use the server, name its model (e.g. --lm openai/MODEL)"),
    "run_book_qa-rate-limit-for-the-embedded-model": (
        lambda tmp: _module("booklens.qa_runs").run_book_qa(tmp / "book.txt", _question_file(tmp), lm="local",
                                                            lm_options={"rpm": 5}, cache_dir=tmp / "c"),
        "rpm is for models behind a server or provider; the embedded model (local) always decodes under the output "
        "schema and has no rate limits",
        lambda tmp: ["qa", tmp / "book.txt", "--questions", _question_file(tmp), "--lm", "local", "--rpm", "5"],
        "--rpm is for models behind a server or provider; the embedded model (local) always decodes under the "
        "output schema and has no rate limits"),
    "run_sweep-lm-no-step-takes": (
        lambda tmp: _module("booklens.sweep.run").run_sweep("own.yaml", "sweep", lm="openai/z"),
        "lm openai/z would not apply: in own.yaml the judge and every system that summarizes name their own lm",
        lambda tmp: ["sweep", "own.yaml", "-o", "sweep", "--lm", "openai/z"],
        "--lm openai/z would not apply: in own.yaml the judge and every system that summarizes name their own lm"),
    "run_sweep-api-base-no-step-takes": (
        lambda tmp: _module("booklens.sweep.run").run_sweep("own.yaml", "sweep", api_base="http://127.0.0.1:7/v1"),
        "api_base http://127.0.0.1:7/v1 would not apply: in own.yaml the judge and every system that summarizes "
        "name their own api_base or run on the embedded model",
        lambda tmp: ["sweep", "own.yaml", "-o", "sweep", "--api-base", "http://127.0.0.1:7/v1"],
        "--api-base http://127.0.0.1:7/v1 would not apply: in own.yaml the judge and every system that summarizes "
        "name their own api_base or run on the embedded model"),
    "run_sweep-ray-address-empty": (
        lambda tmp: _module("booklens.sweep.run").run_sweep(tmp / "corpus.yaml", tmp / "sweep", lm="openai/x",
                                                            ray_address=" "),
        "ray_address is empty: name the cluster (auto, ray://HEAD:10001) or leave it out (RAY_ADDRESS, else the "
        "cluster `ray start` ran for here, else a local Ray)",
        lambda tmp: ["sweep", tmp / "corpus.yaml", "-o", tmp / "sweep", "--ray-address", " "],
        "--ray-address is empty: name the cluster (auto, ray://HEAD:10001) or leave it out (RAY_ADDRESS, else the "
        "cluster `ray start` ran for here, else a local Ray)"),
    "run_sweep-ray-address-dashboard": (
        lambda tmp: _module("booklens.sweep.run").run_sweep(tmp / "corpus.yaml", tmp / "sweep", lm="openai/x",
                                                            engine="ray", ray_address="http://head:8265"),
        "ray_address http://head:8265 is an http:// URL, a Ray dashboard's (what `ray job submit --address` takes): "
        "name the cluster itself (auto, HEAD:6379 or ray://HEAD:10001)",
        lambda tmp: ["sweep", tmp / "corpus.yaml", "-o", tmp / "sweep", "--engine", "ray", "--ray-address",
                     "http://head:8265"],
        "--ray-address http://head:8265 is an http:// URL, a Ray dashboard's (what `ray job submit --address` "
        "takes): name the cluster itself (auto, HEAD:6379 or ray://HEAD:10001)"),
    "run_sweep-ray-address-local-engine": (
        lambda tmp: _module("booklens.sweep.run").run_sweep(tmp / "corpus.yaml", tmp / "sweep", lm="openai/x",
                                                            ray_address="auto"),
        "ray_address needs engine ray",
        lambda tmp: ["sweep", tmp / "corpus.yaml", "-o", tmp / "sweep", "--ray-address", "auto"],
        "--ray-address needs --engine ray"),
    "plan_compile-no-demos-to-pick": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_compile(
            "verification", tmp / "f.json", tmp / "a.json", optimizer="labeled", demos=0),
        "demos 0 leaves the labeled optimizer nothing to choose (it picks demos and nothing else): the artifact "
        "would be the zero-shot program, which evaluate runs as it is",
        lambda tmp: ["compile", "verification", "--data", tmp / "f.json", "--optimizer", "labeled", "--demos", "0",
                     "-o", tmp / "a.json"],
        "--demos 0 leaves the labeled optimizer nothing to choose (it picks demos and nothing else): the artifact "
        "would be the zero-shot program, which evaluate runs as it is"),
    "plan_compile-mipro-without-trials": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_compile(
            "verification", tmp / "f.json", tmp / "a.json", optimizer="mipro", trials=0),
        "mipro needs candidates and trials of at least 1",
        lambda tmp: ["compile", "verification", "--data", tmp / "f.json", "--optimizer", "mipro", "--trials", "0",
                     "-o", tmp / "a.json"],
        "mipro needs --candidates and --trials of at least 1"),
    "plan_compile-gepa-without-trials": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_compile(
            "verification", tmp / "f.json", tmp / "a.json", optimizer="gepa", trials=0),
        "trials 0 leaves the gepa optimizer nothing to do (its trials are its reflective proposals): the artifact "
        "would be the zero-shot program, which evaluate runs as it is",
        lambda tmp: ["compile", "verification", "--data", tmp / "f.json", "--optimizer", "gepa", "--trials", "0",
                     "-o", tmp / "a.json"],
        "--trials 0 leaves the gepa optimizer nothing to do (its trials are its reflective proposals): the artifact "
        "would be the zero-shot program, which evaluate runs as it is"),
    "plan_compile-window-for-a-task-it-does-not-size": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_compile(
            "verification", tmp / "f.json", tmp / "a.json", optimizer="labeled", context_window=2048),
        "context_window is the window the coherence judge's and the summarize task's prompts are planned for; the "
        "verification task's prompts are not sized by a window: leave it out",
        lambda tmp: ["compile", "verification", "--data", tmp / "f.json", "--optimizer", "labeled",
                     "--context-window", "2048", "-o", tmp / "a.json"],
        "--context-window is the window the coherence judge's and the summarize task's prompts are planned for; the "
        "verification task's prompts are not sized by a window: leave it out"),
    "plan_evaluation-summarizer-settings-for-a-task-without-one": (
        lambda tmp: _module("booklens.optimizers.workflow").plan_evaluation(
            "verification", tmp / "f.json", chunk_size=2048, max_summary_tokens=900),
        "chunk_size and max_summary_tokens set the summarize task's summarizer; the verification task runs none: "
        "leave them out",
        lambda tmp: ["evaluate", "verification", "--data", tmp / "f.json", "--chunk-size", "2048",
                     "--max-summary-tokens", "900"],
        "--chunk-size and --max-summary-tokens set the summarize task's summarizer; the verification task runs "
        "none: leave them out"),
}


@pytest.mark.parametrize("case", list(REFUSED_SETTINGS))
def test_a_refused_setting_is_named_as_the_keyword_in_python_and_as_the_option_in_a_command(tmp_path, monkeypatch,
                                                                                           case):
    """These lines named the options (`--zero-shot`, `--fables-data`, `--k`) to a library caller who
    passed `zero_shot`, `fables_data`, `k`; the commands still name their options, from the same check."""
    from booklens.errors import command_line
    from booklens.testing import run_command

    call, said, command, printed = REFUSED_SETTINGS[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "c"))
    (tmp_path / "book.txt").write_text(BOOK_TEXT)
    (tmp_path / "summary.txt").write_text(SUMMARY)
    (tmp_path / "claims.json").write_text('["Mara finds the key."]')
    (tmp_path / "f.json").write_text("{}")
    (tmp_path / "corpus.yaml").write_text("books: [book.txt]\nsystems:\n  - {name: h, method: hier}\n")
    (tmp_path / "own.yaml").write_text("books: [book.txt]\nsystems: [{name: a, lm: openai/x, api_base: "
                                       "'http://127.0.0.1:9/v1'}]\njudge: {lm: openai/y, api_base: "
                                       "'http://127.0.0.1:9/v1'}\n")
    lm = pipeline_lm()
    with dspy.context(lm=lm), pytest.raises(BooklensError) as raised:
        call(tmp_path)
    assert str(raised.value) == said
    assert lm.backend.calls == []
    args = command(tmp_path)
    given_lm = "--lm" in args or "--api-base" in args
    done = run_command(args if given_lm else [*args, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"])
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [f"error: {printed}"])
    assert command_line.get() is False  # the command's naming ended with it


def test_a_command_invoked_in_process_names_its_options_and_the_library_after_it_its_keywords(tmp_path, monkeypatch):
    """The naming follows the command wherever it runs (`booklens` itself, or typer's test runner on
    `booklens.cli.app`) and ends with it."""
    from typer.testing import CliRunner

    from booklens.calibration import plan_calibration
    from booklens.cli import app

    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "c"))
    result = CliRunner().invoke(app, ["calibrate", "--judge", "binary", "--seed", "3"])
    assert isinstance(result.exception, BooklensError) and str(result.exception).endswith(": --seed draws no "
                                                                                           "sample for it")
    with pytest.raises(BooklensError, match=": seed draws no sample for it$"):
        plan_calibration(["binary"], seed=3)


def _small_fables(path: Path) -> Path:
    """Twelve books of FABLES, one summary each with three claims (two faithful, one not)."""
    import json

    books = {}
    for book in range(12):
        claims = {str(n): {"claim": f"In tale {book}, Ida {'never ' if n == 2 else ''}rows to island {n}.",
                           "label": "No" if n == 2 else "Yes", "evidence": [f"Ida rowed to island {n}."],
                           "reason": ["the passage says so"]} for n in range(3)}
        books[f"Tale {book}"] = {"GPT-4": {"summary": f"Ida rows to the islands in tale {book}.", "claims": claims}}
    path.write_text(json.dumps(books))
    return path


@pytest.mark.parametrize("options, named", [
    ({"optimizer": "labeled", "demos": 100},
     {"demos 100 ": "--demos 100 ", "larger train_size": "larger --train-size"}),
    ({"optimizer": "mipro", "minibatch_size": 100}, {"minibatch_size 100 ": "--minibatch-size 100 "}),
])
def test_a_compile_budget_larger_than_its_split_is_named_as_the_keyword_in_python_and_the_option_in_a_command(
        tmp_path, options, named):
    """The demos or the minibatch asked for above what the split holds: the same line from the same
    check, with the settings named as each caller gave them."""
    from booklens.optimizers.workflow import plan_compile
    from booklens.testing import run_command

    data = _small_fables(tmp_path / "fables.json")
    with pytest.raises(BooklensError) as raised:
        plan_compile("verification", data, tmp_path / "a.json", **options)
    said = str(raised.value)
    assert said.startswith(next(iter(named))) and all(words in said for words in named), said
    args = [item for key, value in options.items() for item in (f"--{key.replace('_', '-')}", value)]
    done = run_command(["compile", "verification", "--data", data, *args, "-o", tmp_path / "a.json", "--lm",
                        "openai/fake", "--api-base", "http://127.0.0.1:9/v1"])
    printed = said
    for words, as_options in named.items():
        printed = printed.replace(words, as_options)
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [f"error: {printed}"])
    assert not (tmp_path / "a.json").exists()


@pytest.mark.parametrize("instructions, said", [
    (False, "{artifact} holds its 1 demo for per-sentence judging (batch_size 1) only: with batch_size 4 it would "
            "judge with none of them; drop batch_size to use them"),
    (True, "{artifact} was compiled for per-sentence judging (batch_size 1): with batch_size 4 its batched "
           "predictor would judge with nothing compile chose; drop batch_size to use it"),
])
def test_a_per_sentence_artifact_judging_batched_is_named_as_the_keyword_in_python_and_the_option_in_a_command(
        tmp_path, instructions, said):
    from booklens.judges import load_judge
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task
    from booklens.testing import run_command

    spec = get_task("coherence")
    program = spec.build_program()
    if instructions:  # what MIPROv2 and GEPA compile, on the per-sentence predictor
        program.detect.signature = program.detect.signature.with_instructions("Flag every sentence about Tom.")
    else:
        program.detect.demos = [dspy.Example(summary=SUMMARY, sentence="Tom hides the letter from Mara.",
                                             verdict="confusion", questions=["Who is Tom?"],
                                             error_types=["entity omission"])]
    artifact = tmp_path / "compiled.json"
    save_program(program, artifact, task="coherence", program_config=spec.program_config,
                 **({"optimizer": "mipro"} if instructions else {}))
    with pytest.raises(BooklensError) as raised:
        load_judge("coherence", artifact, batch_size=4)
    assert str(raised.value) == said.format(artifact=artifact)
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    done = run_command(["score", summary, "--program", artifact, "--batch-size", "4", "--lm", "openai/fake",
                        "--api-base", "http://127.0.0.1:9/v1"])
    printed = said.format(artifact=artifact).replace("batch_size", "--batch-size")
    assert (done.returncode, done.stderr.strip().splitlines()) == (2, [f"error: {printed}"])
