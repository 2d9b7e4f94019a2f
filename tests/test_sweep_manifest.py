"""Sweep manifests: books from files, folders and globs; every way a manifest can be wrong is one
line on stderr, a non-zero exit code, and nothing written (checked before any LM or model)."""

from __future__ import annotations

import json
import re
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
books: [corpus/*, more, corpus/alpha.txt]
systems:
  - {name: hier-512, method: hier, chunk_size: 512}
  - {name: released, summaries: released.json}
judge: {steps: [faithfulness], evidence: none, max_claims: 3}
""")
    sweep = load_manifest(manifest, api_base="http://x/v1")
    # `corpus/*` takes the books, as the folder would, and leaves notes.md beside them
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
    assert sweep.judge.model_dump(exclude_unset=True) == {"steps": ["faithfulness"], "evidence": "none",
                                                          "max_claims": 3}


BAD = {
    # the message names the missing key, not the whole manifest as a bad value of it
    "no books": ("systems: [{name: a}]\n", "m.yaml: missing key 'books'"),
    "missing book": ("books: [corpus/alpha.txt, corpus/nope.txt]\nsystems: [{name: a}]\n",
                     "book not found:"),
    "book without its suffix": ("books: [corpus/alpha]\nsystems: [{name: a}]\n",
                                "corpus/alpha (did you mean "),
    "glob matching nothing": ("books: ['corpus/*.epub']\nsystems: [{name: a}]\n", "matches no .txt or .epub file"),
    "unknown key": ("books: corpus\nsystems: [{name: a, chunk_sze: 512}]\n",
                    "system 'a': unknown key 'chunk_sze' (did you mean 'chunk_size'?)"),
    "words per token that is no number": ("books: corpus\nsystems: [{name: a, words_per_token: .nan}]\n",
                                          "system 'a': words_per_token: Input should be a finite number"),
    "unknown top-level key": ("books: corpus\nsystem: [{name: a}]\n", "unknown key 'system'"),
    "no judge step": ("books: corpus\nsystems: [{name: a}]\njudge: {steps: []}\n", "judge.steps is empty"),
    "settings of a step not taken": ("books: corpus\nsystems: [{name: a}]\njudge: {steps: [coherence], k: 9, "
                                     "max_claims: 3}\n",
                                     "judge.k, judge.max_claims would not apply: judge.steps has no faithfulness"),
    "duplicate system": ("books: corpus\nsystems: [{name: a}, {name: a, method: inc}]\n",
                         "two systems are named 'a'"),
    "summaries lacking a book": ("books: [corpus, more]\nsystems: [{name: r, summaries: partial.json}]\n",
                                 "partial.json has no summary for the book 'gamma'"),
    "unknown method": ("books: corpus\nsystems: [{name: a, method: tree}]\n",
                       "system 'a': method: \"tree\" is not one of 'hier' or 'inc'"),
    "malformed YAML": ("books: [corpus\nsystems: [{name: a}]\n", "is not valid YAML (line 2"),
    "bad type": ("books: corpus\nsystems: [{name: a, chunk_size: 2k}]\n", "chunk_size: Input should be a valid integer"),
    "given evidence": ("books: corpus\nsystems: [{name: a}]\njudge: {evidence: given}\n",
                       "m.yaml: judge.evidence: no evidence mode of a book run: use one of none, bm25, dense, "
                       "hybrid, book (got \"given\")"),
    # a judge setting is named by its path in the manifest, as every other judge error names it
    "k with no retrieval": ("books: corpus\nsystems: [{name: a}]\njudge: {evidence: none, k: 3}\n",
                            "m.yaml: judge.k is how many passages bm25/dense/hybrid retrieve; evidence none "
                            "retrieves none"),
    "a budget the mode does not take": ("books: corpus\nsystems: [{name: a}]\njudge: {evidence: bm25, "
                                        "budget_tokens: 500}\n",
                                        "m.yaml: judge.budget_tokens bounds the evidence of the book mode; "
                                        "evidence bm25 would not apply it"),
    "passages no mode cuts": ("books: corpus\nsystems: [{name: a}]\njudge: {evidence: none, passage_tokens: 64}\n",
                              "m.yaml: judge.passage_tokens sizes the passages cut from the book; evidence none"),
    "a summary without words": ("books: [corpus/alpha.txt]\nsystems: [{name: r, summaries: dots.json}]\n",
                                "dots.json: the summary for the book 'alpha' has no words"),
    "summarizer keys on a summaries system": ("books: corpus\nsystems: [{name: r, summaries: released.json, "
                                              "chunk_size: 512}]\n", "chunk_size would not apply"),
    "two books with one key": ("books: [corpus/alpha.txt, other/alpha.txt]\nsystems: [{name: a}]\n",
                               "two books have the key 'alpha'"),
    # cells/<system>/<book> directories: one directory on a case-insensitive file system
    "book keys differing in case": ("books: [corpus/alpha.txt, other/Alpha.txt]\nsystems: [{name: a}]\n",
                                    "have keys that differ only in case ('alpha' and 'Alpha')"),
    "system names differing in case": ("books: corpus\nsystems: [{name: hier}, {name: Hier}]\n",
                                       "the systems 'hier' and 'Hier' differ only in case"),
    "system name that is a path": ("books: corpus\nsystems: [{name: ../up}]\n", "name '../up' must start"),
    # 'é' is a letter: a rule said as "letters" read as if it were allowed.
    "system name with an accent": ("books: corpus\nsystems: [{name: r\u00e9sum\u00e9}]\n",
                                   "name 'r\u00e9sum\u00e9' must start with an ASCII letter or digit and hold only "
                                   "ASCII letters, digits and . _ - + ="),
    "no systems": ("books: corpus\nsystems: []\n", "systems: List should have at least 1 item"),
    "not a mapping": ("- corpus\n", "a manifest is a YAML mapping"),
    "missing systems": ("books: corpus\n", "missing key 'systems'"),
    "context too small for the chunks": ("books: corpus\nsystems: [{name: a, chunk_size: 4096, context_window: 2048}]\n",
                                         "m.yaml: system 'a': a chunk of 4096 tokens does not fit the 2048-token "
                                         "context window with a 900-token summary and the prompt; set "
                                         "max_summary_tokens to 499 or less and chunk_size to 1021 or less, or "
                                         "raise context_window"),
    "merge context with incremental updating": (
        "books: corpus\nsystems: [{name: a, method: inc, merge_context: none}]\n",
        "m.yaml: system 'a': merge_context is for method hier; method inc makes no merges"),
    # the summarizer's words for the command line (`every --level-budget`) in the manifest's
    "level budgets too large to merge": (
        "books: corpus\nsystems: [{name: a, chunk_size: 512, level_budgets: [300, 3000]}]\n",
        "m.yaml: system 'a': the 8192-token context window cannot merge two 3000-token summaries; set each of "
        "level_budgets to 2240 or less, or raise context_window"),
    "level budgets with incremental updating": (
        "books: corpus\nsystems: [{name: a, method: inc, level_budgets: [200]}]\n",
        "m.yaml: system 'a': level_budgets is for method hier; method inc keeps one summary within "
        "max_summary_tokens"),
    "chunks below the summarizer's least": (
        "books: corpus\nsystems: [{name: a, chunk_size: 32}]\n",
        "m.yaml: system 'a': chunk_size: Input should be greater than or equal to 64 (got 32)"),
    "server without a scheme": ("books: corpus\nsystems: [{name: a, api_base: '127.0.0.1:8000/v1'}]\n",
                                "m.yaml: system 'a': api_base needs an http:// or https:// URL"),
    "judge server without a scheme": ("books: corpus\nsystems: [{name: a}]\njudge: {api_base: not-a-url}\n",
                                      "m.yaml: judge.api_base needs an http:// or https:// URL"),
    "unknown model": ("books: corpus\nlm: nosuchprovider/model\nsystems: [{name: a}]\n", "unknown model"),
    # YAML would keep the last of two keys: the first `systems:` block, or the first value, would be lost unseen.
    "two systems blocks": ("books: corpus\nsystems: [{name: a}]\njudge: {max_claims: 2}\nsystems: [{name: b}]\n",
                           "(line 4, column 1: duplicate key 'systems', first given on line 2"),
    "a key twice in a system": ("books: corpus\nsystems:\n  - name: a\n    chunk_size: 512\n    chunk_size: 1024\n",
                                "(line 5, column 5: duplicate key 'chunk_size', first given on line 4"),
    "a key twice in a flow mapping": ("books: corpus\nsystems: [{name: a}]\njudge: {k: 3, steps: [coherence], k: 5}\n",
                                      "(line 3, column 35: duplicate key 'k', first given on line 3"),
    # A book's key names its cell directory cells/<system>/<key>: '.' and '..' would not be its own.
    "book key '..'": ("books: [dots/...txt]\nsystems: [{name: a}]\n",
                      "has the key '..', which cannot name a cell directory"),
    # hidden files are not taken from a folder, as a glob of it takes none
    "a folder of hidden books": ("books: dots\nsystems: [{name: a}]\n",
                                 "holds no .txt or .epub file but hidden ones (...txt), which are books only when "
                                 "named"),
    "book key '.'": ("books: [dot/..txt]\nsystems: [{name: a}]\n", "has the key '.', which cannot name a cell"),
    "zero_shot beside a program for every judge": (
        "books: corpus\nsystems: [{name: a}]\njudge: {steps: [coherence], zero_shot: true, programs: {coherence: "
        + str(Path(__file__).resolve().parents[1] / "booklens" / "defaults" / "coherence.json") + "}}\n",
        "m.yaml: give either judge.programs or judge.zero_shot, not both"),
    "an alias inside itself": ("books: &a [*a]\nsystems: [{name: a}]\n",
                               "m.yaml: a YAML alias refers to the list or mapping that holds it"),
    "a system inside its own setting": ("books: corpus\nsystems: &s [{name: a, chunk_size: *s}]\n",
                                        "m.yaml: a YAML alias refers to the list or mapping that holds it"),
}


def test_aliases_that_would_expand_to_an_astronomical_list_are_one_line_at_once(corpus: Path):
    """60 lists, each holding the one before twice, are 2**60 items once expanded: the check that no
    alias holds itself walked every one of them (seconds at 2**22, years here)."""
    import subprocess
    import sys

    levels = ["l0: &l0 [alpha.txt, beta.txt]"] + [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, 60)]
    manifest = write(corpus / "m.yaml", "\n".join(levels) + "\nbooks: *l59\nsystems: [{name: a}]\n")
    try:
        proc = subprocess.run([sys.executable, "-m", "booklens", "sweep", str(manifest), "-o", str(corpus / "sweep"),
                               "--dry-run"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the manifest was still being read after 120 s")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {manifest}: "), proc.stderr
    assert not (corpus / "sweep").exists()


def run_cli(args: list[str]) -> tuple[int, str]:
    from booklens.testing import run_command

    result = run_command(args)
    return result.returncode, result.stderr


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_manifest_is_one_line_with_nothing_written(case: str, corpus: Path):
    text, expected = BAD[case]
    write(corpus / "other" / "alpha.txt", "Another alpha.\n")
    write(corpus / "other" / "Alpha.txt", "A capital alpha.\n")
    write(corpus / "partial.json", json.dumps({"alpha": "A.", "beta": "B."}))
    write(corpus / "dots.json", json.dumps({"alpha": "..."}))
    write(corpus / "dots" / "...txt", "A book named '...txt'.\n")
    write(corpus / "dot" / "..txt", "A book named '..txt'.\n")
    manifest = write(corpus / "m.yaml", text)
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1"] if case != "unknown model" else
                        ["sweep", str(manifest), "-o", str(out)])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert not out.exists(), "a bad manifest wrote something"


def test_a_key_overriding_a_merged_one_is_no_duplicate(corpus: Path):
    """`<<: *anchor` copies keys that the mapping may then change: that is no key given twice."""
    manifest = write(corpus / "m.yaml", """
books: corpus
systems:
  - &hier {name: hier-512, method: hier, chunk_size: 512}
  - {<<: *hier, name: hier-1024, chunk_size: 1024}
""")
    sweep = load_manifest(manifest, lm="openai/x", api_base="http://x/v1")
    assert [(s.name, s.chunk_size) for s in sweep.systems] == [("hier-512", 512), ("hier-1024", 1024)]
    write(manifest, manifest.read_text() + "  - {<<: *hier, name: again, name: twice}\n")
    with pytest.raises(BooklensError, match="line 6, column 30: duplicate key 'name', first given on line 6"):
        load_manifest(manifest, lm="openai/x", api_base="http://x/v1")


def test_book_paths_with_glob_characters(tmp_path: Path):
    """A file whose name holds [ ] is that file, not a pattern; a manifest in a folder named with
    [ ] globs its entries under that folder as it is named."""
    for name in ("Story [vol 1].txt", "Story v.txt", "a[12].txt", "a1.txt"):
        write(tmp_path / name, f"{name}.\n")
    manifest = write(tmp_path / "m.yaml", 'books: ["Story [vol 1].txt", "a[12].txt"]\nsystems: [{name: a}]\n')
    sweep = load_manifest(manifest, lm="openai/x", api_base="http://x/v1")
    assert [(b.key, b.path) for b in sweep.books] == [("Story [vol 1]", tmp_path / "Story [vol 1].txt"),
                                                     ("a[12]", tmp_path / "a[12].txt")]
    # an entry that names no file is still a pattern
    write(manifest, 'books: ["a[1].txt"]\nsystems: [{name: a}]\n')
    assert [b.key for b in load_manifest(manifest, lm="openai/x", api_base="http://x/v1").books] == ["a1"]

    draft = tmp_path / "[draft]"
    write(draft / "one.txt", "One.\n")
    write(draft / "two.txt", "Two.\n")
    write(tmp_path / "d" / "decoy.txt", "[draft] as a class would match the folder d.\n")
    manifest = write(draft / "sweep.yaml", 'books: ["*.txt"]\nsystems: [{name: a}]\n')
    sweep = load_manifest(manifest, lm="openai/x", api_base="http://x/v1")
    assert [(b.key, b.path) for b in sweep.books] == [("one", draft / "one.txt"), ("two", draft / "two.txt")]


def test_a_folder_takes_the_books_a_glob_of_it_takes_and_no_hidden_file(corpus: Path):
    """A folder copied from a Mac holds `._alpha.txt` (its metadata, not text), and a tool may leave a
    hidden `.draft.txt`: `books: corpus` took them as books (the first failing its cells, the draft
    counted in every mean) where `corpus/*.txt` skips them, as a shell does. A hidden file is a book
    only when named."""
    (corpus / "corpus" / "._alpha.txt").write_bytes(b"\x00\x05\x16\x07Mac OS X metadata")
    write(corpus / "corpus" / ".draft.txt", "An unfinished note.\n")
    keys = {}
    for entry in ("corpus", "'corpus/*.txt'", "'corpus/**/*.txt'"):
        manifest = write(corpus / "m.yaml", f"books: {entry}\nsystems: [{{name: a}}]\n")
        keys[entry] = [b.key for b in load_manifest(manifest, lm="openai/x", api_base="http://x/v1").books]
    assert keys == {entry: ["alpha", "beta"] for entry in keys}
    manifest = write(corpus / "m.yaml", "books: [corpus, corpus/.draft.txt]\nsystems: [{name: a}]\n")
    assert [b.key for b in load_manifest(manifest, lm="openai/x", api_base="http://x/v1").books] == [
        "alpha", "beta", ".draft"]


def test_a_bad_cache_dir_is_one_line_with_nothing_written(corpus: Path):
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    blocker = write(corpus / "a-file", "not a directory")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", "--cache-dir", str(blocker)])
    assert code == 2 and err.strip() == f"error: cannot use {blocker} as the LM cache directory: File exists", err
    assert not out.exists(), "the sweep directory was written before the cache was checked"


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
    assert code == 2 and err.strip() == f"error: cannot create the sweep directory {blocker / 'sweep'}: " \
                                        "Not a directory"


def test_a_dry_run_refuses_a_sweep_directory_the_run_could_not_create(corpus: Path):
    """The plan said nothing (exit 0) of an -o under a file, which the run then refused."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    blocker = write(corpus / "a-file", "not a directory")
    code, err = run_cli(["sweep", str(manifest), "-o", str(blocker / "deeper" / "sweep"), "--lm", "openai/x",
                         "--api-base", "http://127.0.0.1:9/v1", "--dry-run"])
    assert code == 2 and err.strip() == f"error: cannot create the sweep directory {blocker / 'deeper' / 'sweep'}: " \
                                        "Not a directory", err


def test_a_server_url_no_lm_of_the_sweep_uses_is_refused(corpus: Path):
    """--api-base with every LM the embedded model would be ignored; beside a server's LM it is used."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}, {name: b, lm: local}]\n")
    out = corpus / "sweep"
    for args in (["--lm", "local"], []):
        code, err = run_cli(["sweep", str(manifest), "-o", str(out), *args, "--api-base", "http://127.0.0.1:9/v1",
                             "--dry-run"])
        assert code == 2 and err.strip().startswith("error: --api-base http://127.0.0.1:9/v1 names a server, but the "
                                                    "LM is the embedded model"), err
    assert not out.exists()
    mixed = write(corpus / "mixed.yaml", "books: corpus\nsystems: [{name: a, lm: openai/x}, {name: b, lm: local}]\n")
    code, err = run_cli(["sweep", str(mixed), "-o", str(out), "--api-base", "http://127.0.0.1:9/v1", "--dry-run"])
    assert code == 0, err
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "local", "--rpm", "3"])
    assert code == 2 and err.strip().startswith("error: --rpm is for models behind a server or provider"), err
    assert not out.exists()  # (a dry run refuses --rpm whatever the LMs: it sends no request)


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


