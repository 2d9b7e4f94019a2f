"""`booklens diverse`, `judge` and `bias`: bad input ends in one line and a non-zero exit; whole
runs against a local OpenAI-compatible test server (a judge that always prefers position B)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from booklens.diverse_runs import judge_summaries
from booklens.errors import BooklensError
from booklens.testing import FakeOpenAIServer

FIXTURE = Path(__file__).resolve().parents[1] / "examples" / "diverse" / "harbor_bridge_closure.json"


def run(args, tmp_path):
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "booklens", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


def invoke(args, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from booklens.cli import app

    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_event_with_fewer_than_two_articles(tmp_path):
    event = json.loads(FIXTURE.read_text())[0]
    event["articles"] = event["articles"][:1]
    event["question_answers"] = []
    path = tmp_path / "one.json"
    path.write_text(json.dumps([event]))
    result = run(["diverse", str(path)], tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "at least 2" in lines[0], result.stderr


def test_judge_input_checks(tmp_path, monkeypatch):
    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"harbor-bridge-closure": "x"}))
    eid = json.loads(FIXTURE.read_text())[0]["eid"]
    summaries.write_text(json.dumps({eid: "A summary."}))
    with pytest.raises(BooklensError, match="unknown protocol 'ranking': use binary, likert, pairwise"):
        judge_summaries(FIXTURE, summaries, protocol="ranking")
    with pytest.raises(BooklensError, match="second summaries file"):
        invoke(["judge", str(FIXTURE), str(summaries), "--protocol", "pairwise"], tmp_path, monkeypatch)
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"some-other-event": "x"}))
    with pytest.raises(BooklensError, match="no summary for event"):
        invoke(["bias", "position", str(FIXTURE), str(summaries), str(other)], tmp_path, monkeypatch)
    # options that would do nothing are refused, not recorded as if they had applied
    with pytest.raises(BooklensError, match="^per_qa is for pairwise coverage"):
        judge_summaries(FIXTURE, summaries, protocol="likert", per_qa=True)
    with pytest.raises(BooklensError, match="^max_articles limits the articles faithfulness is judged against"):
        judge_summaries(FIXTURE, summaries, criterion="coverage", max_articles=2)
    # the bias studies take the same options and refuse them alike
    for args, message in ((["position", str(summaries), str(summaries), "--criterion", "faithfulness", "--per-qa"],
                           "--per-qa is for pairwise coverage"),
                          (["position", str(summaries), str(summaries), "--criterion", "coverage",
                            "--max-articles", "2"], "--max-articles limits the articles faithfulness"),
                          (["verbosity", str(summaries), "--protocol", "single", "--per-qa"],
                           "--per-qa is for pairwise coverage")):
        with pytest.raises(BooklensError, match=message):
            invoke(["bias", args[0], str(FIXTURE), *args[1:]], tmp_path, monkeypatch)


@pytest.mark.parametrize("args, message", [
    (["--method", "direct", "--sentences", "3"], "--sentences sets what --method extract takes"),
    (["--answer-clustering", "exact"], "shape generated references: add --generate-questions N"),
    (["--no-diversity-filter"], "shape generated references: add --generate-questions N"),
    (["--no-judge", "--faithfulness", "both"], "--no-judge judges none"),
    (["--no-judge", "--max-articles", "2"], "--no-judge judges none"),
    (["--faithfulness", "none", "--max-articles", "2"],
     "--max-articles limits the articles faithfulness is judged against; --faithfulness none judges none"),
    (["--context-window", "1024"], "the context window (1024 tokens) leaves no room for the articles"),
    # the defaults given out loud are refused as well (as qa's retrieval settings are): the record has them null
    (["--method", "direct", "--sentences", "10"], "--sentences sets what --method extract takes"),
    (["--answer-clustering", "llm"], "shape generated references: add --generate-questions N"),
    (["--diversity-filter"], "shape generated references: add --generate-questions N"),
    (["--no-judge", "--faithfulness", "likert"], "--no-judge judges none"),
])
def test_diverse_refuses_settings_that_would_do_nothing_before_any_call(args, message, tmp_path, monkeypatch):
    with pytest.raises(BooklensError, match=message.replace("(", r"\(").replace(")", r"\)")):
        invoke(["diverse", str(FIXTURE), *args, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
               tmp_path, monkeypatch)


def test_diverse_fails_when_no_event_got_a_summary_and_keeps_the_record(tmp_path, monkeypatch):
    out = tmp_path / "d.json"
    with pytest.raises(BooklensError, match=r"no event got a summary \(first: "):
        invoke(["diverse", str(FIXTURE), "--method", "direct", "--context-window", "1400", "--no-judge",
                "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1", "-o", str(out)], tmp_path, monkeypatch)
    assert json.loads(out.read_text())["events"][0]["summary"] is None


def test_judge_and_bias_fail_when_the_judge_gave_no_verdict_and_keep_the_record(tmp_path, monkeypatch):
    """A judge that answers nothing usable gives no score: `judge` and `bias` write their record (the
    errors are in it) and end in a one-line error instead of printing a score of '-' with exit 0."""
    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"ev-0001": "The bridge closed for repairs."}))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"ev-0001": "Sources disagree about the closure."}))
    with FakeOpenAIServer(responder=lambda body: "no idea") as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        for args, counted in (
                (["judge", str(FIXTURE), str(summaries), "--criterion", "coverage"], r"\(1 of 1 judgment failed\)"),
                (["judge", str(FIXTURE), str(summaries), str(other), "--protocol", "pairwise"],
                 r"\(1 of 1 pairwise case failed\)"),
                (["bias", "position", str(FIXTURE), str(summaries), str(other), "--criterion", "coverage"],
                 r"\(1 of 1 case failed\)")):
            out = tmp_path / f"{args[0]}-{len(args)}.json"
            with pytest.raises(BooklensError, match=r"^the judge gave no verdict " + counted):
                invoke([*args, *lm, "-o", str(out)], tmp_path, monkeypatch)
            assert json.loads(out.read_text())["kind"].startswith("booklens.")

    # Verdicts among failures are a score (of what was judged), as before: the first judgment's
    # three tries get nothing usable, the other five a verdict.
    answers = iter(["no idea"] * 3)
    with FakeOpenAIServer(responder=lambda body: next(answers, json.dumps({"explanation": "yes", "rating": 1})))\
            as server:
        r = invoke(["judge", str(FIXTURE), str(summaries), "--criterion", "coverage", "--protocol", "binary",
                    "--concurrency", "1", "--lm", "openai/test-model", "--api-base", server.url], tmp_path,
                   monkeypatch)
    assert r.exit_code == 0 and "coverage binary = 1.00 (scale 0-1, 6 judgments, 1 failed)" in r.output



def test_verbosity_single_grading_keeps_each_failed_rating_with_its_error(tmp_path, monkeypatch):
    """Single-answer grading rates each version apart: a rating the judge never gave is kept in the
    record with its error, as a pairwise case is, and the one-line error quotes the first."""
    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"ev-0001": "The bridge closed for repairs."}))
    out = tmp_path / "verbosity.json"
    with FakeOpenAIServer(responder=lambda body: "no idea") as server:
        with pytest.raises(BooklensError, match=r"^the judge gave no verdict \(1 of 1 case failed\) \(first: "):
            invoke(["bias", "verbosity", str(FIXTURE), str(summaries), "--criterion", "coverage", "--protocol",
                    "single", "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)],
                   tmp_path, monkeypatch)
    part = json.loads(out.read_text())["coverage_single"]
    assert part["original"] == [None] and part["extended"] == [None]
    [case] = part["cases"]
    assert case["case"] == "ev-0001/all" and case["original"] is None and case["extended"] is None
    assert case["error"]

    # One version rated and the other not: the case failed, and the rating given is kept beside the error.
    def rates_the_original_only(body):
        if "\\n\\nThe bridge closed" in json.dumps(body):  # the repeated version
            return "no idea"
        return json.dumps({"explanation": "covers it", "rating": 7})

    with FakeOpenAIServer(responder=rates_the_original_only) as server:
        with pytest.raises(BooklensError, match=r"^the judge gave no verdict \(2 of 2 cases failed\) \(first: "):
            invoke(["bias", "verbosity", str(FIXTURE), str(summaries), "--criterion", "faithfulness", "--protocol",
                    "single", "--max-articles", "2", "--lm", "openai/test-model", "--api-base", server.url,
                    "-o", str(out)], tmp_path, monkeypatch)
    part = json.loads(out.read_text())["faithfulness_single"]
    assert [c["case"] for c in part["cases"]] == ["ev-0001/a01", "ev-0001/a02"]
    assert all(c["original"] == 7 and c["extended"] is None and c["error"] for c in part["cases"])
    assert part["result"]["failed"] == 2


def test_diverse_fails_when_its_judge_gave_no_verdict_on_a_protocol_and_keeps_the_record(tmp_path, monkeypatch):
    """`diverse` judges as `judge` does: a protocol on which every judgment failed has no score, so
    the command writes its record (summary and errors) and ends in one line, not with '-' and exit 0."""
    def summary_only(body):
        if not body.get("response_format"):  # the summary is asked for in plain text
            return "Sources disagree on the cause, the cost and the length of the closure."
        return "no idea"

    out = tmp_path / "d.json"
    with FakeOpenAIServer(responder=summary_only) as server:
        with pytest.raises(BooklensError, match=r"^the judge gave no verdict on coverage_binary, coverage_likert, "
                                                r"faithfulness_likert \(9 of 9 judgments failed\) \(first: "):
            invoke(["diverse", str(FIXTURE), "--method", "direct", "--max-articles", "2", "--lm", "openai/test-model",
                    "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
    record = json.loads(out.read_text())
    assert record["events"][0]["summary"].startswith("Sources disagree")
    assert record["events"][0]["scores"]["coverage_likert"] is None

def always_b(body):
    """Every output field any DiverseSumm step asks for; pairwise verdicts always 'B'."""
    if not body.get("response_format"):  # summaries are asked for in plain text
        return "Sources disagree on the cause, the cost and the length of the closure."
    return json.dumps({"summary": "Sources disagree on the cause, the cost and the length of the closure.",
                       "sentences": ["The bridge closed."], "questions": ["What caused the crack?"],
                       "answers": ["corrosion"], "groups": [[1], [2]], "invalid": [], "diverse": [1, 2],
                       "explanation": "because", "rating": 1, "verdict": "B"})


def test_diverse_judge_and_bias_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        r = invoke(["diverse", str(FIXTURE), *lm, "--faithfulness", "both", "--max-articles", "3",
                    "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        data = json.loads(out.read_text())
        row = data["events"][0]
        assert row["method"] == "direct" and row["summary"].startswith("Sources disagree")
        assert row["scores"] == {"coverage_binary": 1.0, "coverage_likert": 1.0, "faithfulness_binary": 1.0,
                                 "faithfulness_likert": 1.0}
        assert len(row["judgments"]["coverage_binary"]) == 6 and len(row["judgments"]["faithfulness_likert"]) == 3
        assert "coverage_likert: 1.00" in r.output

        r = invoke(["judge", str(FIXTURE), str(out), "--protocol", "likert", "--criterion", "coverage", *lm],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0 and "coverage likert = 1.00 (scale 1-10, 1 judgment)" in r.output

        other = tmp_path / "other.json"
        other.write_text(json.dumps({row["eid"]: "A different, longer summary of the closure."}))
        r = invoke(["judge", str(FIXTURE), str(out), str(other), "--protocol", "pairwise", *lm],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0 and "ties 1" in r.output

        pos = tmp_path / "pos.json"
        r = invoke(["bias", "position", str(FIXTURE), str(out), str(other), "--max-articles", "2", *lm,
                    "-o", str(pos)], tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        result = json.loads(pos.read_text())
        for crit in ("coverage", "faithfulness"):
            assert result[crit]["result"]["second_pct"] == 100.0
            assert result[crit]["result"]["consistency_pct"] == 0.0
        assert result["faithfulness"]["result"]["cases"] == 2 and result["coverage"]["result"]["cases"] == 1
        assert "100.00" in r.output

        verb = tmp_path / "verb.json"
        r = invoke(["bias", "verbosity", str(FIXTURE), str(out), "--criterion", "coverage", *lm, "-o", str(verb)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        v = json.loads(verb.read_text())
        assert v["coverage_single"]["result"]["tie_pct"] == 100.0  # the same rating for both versions
        assert v["coverage_pairwise"]["result"]["tie_pct"] == 100.0  # B both ways: cancels out
        r = invoke(["bias", "position", str(FIXTURE), str(out), str(other), "--criterion", "coverage", "--per-qa",
                    *lm, "-o", str(pos)], tmp_path, monkeypatch)
        assert r.exit_code == 0 and json.loads(pos.read_text())["coverage"]["result"]["cases"] == 6

        extended = [b for b in server.served if "\\n\\nSources disagree" in json.dumps(b)]
        assert extended  # the judge saw the summary repeated


def test_diverse_says_which_articles_no_sentence_was_picked_from(tmp_path, monkeypatch):
    def responder(body):
        last = str(body["messages"][-1]["content"])
        if "[[ ## title ## ]]" in last:  # picking sentences: never a valid number for article a01
            return json.dumps({"picks": [0] if "[a01]" in last else [1, 2]})
        return always_b(body)

    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=responder) as server:
        r = invoke(["diverse", str(FIXTURE), "--method", "extract", "--sentences", "2", "--no-judge",
                    "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["events"][0]["extract_errors"][0].startswith("[a01]")
    assert "(no sentence picked from 1 of 10 articles, shown as '(none)'; first: [a01]" in r.output


def test_diverse_says_which_article_was_too_long_to_offer_whole(tmp_path, monkeypatch):
    event = json.loads(FIXTURE.read_text())[0]
    event["articles"][3]["content"] = " ".join(f"The council met for the {i}th time." for i in range(1, 3000))
    events = tmp_path / "events.json"
    events.write_text(json.dumps([event]))

    def responder(body):
        if "[[ ## title ## ]]" in str(body["messages"][-1]["content"]):
            return json.dumps({"picks": [1, 2]})
        return always_b(body)

    with FakeOpenAIServer(responder=responder) as server:
        r = invoke(["diverse", str(events), "--method", "extract", "--sentences", "2", "--no-judge",
                    "--context-window", "8192", "--lm", "openai/test-model", "--api-base", server.url],
                   tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert "(1 article too long to offer whole: [a04] " in r.output and "of 2999 sentences" in r.output


def test_diverse_says_why_an_event_without_references_has_no_coverage(tmp_path, monkeypatch):
    """An event without question_answers (and none generated) cannot be judged for coverage: the
    record and the output say so, rather than the coverage scores being silently absent."""
    event = json.loads(FIXTURE.read_text())[0]
    event["question_answers"] = []
    events = tmp_path / "events.json"
    events.write_text(json.dumps([event]))
    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=always_b) as server:
        r = invoke(["diverse", str(events), "--lm", "openai/test-model", "--api-base", server.url,
                    "--max-articles", "2", "-o", str(out)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["events"][0]
    assert "coverage_binary" not in row["scores"] and "faithfulness_likert" in row["scores"]
    assert row["coverage_not_judged"].startswith("no reference question_answers")
    assert "coverage: not judged (no reference question_answers" in r.output


def test_the_records_say_what_was_judged_and_how(tmp_path):
    """`judge` printed 's1.json wins 0, s2.json wins 3' while its record said only wins_1 and wins_2,
    with no word of which file was 1; no record of `diverse`, `judge` or `bias` held the settings
    that shape its figures (sentences per article, the faithfulness protocols, --max-articles,
    --per-qa), so two records made with different settings read alike."""
    from booklens.data.diversesumm import load_events
    from booklens.diverse_runs import position_bias_study, run_diverse, verbosity_bias_study
    from booklens.testing import ScriptedLM

    def answer(call):
        if call.wants("verdict"):
            return {"explanation": "B reads better", "verdict": "B"}
        if call.wants("rating"):
            return {"explanation": "fine", "rating": 1}
        if call.wants("picks"):
            return {"picks": [1, 2]}
        return {"summary": "Sources disagree about the closure."}

    lm = ScriptedLM(answer, cache_dir=tmp_path / "cache")
    eid = load_events(FIXTURE)[0].eid
    first, second = tmp_path / "s1.json", tmp_path / "s2.json"
    first.write_text(json.dumps({eid: "The bridge closed for repairs."}))
    second.write_text(json.dumps({eid: "Sources disagree about why the bridge closed."}))

    diverse = run_diverse(FIXTURE, method="extract", sentences=2, faithfulness="both", max_articles=3, lm=lm)
    settings = ("method", "sentences", "generate_questions", "answer_clustering", "diversity_filter", "judge",
                "faithfulness", "max_articles", "context_window")
    assert {key: diverse[key] for key in settings} == {
        "method": "extract", "sentences": 2, "generate_questions": 0, "answer_clustering": None,
        "diversity_filter": None, "judge": True, "faithfulness": ["binary", "likert"], "max_articles": 3,
        "context_window": None}
    direct = run_diverse(FIXTURE, method="direct", judge=False, lm=lm)  # the default protocol, but no judging
    assert (direct["sentences"], direct["faithfulness"], direct["judge"]) == (None, [], False)

    judged = judge_summaries(FIXTURE, first, second, protocol="pairwise", criterion="faithfulness", max_articles=2,
                             lm=lm)
    assert (judged["events_file"], judged["summaries"]) == (str(FIXTURE), [str(first), str(second)])
    assert (judged["max_articles"], judged["per_qa"]) == (2, False)
    assert judged["events"][0]["wins_2"] == 0 and judged["events"][0]["ties"] == 2  # B both ways: no winner
    rated = judge_summaries(FIXTURE, first, protocol="likert", lm=lm)
    assert (rated["summaries"], rated["max_articles"], rated["per_qa"]) == ([str(first)], None, False)

    position = position_bias_study(FIXTURE, first, second, criterion="coverage", per_qa=True, lm=lm)
    assert (position["events_file"], position["summaries"], position["criterion"], position["per_qa"],
            position["max_articles"]) == (str(FIXTURE), [str(first), str(second)], "coverage", True, None)
    verbosity = verbosity_bias_study(FIXTURE, first, criterion="faithfulness", protocols=["single"], max_articles=1,
                                     lm=lm)
    assert (verbosity["events_file"], verbosity["summaries"], verbosity["criterion"], verbosity["protocols"],
            verbosity["max_articles"], verbosity["per_qa"]) == (str(FIXTURE), [str(first)], "faithfulness",
                                                                ["single"], 1, False)


def _one_with_and_one_without_references(tmp_path):
    """The fixture event (its own six QA pairs) and a second event without references whose
    articles differ, so that none of its prompts is answered from the first's cache."""
    own = json.loads(FIXTURE.read_text())[0]
    bare = json.loads(json.dumps(own))
    bare["eid"] = "ev-0002"
    bare["question_answers"] = []
    for article in bare["articles"]:
        article["content"] = "A later report. " + article["content"]
    events = tmp_path / "events.json"
    events.write_text(json.dumps([own, bare]))
    return events


