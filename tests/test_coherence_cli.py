"""`booklens score` and `booklens agree` end to end (subprocess): bad input, scores from
annotations, scoring through an OpenAI-compatible server, and the embedded model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from booklens.errors import BooklensError
from booklens.testing import run_command

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "booookscore"
SUMMARY = ("Mara keeps the lighthouse on Gull Rock with her father. One winter night Zed appears at the door. "
           "The lamp stays lit and a ship reaches the harbor.")


def cli_env(tmp_path) -> dict[str, str]:
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_LM", None)
    return env


def run_cli(args, tmp_path, timeout=600):
    """`booklens ARGS` as the installed script, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "booklens", *map(str, args)], capture_output=True, text=True,
                          env=cli_env(tmp_path), timeout=timeout)


def assert_one_line_error(proc, out: Path, pattern: str):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and pattern in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def write(path: Path, content) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


HUMAN = {"lighthouse": {"summary": SUMMARY, "singles": [
    {"id": "a", "span": "Zed", "questions": "Who is Zed?", "labels": ["entity omission"]}], "relations": []}}
SENTENCE_ANN = {"lighthouse": {"One winter night Zed appears at the door.": {
    "questions": "Who is Zed?", "types": ["entity omission"]}}}


# Exit code and the one-line message need a real process: a few representative cases.
@pytest.mark.parametrize("setup, pattern", [
    (lambda d: ["score", d / "missing.txt"], "summary file not found"),
    (lambda d: ["score", write(d / "empty.txt", "  \n")], "empty"),
    (lambda d: ["score", "--annotations", write(d / "a.json", [1, 2])], "not an annotation set"),
    # annotations are scored as they are: the LM judge's options would do nothing
    (lambda d: ["score", "--annotations", write(d / "a.json", HUMAN), "--lm", "openai/gpt-4o", "--batch-size", "5",
                "--zero-shot", "--book", d / "a.json"],
     "--annotations scores existing annotations with no LM: --book, --batch-size, --lm, --zero-shot would not apply"),
    (lambda d: ["score", "--annotations", write(d / "a.json", SENTENCE_ANN),
                "--summaries", write(d / "s.json", {"another": SUMMARY})], "'lighthouse' is in the annotation file"),
    # Nothing in them to confuse a reader or to be false: judged, each would score 100.
    (lambda d: ["score", write(d / "dots.txt", "...")], "has no words"),
    (lambda d: ["score", write(d / "zw.txt", "\u200b\u200b\n")], "has no words"),
    (lambda d: ["score", write(d / "one.json", {"summary": "--"})], "has no words"),
    (lambda d: ["score", write(d / "map.json", {"a": SUMMARY, "b": "* * *"})], "the summary of 'b' has no words"),
    (lambda d: ["run", write(d / "book.txt", SUMMARY), "--summary", write(d / "s.txt", "..."), "-o", d / "run",
                "--lm", "openai/x", "--api-base", "http://127.0.0.1:9/v1"], "has no words"),
], ids=["missing", "empty", "annot-wrong-shape", "annot-with-judge-options",
        "book-only-in-annotations", "dots", "zero-width", "json-symbols",
        "map-symbols", "run-given-dots"])
def test_bad_input_gives_one_line_error(tmp_path, setup, pattern):
    out = tmp_path / "out.json"
    proc = run_command([*setup(tmp_path), "-o", out], env=cli_env(tmp_path))
    assert_one_line_error(proc, out, pattern)