@pytest.mark.parametrize("case", ["help", "bad manifest", "missing manifest", "dry run with a run option"])
def test_sweep_help_and_manifest_errors_load_no_heavy_library(case: str, corpus: Path):
    from test_startup import PROBE  # the same probe as every other command

    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, method: tree}]\n")
    args = {"help": ["sweep", "--help"], "bad manifest": ["sweep", str(manifest), "-o", str(corpus / "s")],
            "missing manifest": ["sweep", str(corpus / "none.yaml"), "-o", str(corpus / "s")],
            "dry run with a run option": ["sweep", str(manifest), "-o", str(corpus / "s"), "--dry-run",
                                          "--concurrency", "8"]}[case]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                          cwd=corpus, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert (result["exit"] == 0) if case == "help" else (result["exit"] != 0 and proc.stderr.startswith("error: "))


def test_one_book_under_two_keys_is_refused(corpus: Path):
    """A link or a copy of a book under another name would count it twice in every mean over books."""
    (corpus / "linked").mkdir()
    (corpus / "linked" / "alpha-again.txt").symlink_to(corpus / "corpus" / "alpha.txt")
    write(corpus / "copied" / "alpha copy.txt", (corpus / "corpus" / "alpha.txt").read_text())
    write(corpus / "copied" / "delta.txt", "Delta sails the same number of bytes.\n"[-33:])  # as long, not the same
    assert (corpus / "copied" / "delta.txt").stat().st_size == (corpus / "corpus" / "alpha.txt").stat().st_size
    for entry, how in (("linked", "the same file"), ("copied", "the same text")):
        manifest = write(corpus / "m.yaml", f"books: [corpus/alpha.txt, {entry}]\nsystems: [{{name: a}}]\n")
        code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "sweep"), "--lm", "openai/x",
                             "--api-base", "http://127.0.0.1:9/v1"])
        assert code == 2 and err.count("\n") == 1 and f"are {how} under two keys ('alpha' and 'alpha" in err, err
        assert not (corpus / "sweep").exists()
    # the same file named twice under one key is listed once, as before
    manifest = write(corpus / "m.yaml", "books: [corpus/alpha.txt, corpus/*.txt]\nsystems: [{name: a}]\n")
    assert [b.key for b in load_manifest(manifest, lm="openai/x", api_base="http://x/v1").books] == ["alpha", "beta"]


