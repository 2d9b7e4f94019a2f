"""The command line starts without the heavy libraries: `--help`, `--version` and errors in the
arguments or input paths load no dspy, litellm, torch, faiss, sentence-transformers, numpy,
tiktoken, llama.cpp or ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STORY = str(Path(__file__).resolve().parents[1] / "examples" / "sample_story.txt")
HEAVY = ("dspy", "litellm", "torch", "faiss", "sentence_transformers", "numpy", "tiktoken", "llama_cpp", "ray")

PROBE = """
import json, sys
sys.argv = ["booklens"] + json.loads(sys.argv[1])
import booklens.cli
code = 0
try:
    booklens.cli.main()
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print("\\n" + json.dumps({"exit": code, "heavy": sorted(m for m in %r if m in sys.modules),
                          "pydantic": "pydantic" in sys.modules}))
""" % (HEAVY,)

CASES = [
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["run"],
    ["run", "/nonexistent/book.txt", "-o", "/nonexistent/out"],
    ["run", "/nonexistent/book.txt", "-o", "out", "--evidence", "nonsense"],
    ["summarize", "/nonexistent/book.txt"],
    ["summarize", "book.txt", "--chunk-size", "many"],
    ["summarize", STORY, "--lm", "openai/x", "--api-base", "127.0.0.1:8000/v1"],
    ["summarize", STORY, "--lm", "local", "--api-base", "http://127.0.0.1:9/v1"],
    ["run", STORY, "-o", "out", "--lm", "local", "--api-base", "http://127.0.0.1:9/v1"],
    ["score", STORY, "--lm", "local", "--rpm", "5"],
    ["run", STORY, "-o", "out", "--structured", "off"],
    ["run", STORY, "-o", "out", "--summary", STORY, "--chunk-size", "1024"],
    ["summarize", STORY, "--level-budget", "100", "--max-summary-tokens", "200"],
    ["summarize", STORY, "-o", STORY],
    ["summarize", STORY, "-o", "/"],
    ["summarize", STORY, "--context-window", "0"],
    ["claims", STORY, "--lm", ""],
    ["score", "/nonexistent/summary.txt"],
    ["claims", "/nonexistent/summary.txt"],
    ["verify", "--claims", "/nonexistent/claims.json"],
    ["check", "/nonexistent/book.txt", "/nonexistent/summary.txt"],
    ["compile", "coherence", "--data", "/nonexistent/data"],
    ["report", "/nonexistent/run"],
    ["calibrate", "--help"],
    ["calibrate", "--program", "/nonexistent/program.json"],
    ["judges", "--help"],
    ["evaluate", "coherence", "--data", "/nonexistent/data"],
    ["evaluate", "coherence", "--data", "data", "--split", "holdout"],
    ["judge", "events.json", "summaries.json", "--protocol", "ranking"],
    ["sweep", "sweep.yaml", "-o", "out", "--engine", "dask"],
    ["no-such-command"],
]


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_help_and_argument_errors_load_no_heavy_library(args, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    if args in (["--help"], ["--version"]):
        # The command list takes its choices from booklens.vocabulary, not from the pydantic records.
        # (Typer itself loads pydantic to parse a command's own options.)
        assert result["pydantic"] is False
    if args[-1] in ("--help", "--version"):
        assert result["exit"] == 0
    else:  # an error: one line on stderr, no traceback
        assert result["exit"] != 0
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


GC_PROBE = """
import gc, json, sys
sys.argv = ["booklens"] + json.loads(sys.argv[1])
import booklens.cli
before = gc.get_freeze_count()
try:
    booklens.cli.main()
except SystemExit:
    pass
print("\\n" + json.dumps({"threshold": gc.get_threshold()[0], "frozen_before": before,
                          "frozen_after": gc.get_freeze_count()}))
"""


@pytest.mark.parametrize("args", [["--version"], ["summarize", "/nonexistent/book.txt"]])
def test_a_command_collects_garbage_less_often_and_skips_the_collection_at_exit(args, tmp_path):
    from booklens.collector import STARTUP_THRESHOLD

    proc = subprocess.run([sys.executable, "-c", GC_PROBE, json.dumps(args)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # These commands never load the LM layer: they keep the start-up threshold to the end.
    assert result["threshold"] == STARTUP_THRESHOLD > 700  # Python's default
    # Every object alive when the command ends is frozen, so interpreter shutdown does not walk them.
    assert result["frozen_before"] == 0 and result["frozen_after"] > 10_000


LOAD_PROBE = """
import gc, json
from booklens.collector import defer_collection
collections = []
gc.callbacks.append(lambda phase, info: collections.append(info["generation"]) if phase == "start" else None)
defer_collection()
import booklens.lm.model
loading = len(collections)
after = (gc.get_threshold()[0], gc.get_freeze_count())
print("\\n" + json.dumps({"loading": loading, "threshold": after[0], "frozen": after[1]}))
"""


def test_a_command_makes_no_collection_while_it_loads_the_lm_layer_and_freezes_it_after(tmp_path):
    """Young-generation collections during the import of DSPy and LiteLLM walked half a million objects
    that are never garbage: 59 collections, 0.22 s of a 1.8 s import on 2 cores. The command now makes
    none until the layer is loaded, then freezes it and collects at the usual threshold."""
    from booklens.collector import GC_THRESHOLD

    proc = subprocess.run([sys.executable, "-c", LOAD_PROBE], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loading"] <= 1  # at most one per million allocations; none at 10,000 would mean dozens
    assert result["threshold"] == GC_THRESHOLD and result["frozen"] > 100_000


def test_importing_the_lm_layer_leaves_a_library_callers_collector_alone(tmp_path):
    probe = ("import gc, json; gc.set_threshold(700); import booklens.lm.model; "
             "print(json.dumps([gc.get_threshold()[0], gc.get_freeze_count()]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [700, 0]


def test_a_command_run_in_the_test_process_leaves_its_collector_as_it_was():
    import gc

    from booklens.testing import run_command

    threshold = gc.get_threshold()
    assert run_command(["--version"]).returncode == 0
    # What later commands leave in reference cycles is still collected.
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == threshold


COMPILED_PROBE = """
import importlib.util, json, os, sys, sysconfig
import booklens.lm.model
from booklens.lm import make_lm
try:  # the LM layer, and what LiteLLM loads on a call (its client, parts of its proxy's package)
    make_lm("openai/probe", api_base="http://127.0.0.1:9/v1", use_cache=False)("A call nothing answers.")