def _reference_requests(server):
    """The requests that build references and read an article's text: question generation (which
    names how many to write) and answer extraction (one article and one question)."""
    prompts = [str(body["messages"][-1]["content"]) for body in server.served]
    return ([p for p in prompts if "[[ ## num_questions ## ]]" in p],
            [p for p in prompts if "[[ ## article ## ]]" in p and "[[ ## question ## ]]" in p])


def test_generated_references_are_built_only_for_events_without_their_own(tmp_path, monkeypatch):
    """`--generate-questions` built references (questions, an answer per article, clusters, the
    filter) for an event with its own question_answers too, then judged its coverage against its own
    ones: the calls were spent on references nothing used, and neither the record nor the output said
    which references coverage was judged against."""
    events = _one_with_and_one_without_references(tmp_path)
    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=always_b) as server:
        r = invoke(["diverse", str(events), "--generate-questions", "1", "--max-articles", "2", "--concurrency", "1",
                    "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    generate, extract = _reference_requests(server)
    # for the event without references only: one question, its answer in each of the ten articles
    assert len(generate) == 1 and "A later report." in generate[0]
    assert len(extract) == 10 and all("A later report." in p for p in extract)
    own, generated = json.loads(out.read_text())["events"]
    assert own["references"] == "own" and "generated_question_answers" not in own
    assert len(own["judgments"]["coverage_binary"]) == 6
    assert generated["references"] == "generated" and generated["reference_qa_pairs"] == 1
    assert generated["generated_question_answers"][0]["question"] == "What caused the crack?"
    assert generated["reference_screening"][0]["kept"] and generated["reference_screening"][0]["diverse_clusters"] == 2
    assert len(generated["judgments"]["coverage_binary"]) == 1
    assert "references: the event's own (6 questions); none generated" in r.output
    assert "references: generated questions (1 of 1 kept):\n  - What caused the crack? (10 articles, " in r.output


def test_generate_questions_is_refused_when_every_event_has_its_own_references(tmp_path, monkeypatch):
    with pytest.raises(BooklensError, match="only for events without question_answers, and every event has its own"):
        invoke(["diverse", str(FIXTURE), "--generate-questions", "2", "--lm", "openai/fake",
                "--api-base", "http://127.0.0.1:9/v1"], tmp_path, monkeypatch)


def _summaries_of_both(tmp_path):
    """Two summaries files of both events of `_one_with_and_one_without_references`."""
    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"ev-0001": "The bridge closed for repairs.", "ev-0002": "It reopened."}))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"ev-0001": "Sources disagree.", "ev-0002": "Sources disagree again."}))
    return summaries, other


