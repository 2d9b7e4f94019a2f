"""`booklens qa`: bad input ends in one line and a non-zero exit before any model loads;
a whole run against a local OpenAI-compatible test server prints the accuracy tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from booklens.testing import FakeOpenAIServer, Reply

REPO = Path(__file__).resolve().parents[1]
QUESTION = {
    "QID": "T-1", "Question": "Which ship sails to Pellmark?",
    "Options": {"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"},
    "Answer": "The Marigold", "Gold": "B", "Evidences": ["the tender Marigold sails to Pellmark"],
    "Aspect": "plot", "Complexity": "sh",
}
BOOK = ("The keeper of the Pellmark light waited every Thursday. " * 40
        + "\n\nOnly the tender Marigold sails to Pellmark, and only on Thursdays.\n\n"
        + "The fog lifted in the afternoon and the gulls returned to the rocks. " * 40)


def run(args, tmp_path, **env):
    environ = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache"), **env}
    environ.pop("BOOKLENS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "booklens", *args], capture_output=True, text=True, env=environ,
                          cwd=tmp_path, timeout=300)


@pytest.fixture
def book(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text(BOOK, encoding="utf-8")
    return path


def write(tmp_path, name, payload):
    path = tmp_path / name
    path.write_text(json.dumps(payload), encoding="utf-8")
    return path


def assert_one_line_error(result, *needles):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in result.stderr


def test_question_file_of_the_wrong_shape(tmp_path, book):
    # (the other shapes are covered in-process by tests/test_qa.py)
    q = write(tmp_path, "q.json", {"QID": "x"})
    assert_one_line_error(run(["qa", str(book), "--questions", str(q)], tmp_path), "expected a JSON list")


def test_options_missing_in_mc_mode(tmp_path, book):
    q = write(tmp_path, "q.json", [{k: v for k, v in QUESTION.items() if k not in ("Options", "Gold")}])
    assert_one_line_error(run(["qa", str(book), "--questions", str(q), "--setting", "mc"], tmp_path),
                          "no Options", "--setting gen")


@pytest.mark.parametrize("options, problem", [
    ({**QUESTION["Options"], "C": "  "}, "option C is blank"),
    ({**QUESTION["Options"], "D": "THE HERON"}, "options A and D have the same text 'THE HERON'"),
])
def test_options_that_cannot_be_told_apart_are_refused(tmp_path, book, options, problem):
    q = write(tmp_path, "q.json", [{**QUESTION, "Options": options}])
    result = run(["qa", str(book), "--questions", str(q)], tmp_path)
    assert_one_line_error(result, f"error: {q}: question 1 (T-1): Options: {problem}")
    assert result.stdout == ""


@pytest.mark.parametrize("evidence, options, needle", [
    ("none", ["--k", "3"], "--k is how many passages bm25/dense/hybrid/book start from; evidence none retrieves none"),
    ("given", ["--passage-tokens", "64"], "--passage-tokens sizes the passages cut from the book; evidence given"),
    ("none", ["--rank-mode", "dense"], "--rank-mode ranks the passages --evidence book grows its windows around; "
                                       "evidence none ranks none"),
    ("bm25", ["--rank-mode", "dense"], "evidence bm25 ranks by its own name"),
    # the defaults given out loud are refused as well
    ("none", ["--k", "5"], "evidence none retrieves none"),
    ("given", ["--passage-tokens", "256"], "evidence given cuts none"),
    ("bm25", ["--rank-mode", "bm25"], "evidence bm25 ranks by its own name"),
])
def test_retrieval_options_the_evidence_mode_never_uses_are_refused(tmp_path, book, evidence, options, needle):
    q = write(tmp_path, "q.json", [QUESTION])
    result = run(["qa", str(book), "--questions", str(q), "--evidence", evidence, *options], tmp_path)
    assert_one_line_error(result, needle)


def test_a_key_given_twice_in_the_question_file_is_refused(tmp_path, book):
    """JSON keeps the last of two equal keys: the question would be asked with its second text, and
    the first dropped unseen."""
    q = tmp_path / "q.json"
    q.write_text('[\n {"QID": "T-1",\n  "Question": "Which ship?",\n  "Question": "Which day?"}]', encoding="utf-8")
    assert_one_line_error(run(["qa", str(book), "--questions", str(q)], tmp_path),
                          f"question file is malformed: the key 'Question' appears twice in one object ({q}: line 4)")


def test_invalid_json(tmp_path, book):
    bad = tmp_path / "bad.json"
    bad.write_text("[{", encoding="utf-8")
    assert_one_line_error(run(["qa", str(book), "--questions", str(bad)], tmp_path), "not valid JSON")


@pytest.mark.parametrize("title", ["", " ", "\t\n"], ids=["empty", "space", "blanks"])
def test_an_empty_title_is_refused_before_any_call(tmp_path, book, title):
    """`--title "$TITLE"` with TITLE unset fell back to the file name unsaid, and a title of blanks
    went into every closed-book prompt."""
    from booklens.testing import run_command

    q = write(tmp_path, "q.json", [QUESTION])
    with FakeOpenAIServer() as server:
        result = run_command(["qa", book, "--questions", q, "--title", title, "--lm", "openai/fake", "--api-base",
                              server.url], env={**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")})
        assert server.received == []
    assert_one_line_error(result, "--title is empty")


def invoke(args, tmp_path, monkeypatch):
    """Run a command in-process (the model is a local test server, so no import cost per run)."""
    from typer.testing import CliRunner

    from booklens.cli import app

    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    return result


def answer_everything(body):
    """One JSON object with every output field any QA step asks for."""
    prompt = json.dumps(body.get("messages"))
    if not body.get("response_format"):  # a free-text answer is asked for in plain text
        return "the Marigold" if "Marigold" in prompt else "the Heron"
    return json.dumps({"answer": "B" if "Marigold" in prompt else "A", "reason": "matches", "verdict": "correct",
                       "evidence": ["Only the tender Marigold sails to Pellmark"]})


def test_qa_run_prints_the_tables_and_writes_json(tmp_path, book, monkeypatch):
    q = write(tmp_path, "q.json", [QUESTION, {**QUESTION, "QID": "T-2", "Complexity": "mh", "Aspect": "times"}])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base",
                         server.url, "--evidence", "bm25", "--k", "2", "--passage-tokens", "64", "--quote-evidence",
                         "-o", str(out)], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "Accuracy: 100.0 (2)" in result.stdout
    assert "chara" in result.stdout and "pre-100K: 100.0 (2)" in result.stdout
    assert "retrieval: 2" in result.stdout
    data = json.loads(out.read_text())
    assert data["report"]["overall"]["accuracy"] == 100.0
    assert [p["prediction"] for p in data["predictions"]] == ["B", "B"]
    assert data["report"]["evidence"]["quote_recall"] == 100.0
    assert (data["k"], data["passage_tokens"], data["rank_mode"]) == (2, 64, None)  # no book-mode ranking here

    with FakeOpenAIServer(responder=answer_everything) as server:
        gen = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base", server.url,
                      "--setting", "gen", "-o", str(tmp_path / "gen.json")], tmp_path, monkeypatch)
        assert gen.exit_code == 0, gen.output
        assert "whole-book: 2" in gen.stdout and "Accuracy: 100.0 (2)" in gen.stdout
        assert "student_answer" in json.dumps(server.served[-1]) and "the Marigold" in json.dumps(server.served[-1])
        # The two questions differ only in fields the prompts do not show, so their calls are identical:
        # one answer and one verdict serve both (identical calls run once, even when concurrent).
        assert len(server.served) == 2


def test_a_run_where_no_question_got_an_answer_fails_and_keeps_the_result(tmp_path, book, monkeypatch):
    """Every answer unusable (a broken server, a wrong --structured) is not an accuracy of 0%: the
    result is written, then a one-line error; one valid answer among failures is a score, as before."""
    from booklens.errors import BooklensError

    q = write(tmp_path, "q.json", [QUESTION, {**QUESTION, "QID": "T-2", "Question": "Which ship is late?"}])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=lambda body: "no idea") as server:
        with pytest.raises(BooklensError, match=r"^no question got a valid answer or verdict \(2 of 2 questions "
                                                r"failed\) \(first: "):
            invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base", server.url,
                    "--evidence", "none", "-o", str(out)], tmp_path, monkeypatch)
    assert [p["error"] is not None for p in json.loads(out.read_text())["predictions"]] == [True, True]

    def accuracy_line(questions):
        """The accuracy line of a run in which only the late-ship question gets a valid answer."""
        with FakeOpenAIServer(responder=lambda body: json.dumps({"answer": "B"}) if "late" in json.dumps(body)
                              else "no idea") as server:
            result = invoke(["qa", str(book), "--questions", str(questions), "--lm", "openai/test-model",
                             "--api-base", server.url, "--evidence", "none"], tmp_path, monkeypatch)
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()[1]

    assert accuracy_line(q) == ("Accuracy: 50.0 (2) of 2 scored questions, 1 of them without a valid answer "
                                "(counted wrong)")

    # A failed question without a reference is not scored: the line counts it there, once, not among
    # the scored questions' failures too (3 questions, not 4).
    unreferenced = {key: value for key, value in QUESTION.items() if key not in ("Answer", "Gold")}
    q3 = write(tmp_path, "q3.json", [QUESTION, {**QUESTION, "QID": "T-2", "Question": "Which ship is late?"},
                                     {**unreferenced, "QID": "T-3", "Question": "Which ship is lost?"}])
    assert accuracy_line(q3) == ("Accuracy: 50.0 (2) of 2 scored questions, 1 of them without a valid answer "
                                 "(counted wrong); 1 not scored, 1 of them without a valid answer or verdict")


def test_a_model_that_sends_only_reasoning_is_told_so_in_the_error_line(tmp_path, book):
    """A reasoning model whose server splits its thinking off spent every answer budget on thinking:
    the one line says so and what to change, and the result is still written."""
    q = write(tmp_path, "q.json", [QUESTION])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=lambda body: Reply(content="", reasoning="The Marigold, or... " * 50,
                                                       finish_reason="length",
                                                       completion_tokens=body["max_tokens"])) as server:
        result = run(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base", server.url,
                      "--evidence", "none", "-o", str(out)], tmp_path)
    assert [r.body["max_tokens"] for r in server.received] == [1024, 2048, 4096]
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: no question got a valid answer or verdict (1 of 1 question failed) (first: the answer was cut off at "
        "the token limit (4096 tokens): unparseable answer: the model sent only reasoning (4096 tokens), no answer: "
        "turn its thinking off or use a non-reasoning model)"]
    assert json.loads(out.read_text())["predictions"][0]["prediction"] is None


def test_the_result_is_written_even_when_stdout_is_closed(tmp_path, book):
    """`booklens qa ... -o out.json | head -1`: the pipe closes before the tables are printed, and the
    result of the LM work must still be on disk."""
    q = write(tmp_path, "q.json", [QUESTION])
    out = tmp_path / "out.json"
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with a broken pipe
    environ = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    with FakeOpenAIServer(responder=answer_everything) as server:
        try:
            proc = subprocess.run([sys.executable, "-m", "booklens", "qa", str(book), "--questions", str(q), "--lm",
                                   "openai/test-model", "--api-base", server.url, "--evidence", "bm25", "-o", str(out)],
                                  stdout=write_end, stderr=subprocess.PIPE, text=True, env=environ, cwd=tmp_path,
                                  timeout=300)
        finally:
            os.close(write_end)
    assert len(server.served) >= 1, proc.stderr
    assert json.loads(out.read_text())["report"]["overall"]["accuracy"] == 100.0


def test_path_and_argument_errors_load_no_model_library(tmp_path):
    """`qa`, `diverse`, `judge` and `bias` check their files before importing DSPy, LiteLLM,
    NumPy or torch, so a typo costs no start-up time."""
    fixture = REPO / "examples" / "diverse" / "harbor_bridge_closure.json"
    commands = [["qa", "missing.txt", "--questions", "missing.json"],
                ["qa", str(REPO / "examples" / "sample_story.txt"), "--questions", "missing.json"],
                ["qa", "book.txt", "--questions", "q.json", "--evidence", "everything"],
                ["diverse", "missing.json"],
                ["judge", str(fixture), "missing.json"],
                ["bias", "position", str(fixture), "missing.json", "other.json"],
                ["bias", "verbosity", "missing.json", "s.json"]]
    script = (
        "import contextlib, io, json, sys\n"
        "from booklens.cli import main\n"
        f"for args in {commands!r}:\n"
        "    sys.argv = ['booklens', *args]\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):\n"
        "        main()\n"
        "    print(json.dumps(err.getvalue().strip()))\n"
        "heavy = ('dspy', 'litellm', 'torch', 'faiss', 'sentence_transformers', 'numpy', 'tiktoken', 'llama_cpp')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    errors, loaded = lines[:-1], lines[-1]
    assert len(errors) == len(commands) and all(e.startswith("error:") for e in errors), result.stdout + result.stderr
    assert "question file not found" in errors[1] and "everything" in errors[2]
    assert loaded == []


def test_the_help_says_what_the_title_and_the_llm_evidence_recall_cost_and_reach():
    """--title said it named the book in closed-book prompts only, though the gen and evidence judges
    name it too; --evidence-recall llm said one call per question, though a question without quotes
    scores 0 without one."""
    import typer

    from booklens.cli import app

    params = {p.name: p.help for p in typer.main.get_command(app).commands["qa"].params}
    assert "judge prompts" in params["title"]
    assert "one call per question that quoted any, no quotes scoring 0" in params["evidence_recall"]


def test_questions_without_a_reference_are_answered_and_say_why_there_is_no_accuracy(tmp_path, book, monkeypatch):
    """Questions with no Answer (gen) or no Gold (mc) were answered and the command exited 0 with an
    accuracy over nothing, saying nothing of why: one note says so; a run with some reference has none."""
    bare = {k: v for k, v in QUESTION.items() if k not in ("Answer", "Gold")}
    q = write(tmp_path, "q.json", [bare, {**bare, "QID": "T-2", "Question": "Which ship is late?"}])
    for setting, field in (("gen", "Answer"), ("mc", "Gold")):
        with FakeOpenAIServer(responder=answer_everything) as server:
            result = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base",
                             server.url, "--setting", setting, "--evidence", "none"], tmp_path, monkeypatch)
        assert result.exit_code == 0, result.output
        notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
        assert notes == [f"note: no question has a reference answer ({field}) to score against, so no accuracy "
                         "is given"], result.stderr
    some = write(tmp_path, "some.json", [bare, {**QUESTION, "QID": "T-2"}])
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(some), "--lm", "openai/test-model", "--api-base",
                         server.url, "--setting", "gen", "--evidence", "none"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "note: " not in result.stderr


def test_questions_whose_evidence_occurs_nowhere_in_the_book_are_noted(tmp_path, book, monkeypatch):
    """The question file of another book ran to an accuracy with every question 'unlocated' and no
    word of why: a note says none of the gold evidence occurs in the book. One located quote is enough
    to say nothing."""
    elsewhere = {**QUESTION, "Evidences": ["the brig Osprey left Dunmore at dawn", "Dunmore harbour froze"]}
    q = write(tmp_path, "q.json", [elsewhere, {**elsewhere, "QID": "T-2", "Evidences": []}])
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base",
                         server.url, "--evidence", "none"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert notes == ["note: none of the questions' 2 gold evidence quotes occurs in book.txt: are the questions "
                     "about this book?"], result.stderr
    some = write(tmp_path, "some.json", [elsewhere, {**QUESTION, "QID": "T-2"}])
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(some), "--lm", "openai/test-model", "--api-base",
                         server.url, "--evidence", "none"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "note: " not in result.stderr


def test_questions_shown_fewer_passages_than_k_are_noted(tmp_path, monkeypatch):
    """bm25 drops its lowest-ranked passages until the rest fit the window: with --k 4 passages of 512
    tokens and a 2048-token window every question saw fewer than the four the record's k says, and
    nothing said so. Passages that fit, all k of them, say nothing."""
    book = tmp_path / "book.txt"
    book.write_text("".join(f"On day {n} the keeper of the Pellmark light counted {n} barrels of oil. "
                            for n in range(600)), encoding="utf-8")
    counting = {**QUESTION, "Question": "How many barrels did the keeper count?", "Evidences": []}
    q = write(tmp_path, "q.json", [counting, {**counting, "QID": "T-2", "Question": "What did the keeper count?"}])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base",
                         server.url, "--evidence", "bm25", "--k", "4", "--passage-tokens", "512",
                         "--context-window", "2048", "-o", str(out)], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    shown = [len(p["passages"]) for p in json.loads(out.read_text())["predictions"]]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert shown == [2, 2]  # 512-token passages beside the prompt in 80% of the window
    assert notes == ["note: 2 of 2 questions were shown fewer than the k = 4 passages (2: as many as fit the context "
                     "window); lower --k or --passage-tokens to show all k"], result.stderr
    with FakeOpenAIServer(responder=answer_everything) as server:
        result = invoke(["qa", str(book), "--questions", str(q), "--lm", "openai/test-model", "--api-base",
                         server.url, "--evidence", "bm25", "--k", "2", "--passage-tokens", "128",
                         "--context-window", "2048"], tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "note: " not in result.stderr


def test_a_server_window_smaller_than_the_one_planned_for_names_context_window(tmp_path, book):
    """A self-hosted server's window is unknown, so qa plans for 8192 tokens and reads this book whole; a
    server started with a smaller one (llama.cpp's -c 512) refuses it: the line names the option to set."""
    from booklens.testing import Reply, run_command

    said = ("This model's maximum context length is 512 tokens. However, you requested 1400 tokens (1300 in the "
            "messages, 100 in the completion). Please reduce the length of the messages or completion.")
    q = write(tmp_path, "q.json", [QUESTION])
    out = tmp_path / "qa.json"
    with FakeOpenAIServer(responder=lambda body: Reply(status=400, error=said)) as server:
        result = run_command(["qa", book, "--questions", q, "--lm", "openai/fake", "--api-base", server.url,
                              "-o", out], env={**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")})
    assert_one_line_error(result, "do not fit the 512-token context window of 'openai/fake': qa plans for a "
                                  "8192-token window; set --context-window to 512 or less")
    assert not out.exists()