def test_one_text_in_two_files_of_other_bytes_is_refused(corpus: Path):
    """The same book as a copy saved with other line endings and blank edges, or as .txt and .epub,
    is one text as a run reads it (and digests it): it would count twice in every mean and interval.
    Refused in one line naming both files, by the sweep and its dry run alike."""
    from ebooklib import epub

    alpha = (corpus / "corpus" / "alpha.txt").read_text()
    (corpus / "crlf").mkdir()
    (corpus / "crlf" / "alpha-dos.txt").write_bytes(("\r\n\r\n" + alpha.replace("\n", "\r\n") + "\r\n").encode())
    book = epub.EpubBook()
    book.set_identifier("alpha")
    book.set_title("Alpha")
    book.set_language("en")
    chapter = epub.EpubHtml(title="One", file_name="one.xhtml", lang="en")
    chapter.content = f"<html><body><p>{alpha.strip()}</p></body></html>"
    book.add_item(chapter)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = [chapter]
    (corpus / "ebooks").mkdir()
    epub.write_epub(str(corpus / "ebooks" / "alpha-ebook.epub"), book)
    for entry, twin in (("crlf", corpus / "crlf" / "alpha-dos.txt"),
                        ("ebooks", corpus / "ebooks" / "alpha-ebook.epub")):
        manifest = write(corpus / "m.yaml", f"books: [corpus, {entry}]\nsystems: [{{name: a}}]\n")
        for dry in ([], ["--dry-run"]):
            code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "sweep"), "--lm", "openai/x",
                                 "--api-base", "http://127.0.0.1:9/v1", *dry])
            assert code == 2 and err.count("\n") == 1, err
            assert f"{corpus / 'corpus' / 'alpha.txt'} and {twin} are the same text under two keys" in err, err
            assert not (corpus / "sweep").exists()
    # a book that shares only its start with another is its own
    write(corpus / "longer" / "alpha-longer.txt", alpha + "And he sailed again.\n")
    manifest = write(corpus / "m.yaml", "books: [corpus, longer]\nsystems: [{name: a}]\n")
    assert [b.key for b in load_manifest(manifest, lm="openai/x", api_base="http://x/v1").books] == \
        ["alpha", "beta", "alpha-longer"]


