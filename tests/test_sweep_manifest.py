"""Sweep manifests: books from files, folders and globs; every way a manifest can be wrong is one
line on stderr, a non-zero exit code, and nothing written (checked before any LM or model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from booklens.errors import BooklensError
from booklens.sweep.manifest import load_manifest


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write(tmp_path / "corpus" / "alpha.txt", "Alpha went to sea. He came back.\n")
    write(tmp_path / "corpus" / "beta.txt", "Beta stayed home. She read.\n")
    write(tmp_path / "corpus" / "notes.md", "not a book\n")
    write(tmp_path / "more" / "gamma.txt", "Gamma.\n")
    write(tmp_path / "released.json", json.dumps({"alpha": "A sails.", "beta": "B reads.", "gamma": "G.",
                                                  "extra": "ignored"}))
    return tmp_path


def test_books_from_globs_folders_and_files_resolve_relative_to_the_manifest(corpus: Path):
    manifest = write(corpus / "m.yaml", """
lm: openai/some-model
books: [corpus/*.txt, more, corpus/alpha.txt]
systems:
  - {name: hier-512, method: hier, chunk_size: 512}
  - {name: released, summaries: released.json}
judge: {steps: [coherence], evidence: none, max_claims: 3}
""")
    sweep = load_manifest(manifest, api_base="http://x/v1")
    assert [(b.key, b.path) for b in sweep.books] == [("alpha", corpus / "corpus" / "alpha.txt"),
                                                     ("beta", corpus / "corpus" / "beta.txt"),
                                                     ("gamma", corpus / "more" / "gamma.txt")]
    assert [c.name for c in sweep.cells] == ["hier-512/alpha", "hier-512/beta", "hier-512/gamma",
                                            "released/alpha", "released/beta", "released/gamma"]
    assert sweep.lm == "openai/some-model" and sweep.api_base == "http://x/v1"
    assert load_manifest(manifest, lm="openai/other").lm == "openai/other"  # --lm overrides the manifest
    assert sweep.summaries["released"] == {"alpha": "A sails.", "beta": "B reads.", "gamma": "G."}
    # settings left out are not pinned here: the pipeline's defaults apply
    assert sweep.systems[0].model_dump(exclude_unset=True) == {"name": "hier-512", "method": "hier",
                                                               "chunk_size": 512}
    assert sweep.judge.model_dump(exclude_unset=True) == {"steps": ["coherence"], "evidence": "none",
                                                          "max_claims": 3}


BAD = {
    "missing book": ("books: [corpus/alpha.txt, corpus/nope.txt]\nsystems: [{name: a}]\n",
                     "book not found:"),
    "glob matching nothing": ("books: ['corpus/*.epub']\nsystems: [{name: a}]\n", "matches no file"),
    "unknown key": ("books: corpus\nsystems: [{name: a, chunk_sze: 512}]\n",
                    "system 'a': unknown key 'chunk_sze' (did you mean 'chunk_size'?)"),
    "unknown top-level key": ("books: corpus\nsystem: [{name: a}]\n", "unknown key 'system'"),
    "duplicate system": ("books: corpus\nsystems: [{name: a}, {name: a, method: inc}]\n",
                         "two systems are named 'a'"),
    "summaries lacking a book": ("books: [corpus, more]\nsystems: [{name: r, summaries: partial.json}]\n",
                                 "partial.json has no summary for the book 'gamma'"),
    "unknown method": ("books: corpus\nsystems: [{name: a, method: tree}]\n",
                       "system 'a': method: \"tree\" is not one of 'hier' or 'inc'"),
    "malformed YAML": ("books: [corpus\nsystems: [{name: a}]\n", "is not valid YAML (line 2"),
    "bad type": ("books: corpus\nsystems: [{name: a, chunk_size: 2k}]\n", "chunk_size: Input should be a valid integer"),
    "given evidence": ("books: corpus\nsystems: [{name: a}]\njudge: {evidence: given}\n",
                       "unknown evidence mode 'given' for a book run"),
    "summarizer keys on a summaries system": ("books: corpus\nsystems: [{name: r, summaries: released.json, "
                                              "chunk_size: 512}]\n", "chunk_size would not apply"),
    "two books with one key": ("books: [corpus/alpha.txt, other/alpha.txt]\nsystems: [{name: a}]\n",
                               "two books have the key 'alpha'"),
    "system name that is a path": ("books: corpus\nsystems: [{name: ../up}]\n", "name '../up' must start"),
    "no systems": ("books: corpus\nsystems: []\n", "systems: List should have at least 1 item"),
    "not a mapping": ("- corpus\n", "a manifest is a YAML mapping"),
    "missing systems": ("books: corpus\n", "missing key 'systems'"),
    "context too small for the chunks": ("books: corpus\nsystems: [{name: a, chunk_size: 4096, context_window: 2048}]\n",
                                         "m.yaml: system 'a': a chunk of 4096 tokens does not fit the 2048-token "
                                         "context window with a 900-token summary and the prompt; lower chunk_size "
                                         "or max_summary_tokens, or raise context_window"),
    "chunks below the summarizer's least": (
        "books: corpus\nsystems: [{name: a, chunk_size: 32}]\n",
        "m.yaml: system 'a': chunk_size: Input should be greater than or equal to 64 (got 32)"),
    "server without a scheme": ("books: corpus\nsystems: [{name: a, api_base: '127.0.0.1:8000/v1'}]\n",
                                "m.yaml: system 'a': api_base needs an http:// or https:// URL"),
    "judge server without a scheme": ("books: corpus\nsystems: [{name: a}]\njudge: {api_base: not-a-url}\n",
                                      "m.yaml: judge.api_base needs an http:// or https:// URL"),
    "unknown model": ("books: corpus\nlm: nosuchprovider/model\nsystems: [{name: a}]\n", "unknown model"),
}


def run_cli(args: list[str]) -> tuple[int, str]:
    from booklens.testing import run_command

    result = run_command(args)
    return result.returncode, result.stderr


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_manifest_is_one_line_with_nothing_written(case: str, corpus: Path):
    text, expected = BAD[case]
    write(corpus / "other" / "alpha.txt", "Another alpha.\n")
    write(corpus / "partial.json", json.dumps({"alpha": "A.", "beta": "B."}))
    manifest = write(corpus / "m.yaml", text)
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1"] if case != "unknown model" else
                        ["sweep", str(manifest), "-o", str(out)])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert not out.exists(), "a bad manifest wrote something"


def test_a_directory_that_is_not_a_sweep_is_refused(corpus: Path):
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    write(corpus / "busy" / "mine.txt", "keep me")
    code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "busy"), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1"])
    assert code != 0 and "is not a booklens sweep directory" in err
    assert sorted(p.name for p in (corpus / "busy").iterdir()) == ["mine.txt"]


def test_a_sweep_directory_that_cannot_be_created_is_one_line(corpus: Path):
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    blocker = write(corpus / "a-file", "not a directory")
    code, err = run_cli(["sweep", str(manifest), "-o", str(blocker / "sweep"), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1"])
    assert code == 2 and err.strip() == f"error: cannot create the sweep directory {blocker / 'sweep' / 'cells'}: " \
                                        "Not a directory"


def test_the_command_line_reports_a_bad_manifest_in_one_line(corpus: Path):
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, method: tree}]\n")
    proc = subprocess.run([sys.executable, "-m", "booklens", "sweep", str(manifest), "-o", str(corpus / "s")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: ")
    assert not (corpus / "s").exists()


def test_load_manifest_raises_booklens_errors(corpus: Path):
    with pytest.raises(BooklensError, match="manifest not found"):
        load_manifest(corpus / "nowhere.yaml")
    with pytest.raises(BooklensError, match="manifest is a directory, not a file"):
        load_manifest(corpus)
    latin1 = corpus.parent / "latin1.yaml"
    latin1.write_bytes("books: corpus  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(BooklensError, match="manifest is not UTF-8 text"):
        load_manifest(latin1)


@pytest.mark.parametrize("case", ["help", "bad manifest", "missing manifest"])
def test_sweep_help_and_manifest_errors_load_no_heavy_library(case: str, corpus: Path):
    from test_startup import PROBE  # the same probe as every other command

    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, method: tree}]\n")
    args = {"help": ["sweep", "--help"], "bad manifest": ["sweep", str(manifest), "-o", str(corpus / "s")],
            "missing manifest": ["sweep", str(corpus / "none.yaml"), "-o", str(corpus / "s")]}[case]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          cwd=corpus, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert (result["exit"] == 0) if case == "help" else (result["exit"] != 0 and proc.stderr.startswith("error: "))