def invoke(args, tmp_path):
    """In-process run (fast): user errors come back as the BooklensError the CLI would print."""
    from typer.testing import CliRunner

    from booklens.cli import app

    os.environ["BOOKLENS_CACHE_DIR"] = str(tmp_path / "cache")
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("setup, pattern", [
    (lambda d: ["score", write(d / "m.json", {"a": ""})], "empty"),
    (lambda d: ["score", write(d / "m.json", [1, 2])], "JSON object mapping book names"),
    (lambda d: ["score", write(d / "bad.json", "{not json")], "not valid JSON"),
    (lambda d: ["score", write(d / "s.json", {"kind": "booklens.summary", "summary": " "})], "empty summary"),
    (lambda d: ["score", "--annotations", write(d / "a.json", {"b": "text"})], "not an annotation set"),
    (lambda d: ["score", "--annotations", write(d / "a.json", {"b": {"summary": "A b.", "singles": "x",
                                                                   "relations": []}})], "must be lists"),
    (lambda d: ["score", "--annotations", write(d / "a.json", {"b": {"summary": "A b.", "singles": [
        {"span": "A", "questions": "q", "labels": ["bad type"]}], "relations": []}})], "unknown error type"),
    (lambda d: ["score", "--annotations", write(d / "a.json", SENTENCE_ANN)], "--summaries"),
    (lambda d: ["score", "--annotations", write(d / "a.json", HUMAN),
                "--summaries", write(d / "s.json", {"another": SUMMARY})], "not in the summaries file"),
    (lambda d: ["score", "--annotations", d / "missing.json"], "not found"),
    (lambda d: ["score", "--annotations", write(d / "a.json", HUMAN), write(d / "t.txt", SUMMARY)], "not both"),
    (lambda d: ["score"], "missing SUMMARY"),
    (lambda d: ["score", write(d / "m.json", {"a": SUMMARY, "b": SUMMARY}), "--book", REPO / "README.md"],
     "single summary"),
    (lambda d: ["agree", write(d / "a.json", HUMAN), write(d / "b.json", {"x": {"summary": "Other. Text.",
                                                                              "singles": [], "relations": []}})],
     "no book in common"),
    (lambda d: ["agree", write(d / "a.json", HUMAN), write(d / "b.json", {"lighthouse": {
        "summary": "Other. Text.", "singles": [], "relations": []}})], "different summary"),
    (lambda d: ["agree", write(d / "a.json", SENTENCE_ANN), write(d / "b.json", HUMAN)], "--summaries"),
    (lambda d: ["score", write(d / "s.json", {"summary": " "})], "empty summary"),
    (lambda d: ["score", write(d / "c.json", {"format_version": 1, "kind": "booklens.claims", "claims": []})],
     "is a booklens.claims record, not a summary"),
    (lambda d: ["score", write(d / "deep.json", "[" * 100_000 + "]" * 100_000)], "nested too deeply"),
    (lambda d: ["score", write(d / "m.json", '{"a": "One. Two.",\n "a": "Three."}')],
     "summary file is malformed: the key 'a' appears twice in one object"),
    # One summary whose text is not a string, not a book called "summary" (the message said so)
    (lambda d: ["score", write(d / "n.json", {"summary": None, "book": "x.txt"})],
     "n.json: its 'summary' must be a string, not null"),
    (lambda d: ["score", write(d / "l.json", {"summary": ["One.", "Two."]})],
     "l.json: its 'summary' must be a string, not a list"),
], ids=["empty-in-map", "list", "bad-json", "empty-summarize-output", "annot-strings", "annot-singles",
        "annot-unknown-label", "no-summaries", "human-book-only-in-annotations", "annot-missing", "both-inputs",
        "nothing", "book-with-map", "agree-disjoint", "agree-different-summary", "agree-needs-summaries",
        "empty-summary-object", "another-record", "nested-too-deeply", "key-twice", "summary-null",
        "summary-list"])
def test_bad_input_is_a_user_error(tmp_path, setup, pattern):
    out = tmp_path / "out.json"
    args = setup(tmp_path)
    result = invoke([*args, "-o", out] if args[0] == "score" else args, tmp_path)
    assert result.exit_code != 0
    assert isinstance(result.exception, BooklensError), result.exception
    assert pattern in str(result.exception) and "\n" not in str(result.exception)
    assert not out.exists()


@pytest.mark.parametrize("content", [None, [SUMMARY], SUMMARY], ids=["null", "list", "string"])
@pytest.mark.parametrize("command", ["score", "agree"])
def test_a_summaries_file_that_holds_no_summaries_says_so(tmp_path, command, content):
    """A --summaries file holding `null` read as no file given: the error asked for the --summaries
    that had just been passed."""
    summaries = write(tmp_path / "s.json", json.dumps(content))
    sentences = write(tmp_path / "a.json", SENTENCE_ANN)
    args = ["score", "--annotations", sentences] if command == "score" else ["agree", sentences,
                                                                             write(tmp_path / "h.json", HUMAN)]
    result = invoke([*args, "--summaries", summaries], tmp_path)
    assert isinstance(result.exception, BooklensError), result.exception
    message = str(result.exception)
    assert f"summaries file {summaries} must be a JSON object mapping book names to entries" in message, message
    assert "\n" not in message