def test_an_empty_lm_is_refused_as_an_empty_lm_option_is(corpus: Path):
    for section, where in (("lm: ''\n", "lm"), ("judge: {lm: ' '}\n", "judge.lm")):
        manifest = write(corpus / "m.yaml", f"{section}books: corpus\nsystems: [{{name: a}}]\n")
        with pytest.raises(BooklensError) as caught:
            load_manifest(manifest, lm="openai/x", api_base="http://127.0.0.1:9/v1")
        assert str(caught.value) == (f"{manifest}: {where} is empty: name a model ('local', 'openai/gpt-4o-mini', "
                                     "...) or leave it out")
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, lm: ''}]\n")
    code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "sweep"), "--dry-run"])
    assert code == 2 and err == f"error: {manifest}: system 'a': lm is empty: name a model ('local', " \
        "'openai/gpt-4o-mini', ...) or leave it out\n"


def test_sweep_json_records_servers_without_their_credentials(corpus: Path, tmp_path: Path):
    import json

    from booklens.sweep.run import write_plan

    manifest = write(corpus / "m.yaml", """
lm: openai/some-model
books: corpus
systems:
  - {name: a, api_base: "http://keeper:s3cret@127.0.0.1:9/v1?token=abc"}
judge: {api_base: "https://judge:hunter22@example.invalid/v1"}
""")
    write_plan(load_manifest(manifest), tmp_path)
    text = (tmp_path / "sweep.json").read_text()
    assert "s3cret" not in text and "hunter22" not in text and "token=abc" not in text
    plan = json.loads(text)
    assert plan["systems"][0]["api_base"] == "http://127.0.0.1:9/v1"
    assert plan["judge"]["api_base"] == "https://example.invalid/v1"


def test_an_empty_api_base_is_no_api_base(corpus: Path):
    """`api_base: ""` is what `--api-base ""` is on the command line: not given. A step takes the
    sweep's server then, and the LMs checked before the sweep (key, model) are those its cells call
    (the empty one was checked against the sweep's server, yet its cells went without one)."""
    from booklens.lm import LMPool
    from booklens.sweep.run import sweep_lms

    manifest = write(corpus / "m.yaml", """
lm: openai/some-model
api_base: http://127.0.0.1:9/v1
books: corpus
systems:
  - {name: a}
  - {name: b, api_base: ""}
  - {name: c, api_base: "  ", lm: openai/other}
judge: {api_base: ""}
""")
    sweep = load_manifest(manifest)
    plain = load_manifest(write(corpus / "plain.yaml", """
lm: openai/some-model
api_base: http://127.0.0.1:9/v1
books: corpus
systems: [{name: a}, {name: b}, {name: c, lm: openai/other}]
"""))
    assert [s.model_dump(exclude_unset=True) for s in sweep.systems] == \
        [s.model_dump(exclude_unset=True) for s in plain.systems]
    assert sweep.judge.model_dump(exclude_unset=True) == plain.judge.model_dump(exclude_unset=True) == {}
    pool = LMPool(sweep.lm, sweep.api_base, use_cache=False)
    called = {pool.resolve(sweep.judge_config().lm, sweep.judge_config().api_base)}
    called |= {pool.resolve(c.lm, c.api_base) for c in (sweep.system_config(s.name, "alpha") for s in sweep.systems)}
    assert called == sweep_lms(sweep) == {("openai/some-model", "http://127.0.0.1:9/v1"),
                                          ("openai/other", "http://127.0.0.1:9/v1")}
    # and an empty --api-base leaves the manifest's server in place, as it leaves BOOKLENS_API_BASE
    for empty in ("", "  "):
        assert load_manifest(manifest, api_base=empty).api_base == "http://127.0.0.1:9/v1"


EMBEDDED_SERVER = ("api_base http://127.0.0.1:9/v1 names a server, but the LM is the embedded model (local), which "
                   "runs in this process: to use the server, name its model (e.g. lm: openai/MODEL)")


@pytest.mark.parametrize("case", ["system", "system on the default LM", "judge", "top level"])
def test_a_server_beside_the_embedded_model_in_a_manifest_is_refused(case: str, corpus: Path):
    """A step whose LM is the embedded model ignores its api_base (it was recorded, never used): refused
    as --api-base is beside --lm local, by the same rule, in the manifest's own words."""
    text, where, args = {
        "system": ("systems: [{name: a}, {name: b, lm: local, api_base: 'http://127.0.0.1:9/v1'}]\n",
                   "system 'b': ", ["--lm", "openai/x"]),
        # the sweep's LM is the embedded model (--lm local overrides the manifest's): so is b's
        "system on the default LM": ("lm: openai/x\nsystems: [{name: a, lm: openai/x}, "
                                     "{name: b, api_base: 'http://127.0.0.1:9/v1'}]\njudge: {lm: openai/x}\n",
                                     "system 'b': ", ["--lm", "local"]),
        "judge": ("systems: [{name: a}]\njudge: {lm: local, api_base: 'http://127.0.0.1:9/v1'}\n", "judge.",
                  ["--lm", "openai/x"]),
        # every step runs on the embedded model: no step takes the sweep's server
        "top level": ("lm: local\napi_base: http://127.0.0.1:9/v1\nsystems: [{name: a}, {name: b, lm: local}]\n",
                      "", []),
    }[case]
    manifest = write(corpus / "m.yaml", "books: corpus\n" + text)
    out = corpus / "sweep"
    for dry in ([], ["--dry-run"]):
        code, err = run_cli(["sweep", str(manifest), "-o", str(out), *args, *dry])
        assert (code, err) == (2, f"error: {manifest}: {where}{EMBEDDED_SERVER}\n")
    assert not out.exists()