def test_judge_coverage_judges_the_events_with_references_and_says_which_it_skipped(tmp_path, monkeypatch):
    """`judge --criterion coverage` refused the whole file when one event had no question_answers,
    while `diverse` judges the others and says why that one has no coverage score: now `judge` does
    the same, and refuses (before any call) only when no event can be judged."""
    events = _one_with_and_one_without_references(tmp_path)
    summaries, other = _summaries_of_both(tmp_path)
    out = tmp_path / "judge.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        r = invoke(["judge", str(events), str(summaries), "--protocol", "likert", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        assert len(server.served) == 1  # one Likert rating, of the event with references
        record = json.loads(out.read_text())
        assert [row["eid"] for row in record["events"]] == ["ev-0001"]
        assert record["not_judged"] == [{"eid": "ev-0002", "reason": "no question_answers to judge coverage against"}]
        assert "ev-0001: coverage likert = 1.00" in r.output
        assert "ev-0002: not judged (no question_answers to judge coverage against)" in r.output

        r = invoke(["judge", str(events), str(summaries), str(other), "--protocol", "pairwise", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        assert [row["eid"] for row in json.loads(out.read_text())["events"]] == ["ev-0001"]
        assert "ev-0002: not judged (no question_answers" in r.output

        # faithfulness needs no references: every event is judged
        r = invoke(["judge", str(events), str(summaries), "--criterion", "faithfulness", "--max-articles", "1", *lm,
                    "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0 and len(json.loads(out.read_text())["events"]) == 2
        assert json.loads(out.read_text())["not_judged"] == []

    bare = json.loads(events.read_text())[1:]
    bare_events = tmp_path / "bare.json"
    bare_events.write_text(json.dumps(bare))
    with pytest.raises(BooklensError, match=r"^no event has question_answers to judge coverage against"):
        invoke(["judge", str(bare_events), str(summaries), "--lm", "openai/fake", "--api-base",
                "http://127.0.0.1:9/v1"], tmp_path, monkeypatch)


def test_the_bias_studies_judge_coverage_on_the_events_with_references_and_say_which_they_skipped(
        tmp_path, monkeypatch):
    """The bias studies refused the whole file for one event without question_answers, even with
    `--criterion both`, whose faithfulness half needs none: they now judge coverage on the events
    that have references and name the others, as `judge` and `diverse` do."""
    events = _one_with_and_one_without_references(tmp_path)
    summaries, other = _summaries_of_both(tmp_path)
    out = tmp_path / "bias.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        r = invoke(["bias", "position", str(events), str(summaries), str(other), "--max-articles", "1", *lm,
                    "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        record = json.loads(out.read_text())
        assert record["coverage"]["result"]["cases"] == 1 and record["faithfulness"]["result"]["cases"] == 2
        assert record["not_judged"] == [{"eid": "ev-0002", "criterion": "coverage",
                                         "reason": "no question_answers to judge coverage against"}]
        assert "ev-0002: coverage not judged (no question_answers to judge coverage against)" in r.output

        r = invoke(["bias", "verbosity", str(events), str(summaries), "--criterion", "coverage", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        record = json.loads(out.read_text())
        assert [c["case"] for c in record["coverage_single"]["cases"]] == ["ev-0001/all"]
        assert record["coverage_pairwise"]["result"]["cases"] == 1 and record["not_judged"][0]["eid"] == "ev-0002"
        assert "ev-0002: coverage not judged" in r.output

        # faithfulness alone needs no references: nothing is skipped
        r = invoke(["bias", "verbosity", str(events), str(summaries), "--criterion", "faithfulness", "--max-articles",
                    "1", *lm, "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0 and json.loads(out.read_text())["not_judged"] == []


def test_diverse_says_when_question_generation_failed_rather_than_that_nothing_was_kept(tmp_path, monkeypatch):
    """When no valid questions came back, the output read 'generated questions (0 of 0 kept):' and
    'none of the generated questions was kept', with the reason (reference_error) nowhere shown."""
    event = json.loads(FIXTURE.read_text())[0]
    event["question_answers"] = []
    events = tmp_path / "events.json"
    events.write_text(json.dumps([event]))

    def no_questions(body):
        if "[[ ## num_questions ## ]]" in str(body["messages"][-1]["content"]):
            return "no idea"
        return always_b(body)

    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=no_questions) as server:
        r = invoke(["diverse", str(events), "--generate-questions", "2", "--max-articles", "2",
                    "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    row = json.loads(out.read_text())["events"][0]
    assert row["reference_error"] and row["references"] is None
    assert row["coverage_not_judged"] == f"no reference question_answers, and no questions were generated " \
                                         f"({row['reference_error']})"
    assert f"references: none generated ({row['reference_error']})" in r.output
    assert "0 of 0 kept" not in r.output


def test_judge_and_bias_judge_the_other_events_when_a_diverse_run_left_one_without_a_summary(tmp_path, monkeypatch):
    """A `diverse` record in which one event got no summary (too large for the window, say) was
    refused whole by `judge` and `bias`, so one event of many cost the rest their judgments: the
    others are judged, and the one without a summary is named with the reason it failed."""
    own = json.loads(FIXTURE.read_text())[0]
    second = json.loads(json.dumps(own))
    second["eid"] = "ev-0002"
    events = tmp_path / "events.json"
    events.write_text(json.dumps([own, second]))
    failure = "the articles do not fit the context window (8192 tokens) for direct summarization; use --method extract"
    diverse = tmp_path / "d.json"
    diverse.write_text(json.dumps({"kind": "booklens.diverse", "events": [
        {"eid": "ev-0001", "summary": "Sources disagree.", "error": None},
        {"eid": "ev-0002", "summary": None, "error": failure}]}))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"ev-0001": "The bridge closed.", "ev-0002": "It reopened."}))
    reason = f"its summary in {diverse} failed: {failure}"
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        r = invoke(["judge", str(events), str(diverse), "--protocol", "likert", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        assert len(server.served) == 1
        record = json.loads(out.read_text())
        assert [row["eid"] for row in record["events"]] == ["ev-0001"]
        assert record["not_judged"] == [{"eid": "ev-0002", "reason": reason}]
        assert f"ev-0002: not judged ({reason})" in r.output

        r = invoke(["bias", "position", str(events), str(other), str(diverse), "--max-articles", "1", *lm,
                    "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        record = json.loads(out.read_text())
        assert record["coverage"]["result"]["cases"] == 1 and record["faithfulness"]["result"]["cases"] == 1
        assert record["not_judged"] == [{"eid": "ev-0002", "criterion": "coverage", "reason": reason},
                                        {"eid": "ev-0002", "criterion": "faithfulness", "reason": reason}]
        assert f"ev-0002: faithfulness not judged ({reason})" in r.output

    failed_only = tmp_path / "failed.json"
    failed_only.write_text(json.dumps({"kind": "booklens.diverse", "events": [
        {"eid": e, "summary": None, "error": failure} for e in ("ev-0001", "ev-0002")]}))
    with pytest.raises(BooklensError, match=r"^no event has a summary to judge \(first: its summary in "):
        invoke(["bias", "verbosity", str(events), str(failed_only), "--lm", "openai/fake", "--api-base",
                "http://127.0.0.1:9/v1"], tmp_path, monkeypatch)


def test_a_bias_figure_the_judge_gave_no_verdict_on_fails_the_study_as_a_diverse_protocol_does(tmp_path, monkeypatch):
    """`bias position --criterion both` whose coverage cases all failed (say, references too long for
    the judge's window) printed a coverage row of '-' and exited 0, because the faithfulness cases
    had verdicts; `diverse` counts each of its protocols apart, and so does `bias` now: every figure
    is a measurement of its own, and one that measured nothing is a failure, the record kept."""
    from booklens.steps import judged_nothing

    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"ev-0001": "The bridge closed for repairs."}))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"ev-0001": "Sources disagree about the closure."}))

    def coverage_unanswered(body):
        if "Question:" in str(body["messages"][-1]["content"]):  # a coverage case: the reference QA pairs
            return "no idea"
        return always_b(body)

    out = tmp_path / "pos.json"
    with FakeOpenAIServer(responder=coverage_unanswered) as server:
        with pytest.raises(BooklensError, match=r"^the judge gave no verdict on coverage \(1 of 1 case failed\) "
                                                r"\(first: "):
            invoke(["bias", "position", str(FIXTURE), str(summaries), str(other), "--max-articles", "2",
                    "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
    record = json.loads(out.read_text())
    assert record["coverage"]["result"]["failed"] == 1 and record["faithfulness"]["result"]["cases"] == 2

    verbosity = {"kind": "booklens.bias.verbosity",
                 "coverage_single": {"result": {"failed": 0, "cases": 1}, "cases": [{"error": None}]},
                 "coverage_pairwise": {"result": {"failed": 1, "cases": 0}, "cases": [{"error": "late"}]}}
    assert judged_nothing(verbosity) == "the judge gave no verdict on coverage_pairwise (1 of 1 case failed) " \
                                        "(first: late)"


def test_judge_pairwise_tells_two_summaries_files_of_the_same_name_apart(tmp_path, monkeypatch):
    """Two systems' `diverse -o .../diverse.json` records compared pairwise printed 'diverse.json
    wins 3, diverse.json wins 1': which is which was nowhere on the line."""
    for system, summary in (("one", "The bridge closed for repairs."), ("two", "Sources disagree.")):
        (tmp_path / system).mkdir()
        (tmp_path / system / "diverse.json").write_text(json.dumps({"ev-0001": summary}))
    first, second = str(tmp_path / "one" / "diverse.json"), str(tmp_path / "two" / "diverse.json")
    with FakeOpenAIServer(responder=always_b) as server:
        r = invoke(["judge", str(FIXTURE), first, second, "--protocol", "pairwise", "--lm", "openai/test-model",
                    "--api-base", server.url], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    assert f"{first} wins 0, {second} wins 0, ties 1" in r.output


def _a_record_with_generated_references(tmp_path, monkeypatch, lm):
    """Events (one with references, one without), the `diverse --generate-questions 1` record of
    them and a plain summaries file of both."""
    events = _one_with_and_one_without_references(tmp_path)
    record_path = tmp_path / "d.json"
    _, plain = _summaries_of_both(tmp_path)
    r = invoke(["diverse", str(events), "--generate-questions", "1", "--no-judge", *lm, "-o", str(record_path)],
               tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    return events, record_path, plain


def test_judge_coverage_uses_the_references_a_diverse_record_generated(tmp_path, monkeypatch):
    """A `diverse --generate-questions` record holds the references it built for an event without its
    own; given as summaries, `judge --criterion coverage` skipped that event as having none. It now
    judges it against them, and its output and record say so."""
    out = tmp_path / "judge.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        events, record_path, plain = _a_record_with_generated_references(tmp_path, monkeypatch, lm)
        generated = json.loads(record_path.read_text())["events"][1]
        assert generated["references"] == "generated" and generated["reference_qa_pairs"] == 1
        served = len(server.served)

        r = invoke(["judge", str(events), str(record_path), "--protocol", "likert", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        asked = server.served[served:]
        assert len(asked) == 2  # one Likert rating per event: the second against its generated question
        assert "What caused the crack?" in asked[1]["messages"][-1]["content"]
        record = json.loads(out.read_text())
        assert [row["eid"] for row in record["events"]] == ["ev-0001", "ev-0002"] and record["not_judged"] == []
        assert [row["references"] for row in record["events"]] == ["own", "generated"]
        assert record["generated_references"] == {"ev-0002": {"file": str(record_path), "questions": 1}}
        assert f"ev-0002: coverage likert = 1.00 (scale 1-10, 1 judgment; against 1 question {record_path} " \
               "generated)" in r.output

        # pairwise: the record may be either file
        served = len(server.served)
        r = invoke(["judge", str(events), str(plain), str(record_path), "--protocol", "pairwise", *lm,
                    "-o", str(out)], tmp_path, monkeypatch)
        assert r.exit_code == 0, r.output
        assert len(server.served) - served == 4  # both events, in both orders
        record = json.loads(out.read_text())
        assert [row["eid"] for row in record["events"]] == ["ev-0001", "ev-0002"] and record["not_judged"] == []
        assert record["generated_references"] == {"ev-0002": {"file": str(record_path), "questions": 1}}


def test_the_bias_studies_use_the_references_a_diverse_record_generated(tmp_path, monkeypatch):
    """As `judge` does: coverage of an event without its own references is judged against those a
    `diverse` record among the summaries files generated for it, and the record says so."""
    out = tmp_path / "bias.json"
    with FakeOpenAIServer(responder=always_b) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url]
        events, record_path, plain = _a_record_with_generated_references(tmp_path, monkeypatch, lm)
        for args in (["position", str(plain), str(record_path)], ["verbosity", str(record_path)]):
            served = len(server.served)
            r = invoke(["bias", args[0], str(events), *args[1:], "--criterion", "coverage", *lm, "-o", str(out)],
                       tmp_path, monkeypatch)
            assert r.exit_code == 0, r.output
            record = json.loads(out.read_text())
            assert record["not_judged"] == []
            assert record["generated_references"] == {"ev-0002": {"file": str(record_path), "questions": 1}}
            assert any("What caused the crack?" in body["messages"][-1]["content"]
                       for body in server.served[served:])
            assert f"ev-0002: coverage judged against 1 question {record_path} generated" in r.output


def test_references_a_diverse_record_generated_for_other_events_are_refused_in_one_line(tmp_path):
    events = _one_with_and_one_without_references(tmp_path)
    record = tmp_path / "d.json"
    refs = [{"question": "What caused the crack?", "answer_groups": [[{"aid": "a99", "answer": "corrosion"}]]}]
    record.write_text(json.dumps({"kind": "booklens.diverse", "events": [
        {"eid": "ev-0001", "summary": "Sources disagree.", "references": "own"},
        {"eid": "ev-0002", "summary": "Sources disagree again.", "references": "generated",
         "generated_question_answers": refs}]}))
    with pytest.raises(BooklensError, match=r"^.*d\.json: the references generated for event 'ev-0002' cite article "
                                            r"'a99', which that event of the events file does not have"):
        judge_summaries(events, record, lm="openai/fake", api_base="http://127.0.0.1:9/v1")
    refs[0]["answer_groups"] = []
    record.write_text(record.read_text().replace('"answer_groups": [[{"aid": "a99", "answer": "corrosion"}]]',
                                                 '"answer_groups": []'))
    with pytest.raises(BooklensError, match="the references generated for event 'ev-0002': .*answer groups"):
        judge_summaries(events, record, lm="openai/fake", api_base="http://127.0.0.1:9/v1")


def test_diverse_builds_no_references_for_an_event_whose_summary_failed_and_says_so(tmp_path, monkeypatch):
    """An event whose summary failed has nothing for references to judge: the questions were built
    for it all the same, calls spent on nothing. Now none are, and the output says why."""
    big = json.loads(FIXTURE.read_text())[0]
    big["question_answers"] = []
    for article in big["articles"]:  # too large for direct summarization in 4,096 tokens
        article["content"] = "\n\n".join([article["content"]] * 4)
    small = {"eid": "ev-small", "question_answers": [],
             "articles": [{"aid": f"a{i}", "title": f"T{i}", "url": "", "domain": "x.org",
                           "content": f"Article {i} says the toll is {i} dollars."} for i in range(2)]}
    events = tmp_path / "events.json"
    events.write_text(json.dumps([big, small]))
    out = tmp_path / "diverse.json"
    with FakeOpenAIServer(responder=always_b) as server:
        r = invoke(["diverse", str(events), "--method", "direct", "--context-window", "4096", "--generate-questions",
                    "2", "--lm", "openai/test-model", "--api-base", server.url, "-o", str(out)], tmp_path, monkeypatch)
        asked = [body for body in server.served if "[[ ## num_questions ## ]]" in str(body["messages"][-1]["content"])]
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["events"]
    assert rows[0]["summary"] is None and rows[0]["references"] is None
    assert len(asked) == 1 and "ev-small" not in str(asked) and "toll is 1 dollars" in str(asked[0])
    assert "references: none generated (the event has no summary to judge against them)" in r.output


@pytest.mark.parametrize("run, args, options, message", [
    ("run_diverse", ["EVENTS_LIST"], {}, "the events file must be a path, not a list (summarize_events takes loaded "
                                         "events)"),
    ("run_diverse", [5], {}, "the events file must be a path, not 5"),
    ("run_diverse", ["EVENTS"], {"sentences": "3"}, "sentences must be at least 1 (got '3')"),
    ("run_diverse", ["EVENTS"], {"sentences": 2.5, "method": "extract"}, "sentences must be at least 1 (got 2.5)"),
    ("run_diverse", ["EVENTS"], {"context_window": "8192"}, "context_window must be at least 256 (got '8192')"),
    ("run_diverse", ["EVENTS"], {"judge": "no"}, "judge must be True or False, not 'no'"),
    ("run_diverse", ["EVENTS"], {"diversity_filter": "no"}, "diversity_filter must be True or False, not 'no'"),
    ("run_diverse", ["EVENTS"], {"faithfulness": ["likert"]},
     "unknown faithfulness choice ['likert']: use binary, likert, both, none"),
    ("judge_summaries", ["EVENTS", {"ev-0001": "A summary."}], {},
     "the summaries file must be a path, not {'ev-0001': 'A summary.'}"),
    ("judge_summaries", ["EVENTS_LIST", "SUMMARIES"], {}, "the events file must be a path, not a list"),
    ("judge_summaries", ["EVENTS", "SUMMARIES", ["x"]], {"protocol": "pairwise"},
     "the second summaries file must be a path, not ['x']"),
    ("position_bias_study", ["EVENTS", "SUMMARIES", 3], {}, "the second summaries file must be a path, not 3"),
    ("verbosity_bias_study", ["EVENTS", None], {}, "the summaries file must be a path, not None"),
    ("verbosity_bias_study", ["EVENTS", "SUMMARIES"], {"protocols": "single"},
     "protocols must be a list of verbosity protocols (single, pairwise), not one string"),
    ("verbosity_bias_study", ["EVENTS", "SUMMARIES"], {"protocols": None},
     "protocols must be a list of verbosity protocols (single, pairwise), not NoneType"),
    ("verbosity_bias_study", ["EVENTS", "SUMMARIES"], {"protocols": []},
     "protocols is empty: give single, pairwise or both"),
])
def test_the_library_runs_refuse_wrong_types_in_one_line_before_any_call(run, args, options, message, tmp_path):
    """What README names as the library's entry points, given a value of the wrong type (the loaded
    events instead of their file, a count as text, one protocol as a string): one line naming it, before
    any call, not a TypeError from deep inside or a run with the value misread ('no' taken as true)."""
    import booklens.diverse_runs as runs

    summaries = tmp_path / "s.json"
    summaries.write_text(json.dumps({"ev-0001": "A summary."}))
    given = {"EVENTS": FIXTURE, "EVENTS_LIST": json.loads(FIXTURE.read_text()), "SUMMARIES": summaries}
    args = [given.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(BooklensError) as caught:
        getattr(runs, run)(*args, **options, lm="openai/fake", api_base="http://127.0.0.1:9/v1")
    assert str(caught.value) == message


def _two_events(tmp_path):
    """Two events, one with three reference questions and one with one, and two systems' summaries."""
    def event(eid, questions):
        return {"eid": eid, "articles": [{"aid": f"a{i}", "title": f"T{i}", "content": f"Article {i} of {eid} says the "
                                                                                      f"toll is {i} dollars."}
                                         for i in range(2)],
                "question_answers": [{"question": q, "answer_groups": [[{"aid": "a0", "answer": "one"}],
                                                                      [{"aid": "a1", "answer": "two"}]]}
                                     for q in questions]}

    events = tmp_path / "events.json"
    events.write_text(json.dumps([event("e1", ["Q1 why?", "Q2 how much?", "Q3 when?"]), event("e2", ["Q4 who?"])]))
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"e1": "ONE says e1 differs.", "e2": "ONE says e2 differs."}))
    second.write_text(json.dumps({"e1": "TWO says e1 differs.", "e2": "TWO says e2 differs."}))
    return events, first, second


def covers_q1_and_q3(body):
    """Binary coverage: Q1 and Q3 covered, Q2 and Q4 not; pairwise: the summary shown second wins,
    except on e1, where ONE wins in both orders."""
    text = body["messages"][-1]["content"]
    if "summary_a" in text:
        one_first = text.index("ONE") < text.index("TWO")
        verdict = ("A" if one_first else "B") if "e1 differs" in text else "B"
        return json.dumps({"explanation": "e", "verdict": verdict})
    return json.dumps({"explanation": "e", "rating": 1 if ("Q1" in text or "Q3" in text) else 0})


def test_judge_gives_the_figure_over_all_events_averaged_per_judgment(tmp_path, monkeypatch):
    """`judge` gave each event's score and no figure for the system: averaging the events' scores
    (0.67 and 0.00 here: 0.33) is not the seed's coverage, which averages over every reference QA pair
    (2 of 4 covered: 0.50). The record's `overall` and the last line give that figure; pairwise, the
    wins and ties over every case."""
    events, first, second = _two_events(tmp_path)
    out = tmp_path / "judge.json"
    with FakeOpenAIServer(responder=covers_q1_and_q3) as server:
        lm = ["--lm", "openai/test-model", "--api-base", server.url, "--concurrency", "1"]
        r = invoke(["judge", str(events), str(first), "--protocol", "binary", *lm, "-o", str(out)], tmp_path,
                   monkeypatch)
        record = json.loads(out.read_text())
        assert [row["score"] for row in record["events"]] == [0.6667, 0.0]
        assert record["overall"] == {"score": 0.5, "judgments": 4, "failed": 0, "events": 2}
        assert "overall: coverage binary = 0.50 (scale 0-1, 4 judgments over 2 events)" in r.output.splitlines()
        r = invoke(["judge", str(events), str(first), str(second), "--protocol", "pairwise", *lm, "-o", str(out)],
                   tmp_path, monkeypatch)
    record = json.loads(out.read_text())
    assert record["overall"] == {"cases": 2, "wins_1": 1, "wins_2": 0, "ties": 1, "failed": 0, "events": 2}
    assert ("overall: coverage pairwise (both orders) over 2 cases in 2 events: first.json wins 1, second.json wins 0, "
            "ties 1") in r.output.splitlines()


def test_diverse_gives_each_figure_over_all_events_averaged_per_judgment(tmp_path, monkeypatch):
    """As `judge` does, per protocol; an event without references counts in no coverage figure."""
    events, _, _ = _two_events(tmp_path)
    given = json.loads(events.read_text())
    events.write_text(json.dumps([*given, {**given[1], "eid": "e3", "question_answers": []}]))
    out = tmp_path / "diverse.json"

    def answers(body):
        if not body.get("response_format"):  # the summary, in plain text
            return "Sources differ on the toll."
        text = body["messages"][-1]["content"]
        if "questions_and_answers" in text:
            return json.dumps({"explanation": "e", "rating": 8 if "Q1" in text else 2})
        return covers_q1_and_q3(body)

    with FakeOpenAIServer(responder=answers) as server:
        r = invoke(["diverse", str(events), "--faithfulness", "none", "--lm", "openai/test-model", "--api-base",
                    server.url, "--concurrency", "1", "-o", str(out)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    overall = json.loads(out.read_text())["overall"]
    assert overall == {"coverage_binary": {"score": 0.5, "judgments": 4, "failed": 0, "events": 2},
                       "coverage_likert": {"score": 5.0, "judgments": 2, "failed": 0, "events": 2}}
    assert "overall: coverage_binary: 0.50 (scale 0-1, 4 judgments over 2 events)" in r.output.splitlines()
    assert "overall: coverage_likert: 5.00 (scale 1-10, 2 judgments over 2 events)" in r.output.splitlines()