except Exception:
    pass
from booklens.text import split_sentences
split_sentences("Mr. Darcy came at 5 p.m. He left.")  # Punkt's English model
from booklens.retrieval.index import embed
embed(["A sentence to embed."])  # sentence-transformers, transformers' BERT, torch
purelib = sysconfig.get_path("purelib")
files = [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
files = [f for f in files if f.endswith(".py") and f.startswith(purelib)]
print("\\n" + json.dumps({"checked": len(files),
                          "missing": [f for f in files if not os.path.exists(importlib.util.cache_from_source(f))]}))
"""


def test_what_commands_load_from_site_packages_was_byte_compiled(tmp_path):
    """install.sh byte-compiles site-packages except what no booklens process loads. Where Python
    writes no bytecode (PYTHONDONTWRITEBYTECODE, as in CI), a module it left out would be compiled
    again by every command that imports it: the LM layer, sentence splitting and the dense model
    must find theirs compiled."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # this probe must not write what it checks
    proc = subprocess.run([sys.executable, "-c", COMPILED_PROBE], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["checked"] > 1000
    assert result["missing"] == []


def test_scoring_human_annotations_loads_no_lm_layer(tmp_path, shared_dir):
    """`score --annotations` and `agree` compute BooookScore from annotation files: no LM, so neither
    DSPy nor LiteLLM loads, and the command answers in well under a second instead of several."""
    data = shared_dir / "data" / "booookscore"
    for args in (["score", "--annotations", data / "gpt4" / "gpt4-2048-hier.json",
                  "--summaries", data / "summaries" / "gpt4-2048-hier-cleaned.json"],
                 ["agree", data / "human" / "annotations-gpt4-4096-inc.json",
                  data / "human" / "summary-gpt4-4096-inc.json"]):
        proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([str(a) for a in args])], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["exit"] == 0, proc.stderr
        assert not {"dspy", "litellm"} & set(result["heavy"]), (args[0], result["heavy"])


def test_every_command_help_fits_an_80_column_terminal_with_its_option_names_whole():
    import typer.main
    from typer.testing import CliRunner

    from booklens.cli import app

    def commands(group, path):
        for name, sub in group.commands.items():
            if getattr(sub, "commands", None):
                yield from commands(sub, [*path, name])
            else:
                yield [*path, name], sub

    runner = CliRunner()
    checked = 0
    for path, command in commands(typer.main.get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], terminal_width=80)
        assert result.exit_code == 0, path
        assert max(len(line) for line in result.output.splitlines()) <= 80, path
        for param in command.params:
            for name in param.opts:
                if name.startswith("-"):
                    assert name in result.output, (path, name)  # not cut to "--max-summary-to…"
        checked += 1
    assert checked >= 19


@pytest.mark.parametrize("args", [[], ["bias"], ["data"], ["data", "stats"]], ids=["booklens", "bias", "data",
                                                                                    "data-stats"])
def test_a_command_group_without_its_command_shows_its_help_not_an_error(args):
    """The help a group shows when no command is named came out as one 'error: Usage: ...' wrapping the
    whole help screen, followed by '(see booklens --help)'."""
    from booklens.testing import run_command

    proc = run_command(args, env={**os.environ})
    usage = proc.stderr.splitlines()[0]  # the program's name is as click finds it (python -m booklens, ...)
    assert proc.returncode == 2 and proc.stdout == ""
    expected = " ".join(["booklens", *args, "[OPTIONS] COMMAND [ARGS]..."])
    assert usage.startswith("Usage: ") and usage.endswith(expected), proc.stderr
    assert "\nCommands:\n" in proc.stderr and "error" not in proc.stderr and "(see " not in proc.stderr


def test_a_process_that_runs_several_commands_builds_the_command_line_once(monkeypatch):
    """Building the click command from the app evaluates every option's annotations (0.07 s on 2 cores);
    a process that runs commands one after another (the tests, a notebook) builds it once, and the
    commands it runs still get their own options, help and Ctrl-C handling."""
    import typer.main

    import booklens.cli as cli
    from booklens.testing import run_command

    builds = []
    build = typer.main.get_command

    def counted(app):
        builds.append(app)
        return build(app)

    monkeypatch.setattr(typer.main, "get_command", counted)
    monkeypatch.setattr(cli, "_built", [])
    assert run_command(["--version"]).returncode == 0
    help_screen = run_command(["summarize", "--help"])
    assert help_screen.returncode == 0 and "--chunk-size" in help_screen.stdout
    refused = run_command(["summarize", "--chunk-size", "0"])
    assert refused.returncode == 2 and "--chunk-size" in refused.stderr
    assert len(builds) == 1