def test_a_server_a_step_on_another_lm_takes_is_kept(corpus: Path, monkeypatch):
    monkeypatch.delenv("BOOKLENS_LM", raising=False)
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    # the sweep's server serves system a; b runs on the embedded model
    manifest = write(corpus / "m.yaml", "lm: local\napi_base: http://127.0.0.1:9/v1\nbooks: corpus\n"
                                        "systems: [{name: a, lm: openai/x}, {name: b}]\n")
    assert load_manifest(manifest).api_base == "http://127.0.0.1:9/v1"
    # a step on the embedded model by default (no lm anywhere) with a server of its own is refused ...
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, api_base: 'http://127.0.0.1:9/v1'}]\n")
    with pytest.raises(BooklensError) as refused:
        load_manifest(manifest)
    assert str(refused.value) == f"{manifest}: system 'a': {EMBEDDED_SERVER}"
    # ... and kept when BOOKLENS_LM names a server's model, as --api-base is beside it
    monkeypatch.setenv("BOOKLENS_LM", "openai/x")
    assert load_manifest(manifest).systems[0].api_base == "http://127.0.0.1:9/v1"


def test_an_api_base_option_no_step_takes_is_named_without_its_password(corpus: Path):
    """The line refusing an --api-base that no step takes quoted the URL as given, password included."""
    servers = write(corpus / "servers.yaml", "books: corpus\nsystems: [{name: a, lm: openai/x, api_base: "
                                             "'http://127.0.0.1:9/v1'}]\njudge: {lm: openai/y, api_base: "
                                             "'http://127.0.0.1:8/v1'}\n")
    code, err = run_cli(["sweep", str(servers), "-o", str(corpus / "sweep"), "--api-base",
                         "http://bob:s3cretpw@gpu-host:8000/v1", "--dry-run"])
    assert (code, err) == (2, f"error: --api-base http://gpu-host:8000/v1 would not apply: in {servers} the judge "
                              "and every system that summarizes name their own api_base or run on the embedded "
                              "model\n")


def test_lm_and_api_base_options_no_step_takes_are_refused(corpus: Path):
    """--lm is the LM of the steps that name none; when the judge and every summarizing system name
    their own, it would be recorded in sweep.json and change nothing: one line, as other options that
    would be ignored are. The same for --api-base when every step on a server's LM names its own."""
    own = write(corpus / "own.yaml", "books: corpus\nsystems: [{name: a, lm: openai/x}, "
                                     "{name: r, summaries: released.json}]\njudge: {lm: openai/y}\n")
    out = corpus / "sweep"
    for dry in ([], ["--dry-run"]):
        code, err = run_cli(["sweep", str(own), "-o", str(out), "--lm", "openai/z", *dry])
        assert (code, err) == (2, f"error: --lm openai/z would not apply: in {own} the judge and every system that "
                                  "summarizes name their own lm\n")
    servers = write(corpus / "servers.yaml", "books: corpus\nsystems: [{name: a, lm: openai/x, api_base: "
                                             "'http://127.0.0.1:9/v1'}, {name: b, lm: local}]\n"
                                             "judge: {lm: openai/y, api_base: 'http://127.0.0.1:8/v1'}\n")
    for dry in ([], ["--dry-run"]):
        code, err = run_cli(["sweep", str(servers), "-o", str(out), "--api-base", "http://127.0.0.1:7/v1", *dry])
        assert (code, err) == (2, f"error: --api-base http://127.0.0.1:7/v1 would not apply: in {servers} the judge "
                                  "and every system that summarizes name their own api_base or run on the embedded "
                                  "model\n")
    assert not out.exists()
    # a step that names no lm (or no api_base) takes the option
    for text in ("systems: [{name: a, lm: openai/x}, {name: b}]\njudge: {lm: openai/y}\n",
                 "systems: [{name: a, lm: openai/x}]\njudge: {}\n"):
        manifest = write(corpus / "takes.yaml", "books: corpus\n" + text)
        code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/z", "--api-base",
                             "http://127.0.0.1:7/v1", "--dry-run"])
        assert code == 0, err
    assert not out.exists()


def test_a_dry_run_refuses_a_model_name_the_run_would_refuse_but_needs_no_key(corpus: Path, monkeypatch):
    """The dry run priced an unknown model as 'unknown' and exited 0; the run then refused it at once.
    It names no key, though: a plan is made before the keys are set."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "bogus", "--api-base",
                         "http://127.0.0.1:9/v1", "--dry-run"])
    assert code == 2 and err.startswith("error: unknown model 'bogus'") and err.count("\n") == 1, err
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "anthropic/claude-3-5-haiku-20241022",
                         "--dry-run"])
    assert code == 0, err
    assert not out.exists()


@pytest.mark.parametrize("variable, value, said", [
    ("BOOKLENS_RPM", "abc", "BOOKLENS_RPM must be a whole number, not 'abc'"),
    ("BOOKLENS_TPM", "0", "BOOKLENS_TPM must be at least 1 (got 0)"),
    ("BOOKLENS_STRUCTURED", "bogus", "unknown structured-output mode 'bogus': use one of auto, schema, json, off"),
    ("BOOKLENS_API_BASE", "127.0.0.1:8000/v1", "BOOKLENS_API_BASE needs an http:// or https:// URL such as "
                                               "http://127.0.0.1:8000/v1 (got '127.0.0.1:8000/v1')"),
])
@pytest.mark.parametrize("lm", ["local", "openai/x"])
def test_a_dry_run_refuses_the_settings_from_the_environment_the_run_would_refuse(corpus: Path, monkeypatch, lm,
                                                                                   variable, value, said):
    """The run parses these settings where it makes each LM, the embedded model's too, and refuses them
    before any call; the dry run skipped making the embedded model (it needs no weights) and so said
    nothing about them, planning a sweep that could not start. It needs no key or server either way."""
    from booklens.lm import make_backend

    manifest = write(corpus / "m.yaml", f"lm: {lm}\nbooks: corpus\nsystems: [{{name: a}}]\n")
    out = corpus / "sweep"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(BooklensError) as caught:
        make_backend(lm)  # what the run says
    assert str(caught.value) == said
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--dry-run"])
    assert (code, err) == (2, f"error: {said}\n")
    assert not out.exists()


@pytest.mark.parametrize("engine, address", [("local", ""), ("local", " "), ("ray", " ")])
def test_an_empty_ray_address_is_refused_before_anything_is_written(corpus: Path, engine: str, address: str):
    """`--ray-address "$HEAD"` with HEAD unset: with the local engine it was taken for no address (the
    sweep ran, on no cluster), with Ray the blank address failed only after Ray's start-up."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", "--cache-dir", str(corpus / "cache"), "--engine", engine,
                         "--ray-address", address])
    assert code == 2 and err.startswith("error: --ray-address is empty") and err.count("\n") == 1, err
    assert not out.exists() and not (corpus / "cache").exists()


