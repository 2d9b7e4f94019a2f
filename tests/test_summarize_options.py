"""`summarize_book` (the library behind `booklens summarize`) with the merge-context and
word-per-token options: the record says what ran, and the prompts follow it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from booklens.lm import BooklensAdapter
from booklens.steps import summarize_book
from booklens.testing import ScriptedLM

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"


def respond(call):
    if "cleaned" in call.output_fields:
        return {"cleaned": call.inputs["summary"]}
    words = int(call.inputs["word_limit"]) * 6 // 10
    return {"summary": " ".join(["Maren kept the light."] * max(1, words // 4))}


def run(**options):
    lm = ScriptedLM(respond)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        # G_n at every level keeps the merge tree of the short story several merges wide.
        record = summarize_book(STORY, chunk_size=256, context_window=1024, max_summary_tokens=200,
                                level_budgets=[200], remove_artifacts=False, concurrency=2, **options)
    return record, lm


def test_defaults_are_the_papers():
    record, lm = run()
    assert record.config.merge_context == "same-level" and record.config.words_per_token == 0.65
    merges = [n for n in record.nodes if n.kind == "merge"]
    later = [n for n in merges if n.context is not None]
    assert later, "the story makes a level with several merges"
    assert all(n.context in {m.id for m in merges if m.level == n.level} for n in later)
    assert int(lm.backend.calls[0].inputs["word_limit"]) == int(record.nodes[0].budget * 0.65)


def test_lower_level_context_and_another_word_ratio():
    record, lm = run(merge_context="lower-level", words_per_token=0.75)
    assert record.config.merge_context == "lower-level" and record.config.words_per_token == 0.75
    by_id = {n.id: n for n in record.nodes}
    for node in record.nodes:
        if node.context is not None:
            assert by_id[node.context].level == node.level - 1  # a summary of the level below
    assert int(lm.backend.calls[0].inputs["word_limit"]) == int(record.nodes[0].budget * 0.75)


def test_an_unknown_merge_context_is_an_argument_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "booklens", "summarize", str(STORY), "--merge-context", "sideways"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "sideways" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("option", [["--context-window", "0"], ["--level-budget", "0"], ["--level-budget", "-100"],
                                    ["--chunk-size", "16"], ["--max-summary-tokens", "8"]])
def test_options_below_their_least_are_argument_errors(option, tmp_path):
    from booklens.testing import run_command

    proc = run_command(["summarize", str(STORY), *option, "-o", str(tmp_path / "out.json")])
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: Invalid value for '{option[0]}'"), proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_summarize_and_run_take_the_same_summarizer_bounds():
    """One set of least values (`booklens.vocabulary`) for every command that summarizes."""
    import typer

    from booklens import vocabulary as v
    from booklens.cli import app

    least = {"--chunk-size": v.MIN_CHUNK_SIZE, "--context-window": v.MIN_CONTEXT_WINDOW,
             "--max-summary-tokens": v.MIN_SUMMARY_TOKENS}
    commands = typer.main.get_command(app).commands
    for name in ("summarize", "run"):
        bounds = {p.opts[0]: p.min for p in commands[name].params if p.opts[0] in least}
        assert bounds == least, name
    from booklens.cli.summarize import words_per_token
    from booklens.errors import BooklensError

    assert words_per_token(str(v.MIN_WORDS_PER_TOKEN)) == v.MIN_WORDS_PER_TOKEN
    assert words_per_token(str(v.MAX_WORDS_PER_TOKEN)) == v.MAX_WORDS_PER_TOKEN
    for beyond in (v.MIN_WORDS_PER_TOKEN - 0.01, v.MAX_WORDS_PER_TOKEN + 0.01):
        with pytest.raises(BooklensError, match="must be between"):
            words_per_token(str(beyond))


def test_level_budgets_are_refused_for_incremental_updating(tmp_path):
    """The record would list them as if they had shaped a summary they play no part in."""
    from booklens.errors import BooklensError
    from booklens.testing import run_command

    proc = run_command(["summarize", str(STORY), "--method", "inc", "--level-budget", "200",
                        "-o", str(tmp_path / "out.json")])
    assert proc.returncode == 2 and proc.stderr.startswith("error: --level-budget is for --method hier"), proc.stderr
    assert not (tmp_path / "out.json").exists()
    with pytest.raises(BooklensError, match="--level-budget is for --method hier"):
        run(method="inc")


def test_a_merge_context_is_refused_for_incremental_updating_and_defaults_to_the_papers_for_hier(tmp_path):
    from booklens.errors import BooklensError
    from booklens.steps import book_summarizer
    from booklens.testing import run_command

    proc = run_command(["summarize", str(STORY), "--method", "inc", "--merge-context", "none",
                        "-o", str(tmp_path / "out.json")])
    assert proc.returncode == 2 and proc.stderr.startswith("error: --merge-context is for --method hier"), proc.stderr
    assert not (tmp_path / "out.json").exists()
    with pytest.raises(BooklensError, match="--merge-context is for --method hier; --method inc makes no merges"):
        book_summarizer(method="inc", merge_context="same-level")
    assert book_summarizer(method="hier").merge_context == "same-level"


@pytest.mark.parametrize("method", ["hier", "inc"])
def test_both_methods_run_at_the_least_settings_the_commands_take(method):
    """The bounds are settings that work, not only settings that parse."""
    from booklens import vocabulary as v

    lm = ScriptedLM(respond)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        record = summarize_book(STORY, method=method, chunk_size=v.MIN_CHUNK_SIZE, context_window=v.MIN_CONTEXT_WINDOW,
                                max_summary_tokens=v.MIN_SUMMARY_TOKENS, remove_artifacts=False, concurrency=2)
    assert record.summary.strip() and record.config.context_window == v.MIN_CONTEXT_WINDOW


def test_every_command_defaults_to_the_settings_the_library_runs_without_them():
    """A setting left out means the same on the command line, in a run or sweep config and in the
    library: the commands' defaults and floors are the configs' and the programs'."""
    import inspect

    import typer.main

    import booklens.cli  # noqa: F401 - registers the commands
    from booklens.cli import app
    from booklens.pipeline import JudgeConfig, SystemConfig
    from booklens.programs.qa import BookQA
    from booklens.programs.summarizer import make_summarizer

    commands = typer.main.get_command(app).commands
    system, judge = SystemConfig.model_fields, JudgeConfig.model_fields

    def option(command: str, name: str):
        return next(p for p in commands[command].params if p.name == name)

    def floor(field) -> int:
        return next(m.ge for m in field.metadata if hasattr(m, "ge"))

    for method in ("hier", "inc"):
        summarizer = make_summarizer(method)
        for command in ("summarize", "run"):
            for name in ("chunk_size", "max_summary_tokens"):
                assert option(command, name).default == system[name].default == getattr(summarizer, name), name
            assert option(command, name).min == floor(system[name]), (command, name)
    from booklens.retrieval import retrieval_settings

    qa = inspect.signature(BookQA.__init__).parameters
    # k and the passage size are None until given (so that one given where the mode never uses it is
    # refused, its default value too), then the defaults of one place
    assert retrieval_settings() == (judge["k"].default, judge["passage_tokens"].default)
    for command in ("run", "verify", "check", "qa"):
        assert option(command, "k").default is None and option(command, "passage_tokens").default is None, command
        assert option(command, "passage_tokens").min == floor(judge["passage_tokens"]), command
        if command != "qa":
            assert option(command, "budget_tokens").min == floor(judge["budget_tokens"]), command
    assert (qa["k"].default, qa["passage_tokens"].default) == (judge["k"].default, judge["passage_tokens"].default)


