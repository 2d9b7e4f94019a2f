"""A context window larger than the model's is refused in one line that says where the figure came
from (the default or the option) and what to give instead, by every command that takes one, before
anything is written or asked."""

from __future__ import annotations

from pathlib import Path

import dspy
import pytest

import booklens  # noqa: F401 - offline settings before dspy imports litellm
from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter
from booklens.testing import ScriptedLM, run_command

# A model LiteLLM's map gives a 4,096-token window; the server is never reached.
SMALL_MODEL = ["--lm", "azure_ai/Phi-3-mini-4k-instruct", "--api-base", "http://127.0.0.1:9/v1"]
DEFAULT_TOO_LARGE = ("the default context window 8192 is larger than this model's 4096: set --context-window "
                     "to 4096 or less")


@pytest.fixture
def book(tmp_path: Path) -> Path:
    path = tmp_path / "book.txt"
    path.write_text("Mara walked to the mill. She met Tom by the gate.\n" * 20)
    return path


def test_summarize_book_says_the_default_was_too_large(book):
    from booklens.steps import summarize_book

    lm = ScriptedLM(lambda call: "Mara walked.", context_window=4096)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        # a library call names the keyword where the command names its option
        with pytest.raises(BooklensError, match=f"^{DEFAULT_TOO_LARGE.replace('--context-window', 'context_window')}$"):
            summarize_book(book)
        with pytest.raises(BooklensError, match="^context_window 6000 is larger than this model's 4096: "
                                                "set context_window to 4096 or less$"):
            summarize_book(book, context_window=6000)
    assert lm.backend.calls == []


def one_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    return lines[0]


def test_summarize_names_the_default_not_an_option_never_given(book, tmp_path):
    result = run_command(["summarize", book, "-o", tmp_path / "s.json", *SMALL_MODEL])
    assert one_line(result) == f"error: {DEFAULT_TOO_LARGE}"
    assert not (tmp_path / "s.json").exists()


def test_run_refuses_the_default_window_before_writing_anything(book, tmp_path):
    result = run_command(["run", book, "-o", tmp_path / "run", *SMALL_MODEL])
    assert one_line(result) == f"error: {DEFAULT_TOO_LARGE}"
    assert not (tmp_path / "run").exists()


def test_a_sweep_refuses_the_default_window_in_the_manifest_s_words(book, tmp_path):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(f"books: [{book}]\nsystems: [{{name: a}}, {{name: b, context_window: 2048}}]\n")
    result = run_command(["sweep", manifest, "-o", tmp_path / "sweep", *SMALL_MODEL])
    assert one_line(result) == (f"error: {manifest}: system 'a': the default context window 8192 is larger than "
                                "this model's 4096: set context_window to 4096 or less")
    assert not (tmp_path / "sweep").exists()
    manifest.write_text(f"books: [{book}]\nsystems: [{{name: b, context_window: 6000}}]\n")
    result = run_command(["sweep", manifest, "-o", tmp_path / "sweep", *SMALL_MODEL])
    assert one_line(result) == (f"error: {manifest}: system 'b': context_window 6000 is larger than this "
                                "model's 4096: set context_window to 4096 or less")


REPO = Path(__file__).resolve().parents[1]


def test_qa_refuses_a_context_window_larger_than_the_model_s_before_any_call(book, tmp_path):
    questions = REPO / "examples" / "qa" / "the_cask_of_amontillado.json"
    out = tmp_path / "qa.json"
    for evidence in ("none", "book"):
        result = run_command(["qa", book, "--questions", questions, "--evidence", evidence, "--context-window",
                              6000, "-o", out, *SMALL_MODEL])
        assert one_line(result) == ("error: --context-window 6000 is larger than this model's 4096: set "
                                    "--context-window to 4096 or less")
    assert not out.exists()


def test_diverse_refuses_a_context_window_larger_than_the_model_s_before_any_call(tmp_path):
    events = REPO / "examples" / "diverse" / "harbor_bridge_closure.json"
    out = tmp_path / "d.json"
    result = run_command(["diverse", events, "--context-window", 6000, "-o", out, *SMALL_MODEL])
    assert one_line(result) == ("error: --context-window 6000 is larger than this model's 4096: set "
                                "--context-window to 4096 or less")
    assert not out.exists()


def test_qa_and_diverse_take_the_model_s_window_when_none_is_given(tmp_path):
    """Their default is the model's own window (not the summarizer's 8192): nothing to refuse."""
    from booklens.diverse_runs import run_diverse

    import json

    lm = ScriptedLM(lambda call: {"summary": "Sources disagree on the cause."}, context_window=4096)
    events = tmp_path / "events.json"
    events.write_text(json.dumps([{"eid": "e1", "articles": [
        {"aid": f"a{i}", "title": f"T{i}", "url": "", "domain": "x.org", "content": f"The toll is {i} dollars."}
        for i in range(2)]}]))
    result = run_diverse(events, lm=lm, judge=False, method="direct", cache_dir=tmp_path / "c")
    assert result["events"][0]["summary"] == "Sources disagree on the cause."