def test_a_ray_address_with_spaces_around_it_is_the_address(corpus: Path, monkeypatch):
    """`--ray-address " auto"` (from a shell variable, say) went to Ray as it was, which refused it
    as an invalid address; spaces around it are dropped, as around --api-base and --lm."""
    import booklens.sweep.run as run

    given = []

    class Engine:  # stands in for Ray: what matters is the address it is asked to join
        def __init__(self, settings, *, address=None, num_cpus=None, log_path=None):
            given.append(address)
            self.log_path = log_path  # the sweep's temporary log, which it removes once refused

        def start(self):
            raise BooklensError("no Ray in this test")

        def close(self):
            pass

    monkeypatch.setattr(run, "RayEngine", Engine)
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "sweep"), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", "--cache-dir", str(corpus / "cache"), "--engine", "ray",
                         "--ray-address", " auto\t"])
    assert (code, err) == (2, "error: no Ray in this test\n")
    assert given == ["auto"]


def test_a_ray_sweep_refused_by_the_lock_leaves_the_running_sweeps_log_alone(corpus: Path, monkeypatch):
    """A second Ray sweep into a directory another sweep holds moved its start-up messages into that
    directory's ray.log (and went on writing Ray's messages there while it stopped) before finding the
    lock taken: the running sweep's log took the refused one's lines."""
    import booklens.sweep.run as run
    from booklens.records import directory_lock
    from booklens.sweep.engines import RayEngine

    logs = []

    class Engine(RayEngine):  # Ray's start and stop stand in; its log is moved as a real one's is
        def start(self):
            logs.append(self.log_path)
            self.log_path.write_text("the refused sweep's Ray\n")

        def close(self):
            pass

    monkeypatch.setattr(run, "RayEngine", Engine)
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    write(out / "sweep.json", "{}")
    write(out / "ray.log", "the running sweep's Ray\n")
    with directory_lock(out, "held"), pytest.raises(BooklensError, match="another booklens sweep"):
        run.run_sweep(manifest, out, engine="ray", lm="openai/x", api_base="http://127.0.0.1:9/v1",
                      cache_dir=corpus / "cache")
    assert (out / "ray.log").read_text() == "the running sweep's Ray\n"
    assert sorted(p.name for p in out.iterdir()) == ["ray.log", "sweep.json"]
    assert len(logs) == 1 and not logs[0].exists()  # the temporary log is removed


@pytest.mark.parametrize("address", ["http://127.0.0.1:8265", " HTTPS://head.example:8265/ "])
def test_a_dashboards_http_address_is_refused_before_ray_starts(corpus: Path, address: str):
    """`ray job submit --address` takes the dashboard's http:// URL; given to --ray-address, Ray's own
    message was cut to its first line ('... To fix this, either:') after Ray was imported."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", "--cache-dir", str(corpus / "cache"), "--engine", "ray",
                         "--ray-address", address])
    assert code == 2 and err.count("\n") == 1, err
    assert err == (f"error: --ray-address {address.strip()} is an http:// URL, a Ray dashboard's (what `ray job "
                   "submit --address` takes): name the cluster itself (auto, HEAD:6379 or ray://HEAD:10001)\n")
    assert not out.exists() and not (corpus / "cache").exists()


@pytest.mark.parametrize("options, named", [
    (["--concurrency", "8"], "--concurrency"),
    (["--engine", "ray"], "--engine"),
    (["--ray-address", "auto"], "--ray-address"),
    (["--cache-dir", "cache"], "--cache-dir"),
    (["--fail-fast"], "--fail-fast"),
    (["--rpm", "60"], "--rpm"),
    (["--tpm", "1000"], "--tpm"),
    (["--fail-fast", "--concurrency", "2", "--rpm", "60"], "--rpm, --concurrency, --fail-fast"),
])
def test_a_dry_run_refuses_options_only_a_run_uses(options: list[str], named: str, corpus: Path):
    """The dry run reads the manifest, the books and -o, prices the LMs --lm names and checks the server
    --api-base names as the run would; it runs no cell, calls no LM and opens no cache: the options of
    running are refused, not ignored."""
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", *options, "--dry-run"])
    assert (code, err) == (2, f"error: --dry-run runs no cell and calls no LM: {named} would not apply\n")
    assert not out.exists() and not (corpus / "cache").exists()
    code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1", "--engine", "local", "--concurrency", "4", "--dry-run"])
    assert code == 0, err  # the defaults given are no change


def test_run_sweep_refuses_concurrency_below_one_with_nothing_written(corpus: Path):
    """A library caller skips `--concurrency`'s bound: the sweep refuses it before any cell, as the
    command does, instead of writing a sweep whose every cell fails (or runs one call at a time)."""
    from booklens.sweep.run import run_sweep

    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    with pytest.raises(BooklensError, match="concurrency must be at least 1"):
        run_sweep(manifest, out, lm="openai/x", api_base="http://127.0.0.1:9/v1", concurrency=0,
                  cache_dir=corpus / "cache")
    assert not out.exists()


def test_a_book_file_name_that_is_not_utf8_is_one_line_with_nothing_written(corpus: Path):
    """A file named in another encoding (a Latin-1 'café.txt' from an old archive) has a key Python can
    hold but not write as UTF-8: the sweep stopped with an internal error while writing sweep.json,
    and left a directory without it that every rerun refused as not a sweep's."""
    import os

    folder = corpus / "latin"
    folder.mkdir()
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.txt"), "w", encoding="utf-8") as handle:
        handle.write("A book whose file name is Latin-1.\n")
    manifest = write(corpus / "m.yaml", "books: [latin]\nsystems: [{name: a}]\n")
    out = corpus / "sweep"
    for extra in ([], ["--dry-run"]):
        code, err = run_cli(["sweep", str(manifest), "-o", str(out), "--lm", "openai/x", "--api-base",
                             "http://127.0.0.1:9/v1", *extra])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "not valid UTF-8" in lines[0] and "caf" in lines[0], err
        assert not out.exists()


def test_book_keys_that_differ_only_in_unicode_normalization_are_refused(corpus: Path):
    """'Émile' written with one code point for É or with E and a combining accent: two keys here,
    one cell directory on macOS (whose file system compares names after normalizing them), as keys
    that differ only in case are; and summaries keyed by one of the spellings miss the other."""
    import unicodedata

    composed, decomposed = unicodedata.normalize("NFC", "Émile"), unicodedata.normalize("NFD", "Émile")
    assert composed != decomposed
    write(corpus / "one" / f"{composed}.txt", "Emile goes to school.\n")
    write(corpus / "two" / f"{decomposed}.txt", "Emile leaves school.\n")
    manifest = write(corpus / "m.yaml", "books: [one, two]\nsystems: [{name: a}]\n")
    code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "sweep"), "--lm", "openai/x", "--api-base",
                         "http://127.0.0.1:9/v1"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "differ only in case or in how their accents are encoded" in lines[0], err
    assert not (corpus / "sweep").exists()


