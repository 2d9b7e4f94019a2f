"""Every LM command through a real llama.cpp server (llama-cpp-python's OpenAI-compatible server on
the embedded SmolLM2 GGUF, started once per session by the `llama_server` fixture), as a user runs
them: `--lm openai/<alias> --api-base http://127.0.0.1:PORT/v1`. The server refuses the
`json_schema` response format, so these runs also show the fallback to `json_object` with the
schema; every structured answer must parse. Inputs are tiny: a ten-sentence story, a
three-sentence summary, one claim verified from it and one given with quotes, two questions."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import dspy
import pytest

from booklens.errors import BooklensError
from booklens.programs.base import Predict
from booklens.testing import run_command

pytestmark = pytest.mark.real_server

STORY = """The Lamp at Pellmark

Mara kept the lighthouse at Pellmark for twenty years. Every Thursday the tender Marigold brought her oil and \
bread from the mainland. One winter the Marigold did not come, because a storm had broken its mast.

Mara rationed the oil and burned the lamp only in the darkest hours. On the ninth night a fishing boat lost in \
the fog saw the light and turned away from the rocks. Its captain, a young man named Tobin, came ashore the next \
morning to thank her.

When the storm passed, Tobin sailed to the mainland and returned with oil for the whole winter. Mara never \
rationed the lamp again.
"""
SUMMARY = ("Mara keeps the lighthouse at Pellmark and receives supplies every Thursday from the tender Marigold. "
           "When a storm breaks the Marigold's mast, she rations the oil and keeps the lamp burning in the darkest "
           "hours. A fisherman named Tobin is saved by the light and later brings her oil for the whole winter.\n")
QUESTIONS = [
    {"QID": "Q1", "Question": "Which boat brought Mara supplies?", "Answer": "The Marigold", "Gold": "B",
     "Options": {"A": "The Heron", "B": "The Marigold", "C": "The Swift", "D": "The Lantern"},
     "Aspect": "plot", "Complexity": "sh"},
    {"QID": "Q2", "Question": "Who brought oil for the whole winter?", "Answer": "Tobin", "Gold": "C",
     "Options": {"A": "Mara", "B": "The captain of the Marigold", "C": "Tobin", "D": "Nobody"},
     "Aspect": "character", "Complexity": "sh"},
]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "story.txt").write_text(STORY, encoding="utf-8")
    (tmp_path / "summary.txt").write_text(SUMMARY, encoding="utf-8")
    (tmp_path / "questions.json").write_text(json.dumps(QUESTIONS), encoding="utf-8")
    return tmp_path


def booklens(args: list[str], folder: Path, server, monkeypatch, *, judged_nothing_ok: bool = False) -> dict:
    """Run a command in-process against the server; return the JSON it wrote. With
    `judged_nothing_ok`, a scoring command may also stop because the judge gave no valid verdict on
    any sentence (it writes its record first): what the 135M model answers differs with the CPU."""
    from typer.testing import CliRunner

    from booklens.cli import app

    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(folder / "cache"))
    monkeypatch.chdir(folder)
    out = folder / "out.json"
    try:
        result = CliRunner().invoke(app, [*args, "--lm", server.lm, "--api-base", server.url, "-o", str(out)],
                                    catch_exceptions=False)
    except BooklensError as error:
        if not (judged_nothing_ok and str(error).startswith("the judge gave no valid verdict")):
            raise
    else:
        assert result.exit_code == 0, result.output
    return json.loads(out.read_text(encoding="utf-8"))


def test_summarize(inputs, llama_server, monkeypatch):
    data = booklens(["summarize", "story.txt", "--chunk-size", "512", "--max-summary-tokens", "120",
                     "--max-regenerations", "0", "--keep-artifacts"], inputs, llama_server, monkeypatch)
    assert data["summary"].strip()
    assert data["usage"]["calls"] >= 1


def assert_every_answer_parsed(data: dict) -> None:
    """Each answer parsed under the schema. What the 135M model says differs with the CPU llama.cpp was
    built for: it may leave a sentence of a batch unanswered (the schema does not fix the number of
    answers) or break a rule the program checks (a confusion with no error type). Either is recorded
    against its sentence, not guessed, and counted as a failure; when every sentence fails so, the
    command stops after writing the record. (One try each: a re-ask samples, and the server's grammar
    lets a sampled string hold a raw line break, which no JSON parser takes.)"""
    errors = [s["error"] for s in data["sentences"] if s["status"] != "ok"]
    assert not any("unparseable" in e or "cut off" in e for e in errors), errors
    assert all(s["status"] == "ok" or s["error"] for s in data["sentences"])
    assert data["n_failed"] == len(errors)


# The judging commands run their zero-shot programs here: the shipped few-shot prompts (some 6K
# tokens of demos) do not fit the test server's 4096-token window, and these tests are about the
# backend path (schemas, dialects, parsing); the few-shot verifier runs end to end on the embedded
# model (test_faithfulness_cli).
def test_score_per_sentence(inputs, llama_server, monkeypatch):
    data = booklens(["score", "summary.txt", "--zero-shot", "--tries", "1"], inputs, llama_server, monkeypatch,
                    judged_nothing_ok=True)
    assert data["n_sentences"] == 3
    assert data["usage"]["calls"] == 3  # one call per sentence
    assert_every_answer_parsed(data)


def test_score_batched(inputs, llama_server, monkeypatch):
    data = booklens(["score", "summary.txt", "--zero-shot", "--batch-size", "3", "--tries", "1"], inputs, llama_server,
                    monkeypatch, judged_nothing_ok=True)
    assert data["n_sentences"] == 3
    assert data["usage"]["calls"] == 1  # the three sentences go to the server in one call
    assert_every_answer_parsed(data)


def test_check(inputs, llama_server, monkeypatch):
    # claims, then verification with BM25 evidence: the `claims` and `verify` paths in one command
    data = booklens(["check", "story.txt", "summary.txt", "--evidence", "bm25", "--zero-shot", "--max-claims", "1"],
                    inputs, llama_server, monkeypatch)
    assert data["failures"] == 0 and not data.get("error")
    assert data["claims"] and all(v["label"] is not None for v in data["claims"])


def test_qa(inputs, llama_server, monkeypatch):
    data = booklens(["qa", "story.txt", "--questions", "questions.json", "--evidence", "bm25"], inputs, llama_server,
                    monkeypatch)
    predictions = data["predictions"]
    assert len(predictions) == 2
    assert all(p["prediction"] in ("A", "B", "C", "D") and not p.get("error") for p in predictions)


# ---------------------------------------------------------------------------
# Faults the real server produces


class Classify(dspy.Signature):
    """Label the text."""

    text: str = dspy.InputField()
    label: Literal["good", "bad"] = dspy.OutputField()


def test_the_server_refuses_json_schema_and_gets_json_object_with_the_schema(llama_server):
    from booklens.lm import BooklensAdapter, BooklensLM, LiteLLMBackend

    backend = LiteLLMBackend(llama_server.lm, api_base=llama_server.url, structured="auto")
    # Earlier tests of the session may have taught the backend already; a forced dialect shows both answers.
    with pytest.raises(Exception, match="refused the 'schema' structured-output format"):
        with dspy.context(lm=BooklensLM(LiteLLMBackend(llama_server.lm, api_base=llama_server.url,
                                                       structured="schema")), adapter=BooklensAdapter()):
            Predict(Classify)(text="A warm, bright morning.")
    with dspy.context(lm=BooklensLM(backend), adapter=BooklensAdapter()):
        prediction = Predict(Classify)(text="A warm, bright morning.")
    assert prediction.label in ("good", "bad")
    assert backend.dialect == "json"


def test_an_answer_cut_off_by_the_server_is_re_asked_with_a_larger_budget(llama_server):
    from booklens.lm import BooklensAdapter, BooklensLM, LiteLLMBackend, predict_with_retries

    lm = BooklensLM(LiteLLMBackend(llama_server.lm, api_base=llama_server.url))
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = predict_with_retries(Predict(Classify), tries=4, config={"max_tokens": 3},
                                      text="A warm, bright morning.")
    budgets = [entry["kwargs"]["max_tokens"] for entry in lm.history]
    reasons = [entry["response"].choices[0].finish_reason for entry in lm.history]
    assert reasons[0] == "length"  # three tokens cannot hold the JSON answer
    assert budgets == [min(12, 3 * 2**i) for i in range(len(budgets))] and len(budgets) >= 2
    assert result.ok and result.prediction.label in ("good", "bad") and result.attempts == len(budgets)


def test_a_prompt_larger_than_the_servers_context_is_one_line_with_its_figures(llama_server, tmp_path):
    # The server's own words, as captured from llama-cpp-python's server with a 4096-token context:
    # "This model's maximum context length is 4096 tokens. However, you requested N tokens
    # (P in the messages, C in the completion)."
    summary = tmp_path / "long.txt"
    summary.write_text(" ".join(["The keeper lit the lamp at dusk and watched the sea."] * 600), encoding="utf-8")
    environ = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    environ.pop("BOOKLENS_DEBUG", None)
    result = run_command(["claims", summary, "--lm", llama_server.lm, "--api-base", llama_server.url], env=environ)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: the prompt (")
    assert "do not fit the 4096-token context window of 'openai/smol'" in lines[0]


def test_evidence_planned_for_a_larger_window_names_the_option_and_a_given_one_fits(llama_server, inputs,
                                                                                     monkeypatch):
    """llama-cpp-python's server states no window, so given quotes are cut for the default 8192 tokens
    and the 4096-token server refuses them: the line names the judges' --context-window, and with it
    the same claim is judged."""
    quotes = " ".join(["Mara rationed the oil and burned the lamp only in the darkest hours."] * 500)
    (inputs / "claims.json").write_text(json.dumps([{"claim": "Mara rationed the oil.", "evidence": [quotes]}]),
                                        encoding="utf-8")
    args = ["verify", "--claims", "claims.json", "--evidence", "given", "--zero-shot"]
    environ = {**os.environ, "BOOKLENS_CACHE_DIR": str(inputs / "cache")}
    environ.pop("BOOKLENS_DEBUG", None)
    monkeypatch.chdir(inputs)
    result = run_command([*args, "--lm", llama_server.lm, "--api-base", llama_server.url], env=environ)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0].endswith("context window of 'openai/smol': the judge plans for a 8192-token window; set "
                             "--context-window to 4096 or less"), lines[0]
    data = booklens([*args, "--context-window", "1024"], inputs, llama_server, monkeypatch)
    assert data["budget_tokens"] < 1024 and len(data["claims"]) == 1 and not data["failures"]


def test_a_summary_planned_for_a_larger_window_names_every_setting_the_servers_window_needs(llama_server, tmp_path):
    """The 4096-token server refuses the first 4000-token chunk, planned for 8192 tokens (no generation:
    one request). The line names --context-window and, at that window, the chunk and summary settings
    that fit it, so the rerun it advises passes the check before any call."""
    environ = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    environ.pop("BOOKLENS_DEBUG", None)
    story = Path(__file__).resolve().parents[1] / "examples" / "sample_story.txt"
    result = run_command(["summarize", story, "--chunk-size", "4000", "--lm", llama_server.lm, "--api-base",
                          llama_server.url, "-o", tmp_path / "s.json"], env=environ)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0].endswith("context window of 'openai/smol': the summarizer plans for a 8192-token window; set "
                             "--context-window to 4096 or less (at 4096: --chunk-size to 2361 or less)"), lines[0]
    assert not (tmp_path / "s.json").exists()