def test_score_from_annotations_and_agree(tmp_path):
    out = tmp_path / "human.json"
    result = invoke(["score", "--annotations", write(tmp_path / "h.json", HUMAN), "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["kind"] == "booklens.coherence_set" and record["annotator"] == "human"
    assert record["system_score"] == pytest.approx(2 / 3)
    assert record["results"]["lighthouse"]["sentences"][1]["confusing"] is True
    out2 = tmp_path / "gpt.json"
    result = invoke(["score", "--annotations", write(tmp_path / "g.json", SENTENCE_ANN),
                     "--summaries", write(tmp_path / "s.json", {"lighthouse": SUMMARY, "calm": "Nothing. Happens."}),
                     "-o", out2], tmp_path)
    assert result.exit_code == 0, result.output
    gpt = json.loads(out2.read_text())
    assert gpt["n_summaries"] == 2 and gpt["system_score"] == pytest.approx((2 / 3 + 1) / 2)
    assert "BooookScore 83.3 [66.7, 100.0] over 2 summaries" in result.output  # 95% interval over summaries
    result = invoke(["score", "--annotations", tmp_path / "g.json", "--summaries", tmp_path / "s.json",
                     "--split", "test", "-o", tmp_path / "test.json"], tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "test.json").read_text())["n_summaries"] == 1  # one of the two books
    result = invoke(["agree", out2, out, "-o", tmp_path / "agree.json"], tmp_path)
    assert result.exit_code == 0, result.output
    assert re.search(r"\| confusing \| 33\.3 \| 33\.3 \| 1\.000 \| 1\.000 \| 1\.000 \| 1\.000 \|", result.output)
    assert "books only in A: 1" in result.output
    assert json.loads((tmp_path / "agree.json").read_text())["books"] == 1


def test_agree_says_which_annotations_it_ignored_and_refuses_unread_summaries(tmp_path):
    human = write(tmp_path / "h.json", HUMAN)
    annotations = {"lighthouse": {**SENTENCE_ANN["lighthouse"], "A gull steals the keys.": {
        "questions": "What keys?", "types": ["entity omission"]}}}
    sentences = write(tmp_path / "g.json", annotations)
    summaries = write(tmp_path / "s.json", {"lighthouse": SUMMARY})
    out = tmp_path / "agree.json"
    result = invoke(["agree", sentences, human, "--summaries", summaries, "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    assert f"note: set A: 1 of 2 annotated sentences are not in their summaries and were ignored ({out} lists them)" \
        in result.output
    report = json.loads(out.read_text())
    assert report["ignored_annotations"] == {"a": 1, "b": 0}
    assert report["notes"]["a"] == ["lighthouse: an annotated sentence is not in the summary and was ignored: "
                                    "'A gull steals the keys.'"]
    assert report["confusing"]["f1"] == 1.0  # the matched sentence agrees with the human label

    result = invoke(["agree", human, human, "--summaries", summaries], tmp_path)
    assert result.exit_code != 0 and isinstance(result.exception, BooklensError)
    assert str(result.exception) == ("--summaries is only read for sentence annotations, and neither set holds "
                                     "them (each carries its own summaries)")


@pytest.mark.skipif(not DATA.is_dir(), reason=f"BooookScore data not found at {DATA}")
def test_table2_row_through_the_cli(tmp_path):
    out = tmp_path / "out.json"
    result = invoke(["score", "--annotations", DATA / "gpt4" / "claude-2048-hier.json",
                     "--summaries", DATA / "summaries" / "claude-2048-hier-cleaned.json", "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert abs(100 * record["system_score"] - 91.1) <= 0.6
    assert record["stats"]["avg_length_tokens"] == pytest.approx(522.6, abs=0.05)


def fake_coherence_answer(body: dict) -> str:
    """The answer of an OpenAI-compatible server to a confusion-detection prompt."""
    user = body["messages"][-1]["content"]
    if "[[ ## sentences ## ]]" in user:
        block = user.split("[[ ## sentences ## ]]", 1)[1].strip().split("\n\n")[0]
        numbers = [int(line.split(":", 1)[0]) for line in block.splitlines() if re.match(r"^\d+:", line)]
        answers = [{"number": n, "verdict": "confusion" if "Zed" in line else "no confusion",
                    "questions": ["Who is Zed?"] if "Zed" in line else [],
                    "error_types": ["entity omission"] if "Zed" in line else []}
                   for n, line in zip(numbers, block.splitlines())]
        return json.dumps({"answers": answers})
    sentence = user.split("[[ ## sentence ## ]]", 1)[1].strip().split("\n\n")[0]
    if "Zed" in sentence:
        return json.dumps({"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission"]})
    return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})


@pytest.mark.parametrize("batch", [1, 2])
def test_score_through_an_openai_compatible_server(tmp_path, batch):
    testing = pytest.importorskip("booklens.testing")
    if not hasattr(testing, "FakeOpenAIServer"):
        pytest.skip("FakeOpenAIServer not available")
    record_path = write(tmp_path / "summary.json", {
        "kind": "booklens.summary", "book": str(REPO / "examples" / "sample_story.txt"), "summary": SUMMARY})
    out = tmp_path / "out.json"
    args = ["score", record_path, "--lm", "openai/fake", "--api-base", None, "--batch-size", batch, "-o", out]
    with testing.FakeOpenAIServer(responder=fake_coherence_answer) as server:
        args[args.index("--api-base") + 1] = server.url
        if batch == 1:  # in a real process
            proc = run_cli(args, tmp_path)
            assert proc.returncode == 0, proc.stderr
            stderr = proc.stderr
        else:
            result = invoke(args, tmp_path)
            assert result.exit_code == 0, result.output
            stderr = result.output
        served = len(server.served)
    result = json.loads(out.read_text())
    assert result["kind"] == "booklens.coherence"
    assert result["mode"] == ("per-sentence" if batch == 1 else "batched")
    assert [s["confusing"] for s in result["sentences"]] == [False, True, False]
    assert result["score"] == pytest.approx(2 / 3)
    assert served == (3 if batch == 1 else 2)
    assert result["stats"]["length_tokens"] > 10
    assert result["stats"]["novel_trigrams_pct"] is not None  # the book named in the summarize output
    assert "BooookScore 66.7 (3 sentences, 1 confusing)" in stderr


def test_the_score_line_counts_one_sentence_and_one_summary_in_the_singular(tmp_path):
    from booklens.testing import FakeOpenAIServer

    one = write(tmp_path / "one.txt", "Maren keeps the light.")
    both = write(tmp_path / "map.json", {"lighthouse": "Maren keeps the light."})
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url]
        single = invoke(["score", one, *lm], tmp_path)
        mapped = invoke(["score", both, *lm], tmp_path)
    assert single.exit_code == 0 and "BooookScore 100.0 (1 sentence, 0 confusing)" in single.output
    assert mapped.exit_code == 0 and "over 1 summary (1 sentence, 0 confusing)" in mapped.output


def test_score_with_a_judge_that_answers_no_sentence_writes_its_record_and_fails(tmp_path):
    """No valid verdict on any sentence: the record is written for a look at its errors, but the
    command ends with a one-line error and exit 2, not a score."""
    from booklens.testing import FakeOpenAIServer

    summary = write(tmp_path / "summary.txt", SUMMARY)
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=lambda body: "It reads fine.") as server:
        proc = run_command(["score", summary, "--lm", "openai/fake", "--api-base", server.url, "-o", out],
                           env=cli_env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: the judge gave no valid verdict on any of the 3 sentences (first: ")
    record = json.loads(out.read_text())
    assert record["n_failed"] == record["n_sentences"] == 3 and record["score"] is None


@pytest.mark.embedded
def test_embedded_model_scores_a_summary(tmp_path):
    summary = write(tmp_path / "summary.txt", SUMMARY)
    out = tmp_path / "out.json"
    # The batched path, zero-shot, one try (re-asks are the program's, checked with scripted LMs). The
    # few-shot detector's prompt (some 6K tokens, minutes on one core) goes to a fake server in
    # test_judges_cli (score with no options).
    proc = run_command(["score", summary, "--lm", "local", "--batch-size", "3", "--concurrency", "1", "--zero-shot",
                        "--tries", "1", "-o", out], env=cli_env(tmp_path))
    # What the 135M model answers differs with the CPU llama.cpp was built for: on some, its batched
    # answer gives no valid verdict on any of the three sentences, and the command stops after
    # writing the record. Either way every sentence is recorded as the checks below say.
    if proc.returncode != 0:
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
            "error: the judge gave no valid verdict on any of the 3 sentences"), proc.stderr
    result = json.loads(out.read_text())
    assert len(result["sentences"]) == 3
    assert result["usage"]["calls"] >= 1
    for s in result["sentences"]:
        assert (s["status"] == "ok") == (s["confusing"] is not None)
        assert set(s["types"]) <= {"entity omission", "event omission", "causal omission", "salience",
                                   "discontinuity", "duplication", "inconsistency", "language"}


def test_annotations_of_other_summaries_are_an_error_not_a_perfect_score(tmp_path):
    out = tmp_path / "out.json"
    other = write(tmp_path / "s.json", {"lighthouse": "A calm story. Nothing happens at all."})
    proc = run_command(["score", "--annotations", write(tmp_path / "a.json", SENTENCE_ANN), "--summaries", other,
                        "-o", out], env=cli_env(tmp_path))
    assert_one_line_error(proc, out, f"no annotated sentence of the annotation file {tmp_path / 'a.json'} (1 in all) "
                                     f"is in its summary in the summaries file {other}")
    proc = run_command(["agree", tmp_path / "a.json", write(tmp_path / "h.json", HUMAN), "--summaries", other],
                       env=cli_env(tmp_path))
    assert proc.returncode == 2 and "these summaries are not the ones annotated" in proc.stderr


def test_annotations_partly_not_in_their_summaries_are_counted_on_the_console(tmp_path):
    out = tmp_path / "out.json"
    annotations = {"lighthouse": {**SENTENCE_ANN["lighthouse"],
                                  "A sentence no summary has.": {"questions": "?", "types": ["language"]}}}
    proc = run_command(["score", "--annotations", write(tmp_path / "a.json", annotations),
                        "--summaries", write(tmp_path / "s.json", {"lighthouse": SUMMARY}), "-o", out],
                       env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert ("note: 1 of 2 annotated sentences are not in their summaries and were ignored (the record's notes "
            "list them)") in proc.stderr.splitlines()
    assert any("was ignored" in n for n in json.loads(out.read_text())["notes"])


@pytest.mark.skipif(not DATA.is_dir(), reason=f"BooookScore data not found at {DATA}")
def test_released_annotations_with_another_configurations_summaries_are_refused(tmp_path):
    out = tmp_path / "out.json"
    proc = run_command(["score", "--annotations", DATA / "gpt4" / "gpt4-2048-hier.json",
                        "--summaries", DATA / "summaries" / "claude-2048-inc-cleaned.json", "-o", out],
                       env=cli_env(tmp_path))
    assert_one_line_error(proc, out, "(305 in all) is in its summary")


@pytest.mark.skipif(not DATA.is_dir(), reason=f"BooookScore data not found at {DATA}")
def test_agree_refuses_a_set_whose_sentences_are_mostly_not_in_the_summaries_given(tmp_path):
    # One --summaries file for two configurations: 1 of gpt4-2048-inc's 639 sentences is also in a
    # hierarchical summary, so not every one was missing, and the other 638 read as clean sentences.
    proc = run_command(["agree", DATA / "gpt4" / "gpt4-2048-hier.json", DATA / "gpt4" / "gpt4-2048-inc.json",
                        "--summaries", DATA / "summaries" / "gpt4-2048-hier-cleaned.json"], env=cli_env(tmp_path))
    assert_one_line_error(proc, tmp_path / "none.json", "638 of the 639 annotated sentences")
    assert proc.stdout == ""


def test_agree_notes_human_spans_that_are_not_in_their_summary(tmp_path):
    stray = {"lighthouse": {**HUMAN["lighthouse"], "singles": [
        {"id": "a", "span": "Zed sails away at dawn.", "questions": "Who is Zed?", "labels": ["entity omission"]}]}}
    out = tmp_path / "agree.json"
    proc = run_command(["agree", write(tmp_path / "a.json", stray), write(tmp_path / "b.json", HUMAN), "-o", out],
                       env=cli_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (f"note: set A: 1 of 1 human-annotated spans are not in their summaries and were ignored ({out} lists "
            "them)") in proc.stderr.splitlines()
    report = json.loads(out.read_text())
    assert report["ignored_annotations"] == {"a": 1, "b": 0} and "Zed sails away" in report["notes"]["a"][0]
    assert "1 book, 3 sentences" in proc.stdout


def test_a_summary_object_with_other_keys_is_one_summary_not_a_map(tmp_path):
    # Its model name and title were judged as two more summaries.
    result = score_through_fake_server([write(tmp_path / "s.json", {"summary": SUMMARY, "model": "gpt-4o",
                                                                    "title": "The Keeper"})], tmp_path)
    assert result["kind"] == "booklens.coherence" and len(result["sentences"]) == 3


def score_through_fake_server(args, tmp_path):
    from booklens.testing import FakeOpenAIServer

    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:
        proc = run_command(["score", *args, "--lm", "openai/fake", "--api-base", server.url,
                            "--cache-dir", tmp_path / "cache", "-o", out])
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_a_json_object_with_a_summary_string_is_one_summary(tmp_path):
    # As `claims`, `check` and `run --summary` read it: not a map with a book called "summary".
    result = score_through_fake_server([write(tmp_path / "s.json", {"summary": SUMMARY})], tmp_path)
    assert result["kind"] == "booklens.coherence"
    assert [s["confusing"] for s in result["sentences"]] == [False, True, False]


def test_score_help_names_every_summary_file_it_reads():
    # The help lists what `load_summaries` takes, the {"summary": ...} object of the test above included.
    from typer.main import get_command

    from booklens.cli import app

    params = get_command(app).commands["score"].params
    help_text = next(p.help for p in params if p.name == "summary")
    for kind in ("text file", "`booklens summarize` output", "'summary' string", "map book -> summary"):
        assert kind in help_text, help_text


def summarize_record(book: str, text: str) -> dict:
    import hashlib

    return {"kind": "booklens.summary", "book": book, "summary": SUMMARY,
            "book_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), "config": {"drop_matter": False}}


def test_the_book_a_summarize_record_names_is_found_beside_it_and_must_be_that_book(tmp_path, monkeypatch):
    from booklens.text import read_book

    story = REPO / "examples" / "sample_story.txt"
    records = tmp_path / "records"
    records.mkdir()
    (records / "story.txt").write_bytes(story.read_bytes())
    record = write(records / "summary.json", summarize_record("story.txt", read_book(story)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # Relative to where the command runs there is no story.txt: the one beside the record is read.
    assert score_through_fake_server([record], tmp_path)["stats"]["novel_trigrams_pct"] is not None
    # A different story.txt where the command runs is not the summarized book, and is not read.
    (elsewhere / "story.txt").write_text("Another tale about someone else entirely.", encoding="utf-8")
    (records / "story.txt").unlink()
    assert "novel_trigrams_pct" not in score_through_fake_server([record], tmp_path)["stats"]


def test_the_novel_trigrams_of_a_record_are_counted_against_the_text_it_summarized(tmp_path, books_dir):
    """A summary made with --drop-matter is compared with the book without its front matter (the
    book was read with the record's setting to check its digest, and that text is used)."""
    import hashlib

    from booklens.metrics.booookscore import novel_trigram_pct
    from booklens.text import read_book

    book = books_dir / "poirot_investigates.txt"
    summary = "Poirot solves THE MURDER ON THE LINKS in a book of cases."  # a title its front matter lists
    dropped, whole = read_book(book, drop_matter=True), read_book(book)
    assert (novel_trigram_pct(summary, dropped), round(novel_trigram_pct(summary, whole), 1)) == (100.0, 72.7)
    record = write(tmp_path / "summary.json", {
        "kind": "booklens.summary", "book": str(book), "summary": summary,
        "book_sha256": hashlib.sha256(dropped.encode("utf-8")).hexdigest(), "config": {"drop_matter": True}})
    stats = score_through_fake_server([record], tmp_path)["stats"]
    assert stats["novel_trigrams_pct"] == novel_trigram_pct(summary, dropped)


def test_score_refuses_to_write_over_the_book_its_record_names(tmp_path):
    from booklens.text import read_book

    book = tmp_path / "story.txt"
    book.write_bytes((REPO / "examples" / "sample_story.txt").read_bytes())
    record = write(tmp_path / "summary.json", summarize_record(str(book), read_book(book)))
    before = book.read_bytes()
    proc = run_command(["score", record, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1", "-o", book])
    assert proc.returncode == 2 and "also an input" in proc.stderr, proc.stderr
    assert book.read_bytes() == before


def test_score_refuses_to_write_over_the_book_its_record_names_from_another_folder(tmp_path, monkeypatch):
    # The record names its book by the relative path summarize was given, which resolves neither
    # here nor beside the record; the book is still found by its digest when -o names it.
    from booklens.text import read_book

    (tmp_path / "books").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    book = tmp_path / "books" / "story.txt"
    book.write_bytes((REPO / "examples" / "sample_story.txt").read_bytes())
    record = write(tmp_path / "runs" / "summary.json", summarize_record("books/story.txt", read_book(book)))
    monkeypatch.chdir(tmp_path / "elsewhere")
    before = book.read_bytes()
    proc = run_command(["score", record, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1", "-o", book])
    assert proc.returncode == 2 and "also an input" in proc.stderr, proc.stderr
    assert book.read_bytes() == before


def test_an_output_name_the_file_system_refuses_is_a_one_line_error(tmp_path):
    out = tmp_path / ("x" * 300 + ".json")
    proc = run_command(["score", write(tmp_path / "s.txt", SUMMARY), "-o", out])
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: cannot write {out}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_rerun_counts_the_calls_the_cache_answered_among_its_calls(tmp_path):
    from booklens.testing import FakeOpenAIServer

    summary = write(tmp_path / "s.txt", SUMMARY)
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:
        args = ["score", summary, "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache"]
        first, second = run_command(args), run_command(args)
    assert "3 LM calls (0 from cache)" in first.stderr, first.stderr
    # Every command says it the same way: N counts every call, those the cache answered included,
    # with the tokens they had when made, so the rerun's record and line show the same work.
    tokens = re.search(r"\(0 from cache\), (\d+ prompt \+ \d+ completion tokens)", first.stderr).group(1)
    assert not tokens.startswith("0 prompt")
    assert f"3 LM calls (3 from cache), {tokens}" in second.stderr, second.stderr


def test_a_summary_the_judge_scored_nowhere_is_left_out_and_said(tmp_path):
    """The system score is the mean over the summaries that have a score; the line and the record
    say how many those are, so two systems are not compared over different books unawares."""
    from booklens.testing import FakeOpenAIServer

    def answer(body):
        if "Bram" in body["messages"][-1]["content"].split("[[ ## sentence ## ]]", 1)[-1]:
            return "not an answer"  # every sentence of the second summary
        return fake_coherence_answer(body)

    summaries = write(tmp_path / "map.json", {"lighthouse": SUMMARY, "bram": "Bram rows out. Bram rows back."})
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = run_command(["score", summaries, "--zero-shot", "--lm", "openai/fake", "--api-base", server.url,
                              "--cache-dir", tmp_path / "cache", "-o", out])
    record = json.loads(out.read_text())
    assert record["n_summaries"] == 2 and record["n_scored_summaries"] == 1
    assert record["results"]["bram"]["score"] is None
    assert record["system_score"] == record["results"]["lighthouse"]["score"]
    assert "over 1 of 2 summaries" in result.stderr, result.stderr


def test_a_judge_that_left_demos_out_says_so_on_the_console(tmp_path):
    """The judge line names the judge as shipped (and its calibration); a summary too long for all
    its demos was judged with fewer, and the console says so, not only the JSON."""
    from booklens.testing import FakeOpenAIServer

    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    summaries = write(tmp_path / "map.json", {"long": " ".join([sentence] * 150), "short": "Anna walks."})
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:  # gpt-4: an 8K window LiteLLM knows
        result = run_command(["score", summaries, "--lm", "openai/gpt-4", "--api-base", server.url,
                              "--cache-dir", tmp_path / "cache", "-o", out])
    assert result.returncode == 0, result.stderr
    note = json.loads(out.read_text())["results"]["long"]["notes"][0]
    assert "demos were left out" in note
    assert f"note: 'long': {note}" in result.stderr, result.stderr
    assert "'short'" not in result.stderr


def test_a_batched_judge_counts_the_demos_it_left_out_as_its_judge_line_counts_them(tmp_path):
    """The batched judge's line counts its demos in labelled sentences (32); its note counted demo
    summaries ("1 of the judge's 2 demos were left out"), as if the two spoke of other judges."""
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    summaries = write(tmp_path / "map.json", {"long": " ".join([sentence] * 150)})
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        result = run_command(["score", summaries, "--batch-size", "3", "--lm", "openai/gpt-4", "--api-base",
                              server.url, "--cache-dir", tmp_path / "cache", "-o", out])
    assert result.returncode == 0, result.stderr
    record = json.loads(out.read_text())
    demos = record["judge"]["demos"]
    assert f"batched, {demos} demos" in result.stderr
    (note,) = record["results"]["long"]["notes"]
    assert f" of the judge's {demos} demos were left out" in note, note


@pytest.mark.skipif(not DATA.is_dir(), reason=f"BooookScore data not found at {DATA}")
def test_scoring_a_summary_the_shipped_judge_shows_as_a_demo_says_so(tmp_path):
    """The human-annotated file README scores holds the default judge's demo summaries (training
    split): scored, such a summary is judged with its own labels in the prompt, and the console says
    so for that summary alone."""
    from booklens.judges import load_judge
    from booklens.testing import FakeOpenAIServer

    human = json.loads((DATA / "human" / "summary-gpt4-4096-inc.json").read_text())
    demo_summaries = {" ".join(d["summary"].split()) for d in load_judge("coherence").detect.demos}
    own = next(name for name, entry in human.items() if " ".join(entry["summary"].split()) in demo_summaries)
    other = next(name for name, entry in human.items() if " ".join(entry["summary"].split()) not in demo_summaries)
    summaries = write(tmp_path / "two.json", {own: human[own], other: human[other]})
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:
        result = invoke(["score", summaries, "--lm", "openai/fake", "--api-base", server.url, "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    (note,) = json.loads(out.read_text())["results"][own]["notes"]
    assert note.startswith("this summary is one of the judge's demos, with 16 of its sentences labelled")
    assert f"note: {own!r}: {note}" in result.output
    assert repr(other) not in result.output


@pytest.mark.parametrize("content", ["", "\n", " \r\n\t"])
def test_an_empty_json_input_is_empty_for_agree_as_for_fables_data(tmp_path, content):
    """A file of nothing but a newline was "not valid JSON (line 2: Expecting value)" for `agree` and
    "is empty" for FABLES data: one reader, one wording."""
    from booklens.data.fables import load_fables

    empty = write(tmp_path / "a.json", content)
    result = invoke(["agree", empty, write(tmp_path / "b.json", HUMAN)], tmp_path)
    assert isinstance(result.exception, BooklensError)
    assert str(result.exception) == f"annotation set A is empty ({empty})"
    with pytest.raises(BooklensError) as caught:
        load_fables(write(tmp_path / "FABLES.json", content))
    assert str(caught.value) == f"FABLES data is empty ({tmp_path / 'FABLES.json'})"


def test_the_same_summary_as_a_text_file_a_record_or_a_map_is_judged_once(tmp_path):
    """Text files are read trimmed; a record or a map keeps what its writer wrote (a trailing
    newline here). The judge sees the same summary either way, so the second and third runs are
    answered from the call cache."""
    from booklens.testing import FakeOpenAIServer

    text = write(tmp_path / "summary.txt", SUMMARY + "\n")
    record = write(tmp_path / "summary.json", {"summary": "\n" + SUMMARY + "\n\n"})
    mapped = write(tmp_path / "map.json", {"lighthouse": SUMMARY + " \n"})
    with FakeOpenAIServer(responder=fake_coherence_answer) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url]
        first = invoke(["score", text, *lm], tmp_path)
        asked = len(server.served)
        again = [invoke(["score", path, *lm], tmp_path) for path in (record, mapped)]
    assert first.exit_code == 0 and asked > 0, first.output
    assert all(run.exit_code == 0 for run in again), [run.output for run in again]
    assert len(server.served) == asked