def test_judge_evidence_that_cannot_fit_the_window_is_refused_before_any_cell(corpus: Path):
    from booklens.sweep.run import check_judge_evidence

    # 10 passages of up to 1,024 tokens cannot sit in one prompt of the embedded model's 8,192-token window
    too_much = "books: corpus\nsystems: [{name: a}]\njudge: {k: 10, passage_tokens: 1024}\n"
    short = load_manifest(write(corpus / "short.yaml", too_much))
    check_judge_evidence(short)  # every book is shorter than that: all of it is what any k shows
    write(corpus / "corpus" / "long.txt", "The long voyage went on. " * 2000)
    # the values named fit beside no demo: a cell shows the judge those of its demos that fit beside them
    with pytest.raises(BooklensError, match=r"long.yaml: judge.k 10 passages of up to judge.passage_tokens 1024 "
                       r"tokens: 10240 tokens .* lower judge.k to 5 or less or judge.passage_tokens to 562 or less "
                       r"\(the book 'long' and any as long\)"):
        check_judge_evidence(load_manifest(write(corpus / "long.yaml", too_much)))
    check_judge_evidence(load_manifest(write(corpus / "fits.yaml", too_much.replace("k: 10", "k: 5"))))
    no_search = too_much.replace("k: 10,", "evidence: none, k: 10,")
    check_judge_evidence(load_manifest(write(corpus / "none.yaml", no_search)))
    # the `book` mode's budget, likewise
    budget = "books: corpus\nsystems: [{name: a}]\njudge: {evidence: book, budget_tokens: 9000}\n"
    with pytest.raises(BooklensError, match=r"book.yaml: judge.budget_tokens 9000: 9000 tokens of evidence per "
                       r"claim.*lower judge.budget_tokens to 5664 or less, or leave it out .*\(the book 'long' and any as "
                       r"long\)"):
        check_judge_evidence(load_manifest(write(corpus / "book.yaml", budget)))
    check_judge_evidence(load_manifest(write(corpus / "book-fits.yaml", budget.replace("9000", "4000"))))


def test_a_sweep_whose_judge_evidence_cannot_fit_is_one_line_with_nothing_written(corpus: Path):
    write(corpus / "corpus" / "long.txt", "The long voyage went on. " * 2000)
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}]\njudge: {k: 10, passage_tokens: 1024}\n")
    out = corpus / "sweep"
    code, err = run_cli(["sweep", str(manifest), "-o", str(out)])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and "m.yaml: judge.k 10 passages of up to judge.passage_tokens" in lines[0], err
    assert not out.exists()


def test_a_retrieval_setting_given_for_a_mode_that_never_uses_it_is_refused_even_at_its_default(corpus: Path,
                                                                                                tmp_path: Path):
    """`k: 5` (the default) with `evidence: none` would be recorded null: refused like any other value.
    Left out, each cell's run (which checks its judge again) takes the defaults without a word."""
    from booklens.pipeline import JudgeConfig, check_configs
    from booklens.sweep.run import plan_tasks

    given = load_manifest(write(corpus / "k.yaml", "books: corpus\nsystems: [{name: a}]\n"
                                                   "judge: {evidence: none, k: 5}\n"))
    with pytest.raises(BooklensError, match=r"k.yaml: judge.k is how many passages .* evidence none retrieves none"):
        plan_tasks(given, tmp_path / "out")
    plain = load_manifest(write(corpus / "none.yaml", "books: corpus\nsystems: [{name: a}]\njudge: {evidence: none}\n"))
    for task in plan_tasks(plain, tmp_path / "out"):
        judge = JudgeConfig.model_validate(task.judge_config)
        check_configs(plain.system_config(task.system, task.book), judge)
        assert judge.k == 5 and judge.retrieval_given() == {"k": None, "passage_tokens": None}


def test_a_retry_count_out_of_its_range_in_a_manifest_is_one_line_naming_the_range(corpus: Path):
    for value in (-1, 11, 10**9):
        manifest = write(corpus / "r.yaml", f"books: corpus\nsystems: [{{name: a, max_regenerations: {value}}}]\n")
        with pytest.raises(BooklensError, match=rf"system 'a': max_regenerations: must be from 0 to 10 \(got {value}\)"):
            load_manifest(manifest)


def test_a_setting_left_empty_is_named_as_the_manifest_names_it(corpus: Path):
    """`k:` with no value (YAML's null) passed the manifest's sections, whose every key may be left
    out, and failed where the cells were planned: 'judge: Input should be a valid integer' for the
    judge, a traceback for a system."""
    for section, named in (("judge: {k: null}", "judge.k"), ("judge: {evidence: ~}", "judge.evidence"),
                           ("judge: {steps: }", "judge.steps")):
        manifest = write(corpus / "m.yaml", f"books: corpus\nsystems: [{{name: a}}]\n{section}\n")
        with pytest.raises(BooklensError, match=rf"m.yaml: {re.escape(named)}: null is no value here; give one, "
                                                r"or leave the key out for its default$"):
            load_manifest(manifest)
    manifest = write(corpus / "s.yaml", "books: corpus\nsystems: [{name: a, chunk_size: null}]\n")
    code, err = run_cli(["sweep", str(manifest), "-o", str(corpus / "out"), "--dry-run"])
    assert code != 0 and err.strip().count("\n") == 0, err
    assert "s.yaml: system 'a': chunk_size: null is no value here" in err, err
    # a setting whose own value may be none takes null as that
    fine = write(corpus / "f.yaml", "books: corpus\nsystems: [{name: a, program: null}]\n"
                                    "judge: {budget_tokens: null, max_claims: null, programs: null}\n")
    load_manifest(fine).judge_config()


@pytest.mark.parametrize("text, message", [
    ("books: corpus\nsystems: [{name: a, chunk_size: 10, method: bogus, lm: 3}]\njudge: {k: 0}\n",
     "m.yaml: system 'a': method: \"bogus\" is not one of 'hier' or 'inc' (and 3 more problems: system 'a': "
     "chunk_size, system 'a': lm, judge.k)"),
    ("books: 3\nsystems: [{name: a, chunk_size: 10}]\n",
     "m.yaml: books: give a path, a folder or a glob, or a list of them (got 3) (and 1 more problem: "
     "system 'a': chunk_size)"),
    # the required key a misspelt one leaves missing is the same problem, not another
    ("books: corpus\nsystem: [{name: a}]\n", "m.yaml: unknown key 'system' (did you mean 'systems'?); known keys: "
     "lm, api_base, books, systems, judge"),
])
def test_a_manifest_with_several_bad_values_names_each_in_one_line(corpus: Path, text: str, message: str):
    """The first problem in full, then where the others are: fixing one does not only reveal the next."""
    manifest = write(corpus / "m.yaml", text)
    with pytest.raises(BooklensError) as caught:
        load_manifest(manifest)
    assert str(caught.value) == f"{manifest.parent}/{message}"


# llama.cpp's C++ server started with `-c 2048` states its per-slot window in /props.
SMALL_SERVER = {"/props": {"default_generation_settings": {"n_ctx": 2048}}}


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("given, which", [("", "the default context window 8192"),
                                          (", context_window: 4096", "context_window 4096")])