@pytest.mark.parametrize("command", ["summarize", "run"])
def test_words_per_token_that_is_no_number_is_named_so(tmp_path, command):
    """`--words-per-token nan` was refused as if it were above the bound ('less than or equal to 2')."""
    from booklens.testing import run_command

    proc = run_command([command, str(STORY), "--words-per-token", "nan", "-o", str(tmp_path / "out")])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "finite number" in proc.stderr and "less than" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command, option, value, allowed", [
    ("summarize", "--max-regenerations", "-1", "0 to 10"),
    ("summarize", "--max-regenerations", "11", "0 to 10"),
    ("summarize", "--max-regenerations", "1000000000", "0 to 10"),
    ("run", "--max-regenerations", "1000000000", "0 to 10"),
    ("score", "--tries", "0", "1 to 10"),
    ("score", "--tries", "-3", "1 to 10"),
    ("score", "--tries", "1000000000", "1 to 10"),
])
def test_a_retry_count_out_of_its_range_is_one_line_naming_the_range(tmp_path, command, option, value, allowed):
    """10**9 tries (a stray string of zeros) was taken, and would pay for one failing call again and
    again; 0 and negative counts were refused without the range."""
    from booklens.testing import run_command

    out = tmp_path / "out"
    proc = run_command([command, str(STORY), option, value, "--lm", "openai/fake", "--api-base",
                        "http://127.0.0.1:9/v1", "-o", str(out)])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0] == f"error: {option} must be from {allowed} (got {value})", lines[0]
    assert not out.exists()


def test_retry_counts_have_one_range_for_the_commands_the_library_and_manifests():
    import typer.main

    from booklens.cli import app
    from booklens.errors import BooklensError
    from booklens.pipeline import SystemConfig
    from booklens.programs.coherence import build_scorer
    from booklens.programs.summarizer import make_summarizer
    from booklens.vocabulary import RETRY_RANGES

    assert RETRY_RANGES == {"--tries": (1, 10), "--max-regenerations": (0, 10)}
    commands = typer.main.get_command(app).commands
    for command, name, option in (("score", "tries", "--tries"), ("summarize", "max_regenerations", "--max-regenerations"),
                                  ("run", "max_regenerations", "--max-regenerations")):
        help_text = next(p for p in commands[command].params if p.name == name).help
        low, high = RETRY_RANGES[option]
        assert f"{low} to {high}" in help_text, (command, help_text)
    for low_high in ((0, 10), (10, 10)):
        make_summarizer("hier", max_regenerations=low_high[0])
    with pytest.raises(BooklensError, match=r"^max_regenerations must be from 0 to 10 \(got 11\)$"):
        make_summarizer("hier", max_regenerations=11)
    with pytest.raises(BooklensError, match=r"^tries must be from 1 to 10 \(got 11\)$"):
        build_scorer(tries=11)
    assert SystemConfig(max_regenerations=10).max_regenerations == 10
    with pytest.raises(ValueError, match=r"^SystemConfig: max_regenerations: must be from 0 to 10 \(got 1000000000\)$"):
        SystemConfig(max_regenerations=10**9)