def test_a_system_window_larger_than_the_servers_is_refused_before_any_cell(corpus: Path, given: str, which: str,
                                                                            dry: bool):
    """The window is the one the server states, not LiteLLM's (which knows no self-hosted model):
    every cell would be refused alike, after the other systems' paid calls."""
    from booklens.sweep.run import dry_run, run_sweep
    from booklens.testing import FakeOpenAIServer

    manifest = write(corpus / "m.yaml", f"books: corpus\nsystems: [{{name: a{given}}}]\njudge: {{evidence: none}}\n")
    out = corpus / "sweep"
    with FakeOpenAIServer(pages=SMALL_SERVER) as server:
        with pytest.raises(BooklensError) as refused:
            if dry:
                dry_run(manifest, out, lm="openai/fake", api_base=server.url)
            else:
                run_sweep(manifest, out, lm="openai/fake", api_base=server.url, cache_dir=corpus / "cache",
                          progress_interval=60)
    assert str(refused.value) == (f"{manifest}: system 'a': {which} is larger than this model's 2048: set "
                                  "context_window to 2048 or less")
    assert server.received == [] and server.fetched == ["/v1/models", "/props"]  # asked once, no completion
    assert not out.exists()


def test_a_dry_run_with_no_server_up_takes_the_window_as_unknown_and_says_the_server_does_not_answer(corpus: Path):
    """The plan is printed, and a line after it says that a run now would fail: the dry run used to say
    nothing of it. Once per server, however many of the manifest's steps name it; a server that answers
    gets no warning."""
    from booklens.sweep.run import dry_run
    from booklens.testing import FakeOpenAIServer, free_port

    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, context_window: 16384}, {name: b}]\n")
    url = f"http://127.0.0.1:{free_port()}/v1"
    text = dry_run(manifest, corpus / "sweep", lm="openai/fake", api_base=url)
    assert text.startswith("4 cells: 2 systems \u00d7 2 books"), text
    assert [line for line in text.splitlines() if line.startswith("warning:")] == [
        f"warning: the server at {url} does not answer (Connection refused): a sweep run now would fail every "
        "call there"]
    with FakeOpenAIServer() as server:
        text = dry_run(manifest, corpus / "sweep", lm="openai/fake", api_base=server.url)
    assert not [line for line in text.splitlines() if line.startswith("warning:")], text
    assert server.received == []


def test_judge_settings_that_cannot_fit_the_servers_window_are_refused_before_any_cell(corpus: Path):
    from booklens.sweep.run import check_judge_evidence
    from booklens.testing import FakeOpenAIServer

    write(corpus / "corpus" / "long.txt", "The long voyage went on. " * 2000)
    write(corpus / "given.json", json.dumps({"alpha": "A sails.", "beta": "B reads.", "long": "It goes on."}))
    text = "books: corpus\nsystems: [{name: given, summaries: given.json}]\njudge: {evidence: bm25, k: 20}\n"
    with FakeOpenAIServer(pages=SMALL_SERVER) as server:
        def checked(name: str, manifest: str) -> None:
            check_judge_evidence(load_manifest(write(corpus / name, manifest), lm="openai/fake", api_base=server.url))

        # twenty passages fit 2048 tokens beside no demo: the values named are those, for the few-shot
        # judge too (its cells show it the demos that fit beside them)
        with pytest.raises(BooklensError, match=r"k.yaml: judge.k 20 passages of up to judge.passage_tokens 256 "
                           r"tokens: 5120 tokens of evidence per claim, .* in its 2048-token context window; lower "
                           r"judge.k to 2 or less or judge.passage_tokens to 33 or less \(the book 'long' and any as "
                           r"long\)$"):
            checked("k.yaml", text)
        checked("fewer-demos.yaml", text.replace("k: 20", "k: 2"))
        with pytest.raises(BooklensError, match=r"k0.yaml: judge.k 20 passages of up to judge.passage_tokens 256 "
                           r"tokens: 5120 tokens of evidence per claim, .* in its 2048-token context window; lower "
                           r"judge.k to 2 or less or judge.passage_tokens to 33 or less \(the book 'long' and any as "
                           r"long\)$"):
            checked("k0.yaml", text.replace("k: 20", "k: 20, zero_shot: true"))
        with pytest.raises(BooklensError, match=r"budget.yaml: judge.budget_tokens 4000: .* in its 2048-token context "
                           r"window; lower judge.budget_tokens to 749 or less"):
            checked("budget.yaml", text.replace("evidence: bm25, k: 20",
                                                "evidence: book, budget_tokens: 4000, zero_shot: true"))
        with pytest.raises(BooklensError) as larger:
            checked("judge-window.yaml", text.replace("k: 20", "k: 1, context_window: 4096"))
        checked("fits.yaml", text.replace("k: 20", "k: 4, zero_shot: true"))
    assert str(larger.value) == (f"{corpus / 'judge-window.yaml'}: judge.context_window 4096 is larger than this "
                                 "model's 2048: set judge.context_window to 2048 or less")
    assert server.received == [] and server.fetched == ["/v1/models", "/props"]


def test_a_sweeps_cells_reuse_the_window_its_checks_asked_of_the_server(corpus: Path):
    from booklens.sweep.run import run_sweep
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a, chunk_size: 512, context_window: 2048, "
                                        "max_summary_tokens: 100}]\njudge: {steps: [coherence]}\n")
    with FakeOpenAIServer(responder=PipelineResponder(), pages=SMALL_SERVER) as server:
        outcome = run_sweep(manifest, corpus / "sweep", lm="openai/fake", api_base=server.url,
                            cache_dir=corpus / "cache", progress_interval=60)
    assert [o.status for o in outcome.outcomes] == ["complete", "complete"], [o.error for o in outcome.outcomes]
    assert server.fetched == ["/v1/models", "/props"]


def test_a_dry_run_waits_once_for_a_server_that_does_not_answer(corpus: Path, monkeypatch):
    """A server whose host drops the packets is not waited for by each system, the judge and the
    estimate in turn: its window is unknown, as with no server up."""
    import socket

    from booklens.sweep.run import dry_run
    from booklens.testing import free_port

    port, tries, connect = free_port(), [], socket.create_connection

    def dropped(address, *args, **kwargs):
        if address[1] == port:
            tries.append(address)
            raise TimeoutError("timed out")
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", dropped)
    manifest = write(corpus / "m.yaml", "books: corpus\nsystems: [{name: a}, {name: b, chunk_size: 1024}]\n"
                                        "judge: {evidence: book}\n")
    text = dry_run(manifest, corpus / "sweep", lm="openai/fake", api_base=f"http://127.0.0.1:{port}/v1")
    assert text.startswith("4 cells: 2 systems \u00d7 2 books"), text
    assert len(tries) == 1
    assert (f"warning: the server at http://127.0.0.1:{port}/v1 does not answer (no connection within the connect "
            "timeout): ") in text
