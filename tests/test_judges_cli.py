"""The judges on the command line: the default few-shot judges with no options, --zero-shot, --binary,
`booklens calibrate` storing figures that every later score shows, and `booklens judges`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from booklens.testing import FakeOpenAIServer, run_command

REPO = Path(__file__).resolve().parents[1]
SUMMARY = "Mara keeps the lighthouse on Gull Rock. One winter night Zed appears at the door."


def invoke(args, tmp_path):
    from typer.testing import CliRunner

    from booklens.cli import app

    os.environ["BOOKLENS_CACHE_DIR"] = str(tmp_path / "cache")
    return CliRunner().invoke(app, [str(a) for a in args])


def answer(body: dict) -> str:
    """An OpenAI-compatible server's answers: confusion on sentences naming Zed, claims, verdicts."""
    user = body["messages"][-1]["content"]
    if "[[ ## sentence ## ]]" in user:
        sentence = user.split("[[ ## sentence ## ]]", 1)[1].strip().split("\n\n")[0]
        if "Zed" in sentence:
            return json.dumps({"verdict": "confusion", "questions": ["Who is Zed?"],
                               "error_types": ["entity omission"]})
        return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})
    if "[[ ## claim ## ]]" in user:
        claim = user.split("[[ ## claim ## ]]", 1)[1].strip().split("\n\n")[0]
        label = "unfaithful" if "Zed" in claim else "faithful"
        return json.dumps({"label": label, "reason": "Passage 1 says so.", "supporting_passages": [1],
                           "refuting_passages": []})
    return json.dumps({"claims": ["Mara keeps the lighthouse.", "Zed appears at the door."]})


def test_score_judges_with_the_default_few_shot_program_and_prints_its_judge(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["score", summary, "--lm", "openai/fake", "--api-base", server.url, "-o", out], tmp_path)
        first_prompt = server.served[0]["messages"]
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    judge = record["judge"]
    assert judge["program"] == "default" and judge["demos"] >= 20 and judge["mode"] == "per-sentence"
    assert judge["calibration"] is None and "never measured" in judge["warning"]
    assert len(first_prompt) == 1 + 2 * judge["demos"] + 1  # system, the demo turns, the summary and sentence
    assert "judge: default few-shot coherence program (per-sentence" in result.output
    assert "warning: no calibration" in result.output

    zero = tmp_path / "zero.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["score", summary, "--zero-shot", "--lm", "openai/fake", "--api-base", server.url,
                         "-o", zero], tmp_path)
        assert all(len(body["messages"]) == 2 for body in server.served)
    assert result.exit_code == 0, result.output
    judge = json.loads(zero.read_text())["judge"]
    assert judge["program"] == "zero-shot" and judge["demos"] == 0
    assert json.loads(zero.read_text())["score"] == record["score"] == 0.5


def test_calibrate_stores_figures_that_later_scores_show(tmp_path, shared_dir):
    human = shared_dir / "data" / "booookscore" / "human"
    cache = tmp_path / "cache"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", "coherence", "--books", "1", "--coherence-data", human,
                         "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache], tmp_path)
        assert result.exit_code == 0, result.output
        store = json.loads((cache / "calibration.json").read_text())["calibrations"]
        (entry,) = store.values()
        assert entry["lm"] == "openai/fake" and entry["program"] == "default" and entry["n"]["summaries"] == 2
        assert entry["figures"]["kappa"]["n"] == entry["n"]["compared"] > 0
        assert "agreement with humans on BooookScore's test split (2 summaries of 1 book)" in result.output
        calls = entry["usage"]["calls"]
        assert f"coherence: {calls} LM calls (0 from cache)" in result.output
        served = len(server.served)
        again = invoke(["calibrate", "--judge", "coherence", "--books", "1", "--coherence-data", human,
                        "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache], tmp_path)
        assert again.exit_code == 0 and len(server.served) == served  # every call from the cache
        assert f"coherence: {calls} LM calls ({calls} from cache)" in again.output
        assert json.loads((cache / "calibration.json").read_text())["calibrations"] == store  # the same entry

        summary = tmp_path / "summary.txt"
        summary.write_text(SUMMARY)
        out = tmp_path / "out.json"
        result = invoke(["score", summary, "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache,
                         "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    judge = json.loads(out.read_text())["judge"]
    assert judge["calibration"]["key"] == entry["key"]
    assert judge["calibration"]["figures"]["kappa"] == entry["figures"]["kappa"]
    assert '"confusing" F1' in result.output and "kappa" in result.output


def test_a_calibration_belongs_to_the_server_it_was_measured_at(tmp_path, shared_dir):
    # A self-hosted server answers to any model name, so "openai/fake" at two URLs may be two models.
    human = shared_dir / "data" / "booookscore" / "human"
    cache = tmp_path / "cache"
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    with FakeOpenAIServer(responder=answer) as measured, FakeOpenAIServer(responder=answer) as other:
        result = invoke(["calibrate", "--judge", "coherence", "--books", "1", "--coherence-data", human,
                         "--lm", "openai/fake", "--api-base", measured.url, "--cache-dir", cache], tmp_path)
        assert result.exit_code == 0, result.output
        (entry,) = json.loads((cache / "calibration.json").read_text())["calibrations"].values()
        assert entry["api_base"] == measured.url and f"openai/fake@{measured.url}|" in entry["key"]
        assert f"on openai/fake at {measured.url};" in result.output

        out = tmp_path / "other.json"
        result = invoke(["score", summary, "--lm", "openai/fake", "--api-base", other.url, "--cache-dir", cache,
                         "-o", out], tmp_path)
        assert result.exit_code == 0, result.output
        judge = json.loads(out.read_text())["judge"]
        assert judge["calibration"] is None and judge["api_base"] == other.url
        assert (f"never measured for openai/fake at {other.url} with this program "
                f"(booklens calibrate --lm openai/fake --api-base {other.url})") in judge["warning"]

    listed = invoke(["judges", "--lm", "openai/fake", "--api-base", measured.url, "--cache-dir", cache], tmp_path)
    assert listed.exit_code == 0, listed.output
    coherence = next(line for line in listed.output.splitlines() if "coherence program" in line)
    assert coherence.startswith("judge: default few-shot coherence program") and "agreement with humans" in coherence
    elsewhere = invoke(["judges", "--lm", "openai/fake", "--api-base", other.url, "--cache-dir", cache], tmp_path)
    assert elsewhere.exit_code == 0 and "agreement with humans" not in elsewhere.output.split("\n")[0]
    assert invoke(["judges", "--api-base", other.url], tmp_path).exit_code == 1  # the embedded model has no server


def test_a_batched_coherence_judge_is_calibrated_apart_and_its_warning_says_how(tmp_path, shared_dir):
    """`score --batch-size 3` judges in the batched mode, whose calibration is its own: the warning
    names the command that measures it, and after that command the score shows the figures."""
    from booklens.testing import PipelineResponder

    human = shared_dir / "data" / "booookscore" / "human"
    cache = tmp_path / "cache"
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache]

        def score(batch_size="3"):
            out = tmp_path / "out.json"
            result = invoke(["score", summary, "--batch-size", batch_size, *lm, "-o", out], tmp_path)
            assert result.exit_code == 0, result.output
            return result, json.loads(out.read_text())["judge"]

        result, judge = score()
        assert judge["mode"] == "batched" and judge["calibration"] is None
        assert judge["warning"].endswith(f"(booklens calibrate --lm openai/fake --api-base {server.url} "
                                         "--judge coherence --batch-size 3)")
        result = invoke(["calibrate", "--judge", "coherence", "--batch-size", "3", "--books", "1",
                         "--coherence-data", human, *lm], tmp_path)
        assert result.exit_code == 0, result.output
        (entry,) = json.loads((cache / "calibration.json").read_text())["calibrations"].values()
        assert entry["mode"] == "batched" and entry["key"].startswith(f"coherence|batched|openai/fake@{server.url}|")
        assert 0 < entry["usage"]["calls"] <= -(-entry["n"]["sentences"] // 3) + entry["n"]["summaries"]
        result, judge = score()
        assert judge["calibration"]["key"] == entry["key"] and "no calibration" not in result.output
        # Five sentences to a prompt is another judge: batch 3's figures are not its own.
        result, judge = score("5")
        assert judge["calibration"] is None and judge["warning"].endswith("--judge coherence --batch-size 5)")
        wrong = invoke(["calibrate", "--judge", "verification", "--batch-size", "3", *lm], tmp_path)
    assert "--batch-size is for the coherence judge" in str(wrong.exception)

def test_calibrate_refuses_a_store_that_is_not_one_before_any_judgment(tmp_path, shared_dir):
    from booklens.errors import BooklensError

    human = shared_dir / "data" / "booookscore" / "human"
    store = tmp_path / "notes.json"
    store.write_text(json.dumps({"mine": [1, 2, 3]}))
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", "coherence", "--books", "1", "--coherence-data", human,
                         "--lm", "openai/fake", "--api-base", server.url, "-o", store], tmp_path)
    assert isinstance(result.exception, BooklensError) and "is not a booklens calibration file" in str(result.exception)
    assert server.served == [] and json.loads(store.read_text()) == {"mine": [1, 2, 3]}


def test_calibrate_refuses_options_no_chosen_judge_uses(tmp_path):
    from booklens.errors import BooklensError

    lm = ["--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"]
    for args, message in ((["--judge", "verification", "--coherence-data", tmp_path / "nowhere"],
                           "--coherence-data is for the coherence judge"),
                          (["--judge", "coherence", "--fables-data", tmp_path / "nowhere"],
                           "--fables-data is for the verification and binary judges"),
                          (["--judge", "binary", "--books", "3"],
                           "the binary rater is always measured on FABLES Table 5's seven books: --books does not "
                           "apply")):
        result = invoke(["calibrate", *args, *lm], tmp_path)
        assert isinstance(result.exception, BooklensError) and str(result.exception) == message
    assert not (tmp_path / "cache" / "calibration.json").exists()


def test_calibrate_stores_nothing_for_a_judge_that_never_answered(tmp_path, shared_dir):
    human = shared_dir / "data" / "booookscore" / "human"
    # FABLES with two claims per summary, and its first unfaithful one (a sample needs both kinds), keeps
    # the test quick; the sample's books are the same
    fables = json.loads((shared_dir / "data" / "fables" / "FABLES.json").read_text())
    for systems in fables["FABLES"].values():
        for summary in systems.values():
            claims = list(summary["claims"].items())
            unfaithful = [item for item in claims[2:] if item[1]["label"] == "No"][:1]
            summary["claims"] = dict(claims[:2] + unfaithful)
    small = tmp_path / "FABLES.json"
    small.write_text(json.dumps(fables))

    def no_verdicts(body):
        if "[[ ## claim ## ]]" in body["messages"][-1]["content"]:
            return "Sorry, I cannot help with that."
        return answer(body)

    cache = tmp_path / "cache"
    with FakeOpenAIServer(responder=no_verdicts) as server:
        proc = run_command(["calibrate", "--books", "1", "--coherence-data", human, "--fables-data", small,
                            "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and sum(line.startswith("error: ") for line in lines) == 1
    assert lines[-1].startswith("error: verification calibration: the judge gave no valid verdict on any of the ")
    assert "(first: unparseable answer" in lines[-1] and lines[-1].endswith("nothing stored")
    store = json.loads((cache / "calibration.json").read_text())["calibrations"]
    assert [entry["judge"] for entry in store.values()] == ["coherence"]  # the judge that answered is kept


def test_verify_binary_and_check_record_their_judge(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps([{"claim": "Mara keeps the lighthouse.", "evidence": ["Mara kept the light."]},
                                  {"claim": "Zed is her brother.", "evidence": ["Zed was a stranger."]}]))
    out = tmp_path / "verdicts.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["verify", "--claims", claims, "--evidence", "given", "--binary", "--lm", "openai/fake",
                         "--api-base", server.url, "-o", out], tmp_path)
        schema = json.dumps(server.served[0].get("response_format", {}))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["label_set"] == "binary" and report["judge"]["mode"] == "binary"
    assert [c["label"] for c in report["claims"]] == ["faithful", "unfaithful"]
    assert "partial support" not in schema
    assert "judge: default few-shot verification program (binary, 6 demos" in result.output
    # the binary rater's line names only the labels it gives
    assert "2 claims: 50.0% faithful, 50.0% unfaithful;" in result.output
    assert "partial support" not in result.output and "can't verify" not in result.output

    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    story = REPO / "examples" / "sample_story.txt"
    checked = tmp_path / "check.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["check", story, summary, "--zero-shot", "--k", "2", "--lm", "openai/fake",
                         "--api-base", server.url, "-o", checked], tmp_path)
    assert result.exit_code == 0, result.output
    report = json.loads(checked.read_text())
    assert report["judge"]["program"] == "zero-shot" and report["judge"]["mode"] == "four-way"
    assert len(report["claims"]) == 2 and "judge: zero-shot verification program" in result.output


def test_program_and_zero_shot_together_is_a_user_error(tmp_path):
    from booklens.errors import BooklensError
    from booklens.judges import default_path

    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    result = invoke(["score", summary, "--program", default_path("coherence"), "--zero-shot"], tmp_path)
    assert isinstance(result.exception, BooklensError) and "not both" in str(result.exception)
    result = invoke(["verify", "--claims", tmp_path / "none.json", "--binary", "--program",
                     default_path("verification")], tmp_path)
    assert result.exit_code != 0
    # verify judges with one program: --zero-shot beside it applied to nothing, and was taken silently.
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Maren keeps the light."]))
    result = invoke(["verify", "--claims", claims, "--evidence", "none", "--program", default_path("verification"),
                     "--zero-shot", "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert isinstance(result.exception, BooklensError) and "not both" in str(result.exception)


def test_judges_lists_the_default_judges_with_their_calibration(tmp_path):
    result = invoke(["judges", "--lm", "local"], tmp_path)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("judge: ")]
    assert len(lines) == 3
    assert "default few-shot coherence program" in lines[0] and "(binary, 6 demos" in lines[2]
    assert "agreement with humans on" in lines[0] and "agreement with humans on" in lines[1]


def test_judges_refuses_a_cache_dir_that_is_a_file(tmp_path):
    """Its calibrations would be read as none at all: the figures of the user's own calibrate runs
    missing without a word."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    result = run_command(["judges", "--lm", "local", "--cache-dir", blocker])
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: cannot use {blocker} as the cache directory: it is a file\n", result.stderr


def test_evaluate_compares_the_default_judge_with_zero_shot(tmp_path, shared_dir):
    fables = shared_dir / "data" / "fables" / "FABLES.json"
    out = tmp_path / "eval.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["evaluate", "verification", "--data", fables, "--program", "default", "--size", "4",
                         "--lm", "openai/fake", "--api-base", server.url, "-o", out], tmp_path)
    assert result.exit_code == 0, result.output
    assert "| zero-shot" in result.output and "default few-shot" in result.output
    labels = [r["label"] for r in json.loads(out.read_text())["results"]]
    assert labels == ["zero-shot", "default few-shot"]


# ---------------------------------------------------------------------------
# Calibration figures against a hand computation on small fixtures. The judge (`answer`) calls a
# sentence confusing and a claim unfaithful when it names Zed.

FIVE_BOOKS = ("alpha", "beta", "gamma", "delta", "epsilon")  # split with seed 0: test = gamma, epsilon


def human_fixture(folder: Path) -> Path:
    """Five summaries of five sentences; the humans mark sentences 2 and 3, the judge 2 and 4."""
    data = {}
    for name in FIVE_BOOKS:
        s = [f"Mara walks to the {name} shore.", f"Zed waves from the {name} boat.",
             f"The {name} tide rises slowly.", f"Zed shouts at the {name} gulls.", f"Night falls over the {name} bay."]
        data[name] = {"summary": " ".join(s), "relations": [], "singles": [
            {"id": "1", "span": s[1], "questions": "Who is Zed?", "labels": ["entity omission"]},
            {"id": "2", "span": s[2], "questions": "Which tide?", "labels": ["salience"]}]}
    folder.mkdir()
    (folder / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    return folder


FIXTURE_CLAIMS = (("Mara walks along the shore.", "Yes"), ("Zed owns the lighthouse.", "No"),
                  ("Mara hates the sea.", "No"), ("Zed arrives in winter with a letter.", "PartialSupport"),
                  ("Mara was born in the town.", "Inapplicable"))


def fables_fixture(path: Path, books) -> Path:
    evidence = ["Mara walked along the shore every morning, watching the boats come in from the bay."]
    path.write_text(json.dumps({"canary": "x", "FABLES": {book: {"GPT-4": {
        "summary": "Mara walks. Zed arrives.", "general_comment": "",
        "claims": {str(i): {"claim": c, "label": label, "evidence": evidence, "reason": ["r"]}
                   for i, (c, label) in enumerate(FIXTURE_CLAIMS)}}} for book in books}}))
    return path


def calibrated(args, tmp_path):
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", *args, "--lm", "openai/fake", "--api-base", server.url,
                         "--cache-dir", tmp_path / "cache", "-o", store], tmp_path)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(store.read_text())["calibrations"].values()
    return entry, result.output


def test_coherence_calibration_figures_match_a_hand_computation(tmp_path):
    entry, output = calibrated(["--judge", "coherence", "--coherence-data", human_fixture(tmp_path / "human"),
                                "--books", "2"], tmp_path)
    assert entry["data"]["books"] == ["epsilon", "gamma"]  # the test split: no book the demos came from
    # per summary tp 1 (Zed waves), fp 1 (Zed shouts), fn 1 (the tide), tn 2; two summaries
    assert entry["counts"] == {"tp": 2, "fp": 2, "fn": 2, "tn": 4, "human_confusing": 4, "judge_confusing": 4}
    figures = {name: block["value"] for name, block in entry["figures"].items()}
    # p_o 0.6, p_e 0.4 * 0.4 + 0.6 * 0.6 = 0.52: kappa 0.08 / 0.48
    assert figures == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.6,
                                     "kappa": round(0.08 / 0.48, 4)})
    assert entry["n"] == {"summaries": 2, "sentences": 10, "compared": 10, "failed": 0}
    assert '"confusing" F1 0.50' in output and "kappa 0.17" in output


def test_verification_calibration_figures_match_a_hand_computation(tmp_path):
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    entry, output = calibrated(["--judge", "verification", "--fables-data", fables, "--books", "2"], tmp_path)
    assert entry["data"]["books"] == ["epsilon", "gamma"]
    # per summary gold faithful, unfaithful, unfaithful, partial, can't verify; judged f, u, f, u, f
    f1 = {label: block["value"] for label, block in entry["figures"]["f1"].items()}
    assert f1 == pytest.approx({"faithful": 2 * 2 / (2 * 2 + 4), "unfaithful": 2 * 2 / (2 * 2 + 2 + 2),
                                "partial support": 0.0, "can't verify": 0.0}, abs=1e-4)
    assert entry["figures"]["accuracy"]["value"] == pytest.approx(0.4)
    assert entry["counts"]["unfaithful"] == 4 and entry["counts"]["unfaithful_found"] == 2
    # Table 5's convention: only the claims humans called faithful or unfaithful (three per summary)
    t5 = entry["table5"]
    assert t5["n"] == 6 and (t5["f1_faithful"], t5["f1_unfaithful"], t5["accuracy"]) == pytest.approx((2 / 3,) * 3,
                                                                                                       abs=1e-4)
    assert "F1 faithful 0.50" in output and "F1 unfaithful 0.50" in output and "accuracy 0.40" in output


@pytest.mark.parametrize("judge", ["coherence", "verification"])
def test_calibrate_refuses_more_books_than_the_test_split_holds_before_any_call(tmp_path, judge):
    """`--books 3` on a test split of two books measured the two and said so only in passing."""
    data = (["--coherence-data", human_fixture(tmp_path / "human")] if judge == "coherence"
            else ["--fables-data", fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)])
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", judge, *data, "--books", "3", "--lm", "openai/fake",
                         "--api-base", server.url, "--cache-dir", tmp_path / "cache", "-o", store], tmp_path)
        served = len(server.served)
    from booklens.errors import BooklensError

    assert isinstance(result.exception, BooklensError) and served == 0 and not store.exists()
    split = "BooookScore's" if judge == "coherence" else "FABLES'"
    assert str(result.exception) == (f"--books 3 asks for more books than the 2 of {split} test split (split with "
                                     "seed 0) it draws them from: give at most 2")
    # the library call names the argument it was given (`books`), and so do the data it needs
    import dspy

    from booklens.calibration import calibrate
    from booklens.judges import load_judge
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: {})
    where = {"human_dir": data[1]} if judge == "coherence" else {"fables_path": data[1]}
    with dspy.context(lm=lm), pytest.raises(BooklensError) as raised:
        calibrate(judge, load_judge(judge), lm, books=3, **where)
    assert str(raised.value) == (f"books 3 asks for more books than the 2 of {split} test split (split with seed 0) "
                                 "it draws them from: give at most 2")
    with dspy.context(lm=lm), pytest.raises(BooklensError) as raised:
        calibrate(judge, load_judge(judge), lm)  # (a command always gives the shared data's)
    assert str(raised.value) == ("coherence calibration needs the BooookScore human annotations (human_dir)"
                                 if judge == "coherence" else "verification calibration needs FABLES (fables_path)")
    assert lm.backend.calls == []


def test_a_smaller_calibration_does_not_replace_a_larger_one_unless_asked(tmp_path):
    """The store holds one calibration per judge, LM and program: `--books 1` after `--books 2`
    replaced the larger measurement without a word. It is kept; --replace stores the smaller one."""
    human = human_fixture(tmp_path / "human")
    store = tmp_path / "store.json"

    def entries():
        return json.loads(store.read_text())["calibrations"]

    with FakeOpenAIServer(responder=answer) as server:
        def calibrate(*args):
            return invoke(["calibrate", "--judge", "coherence", "--coherence-data", human, *args, "--lm",
                           "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache", "-o", store],
                          tmp_path)

        assert calibrate("--books", "2").exit_code == 0
        (larger,) = entries().values()
        assert larger["n"]["sentences"] == 10
        smaller = calibrate("--books", "1")
        assert smaller.exit_code == 0, smaller.output
        assert entries() == {larger["key"]: larger}
        (line,) = [line for line in smaller.output.splitlines() if "LM calls" in line]
        assert line.endswith(f"; not stored: its 5 sentences are fewer than the 10 of the calibration {store} holds "
                             "for this judge and LM (give --replace to store it instead)"), line
        # what was measured is still shown
        assert "agreement with humans on BooookScore's test split (1 summary of 1 book)" in smaller.output
        forced = calibrate("--books", "1", "--replace")
        assert forced.exit_code == 0, forced.output
        assert entries()[larger["key"]]["n"]["sentences"] == 5 and f"stored in {store}" in forced.output
        assert calibrate("--books", "2").exit_code == 0  # a larger sample replaces a smaller one
        assert entries() == {larger["key"]: larger}


def test_binary_calibration_on_the_table5_books_a_file_holds(tmp_path):
    fables = fables_fixture(tmp_path / "FABLES.json", ("Pet", "yellowface", "alpha"))
    entry, output = calibrated(["--judge", "binary", "--fables-data", fables], tmp_path)
    assert entry["data"]["books"] == ["Pet", "yellowface"] and entry["n"]["claims"] == 6
    f1 = {label: block["value"] for label, block in entry["figures"]["f1"].items()}
    assert f1 == pytest.approx({"faithful": 2 / 3, "unfaithful": 2 / 3}, abs=1e-4)  # stored to 4 places
    # two of the seven books: the name says so, not "Table 5's seven books"
    assert entry["sample_name"] == "2 of FABLES Table 5's seven books"
    assert "agreement with humans on 2 of FABLES Table 5's seven books" in output


def test_calibrate_refuses_data_it_would_measure_wrongly_before_any_call(tmp_path, shared_dir):
    from booklens.errors import BooklensError

    precision_study = shared_dir / "data" / "booookscore" / "human" / "annotations-gpt4-4096-inc.json"
    no_table5 = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    cases = (
        # read as span annotations it held none: every sentence a clean label, and a calibration stored
        (["--judge", "coherence", "--coherence-data", precision_study],
         "no 'singles' or 'relations': not human span annotations (this is the shape of the precision-study file"),
        (["--judge", "binary", "--fables-data", no_table5],
         "holds no labelled claim (none of the seven books of FABLES' Table 5 is in it"),
        (["--judge", "binary", "--seed", "3"], "--seed draws no sample for it"),
    )
    with FakeOpenAIServer(responder=answer) as server:
        for args, message in cases:
            result = invoke(["calibrate", *args, "--lm", "openai/fake", "--api-base", server.url,
                             "--cache-dir", tmp_path / "cache"], tmp_path)
            assert isinstance(result.exception, BooklensError), result.output
            assert message in str(result.exception) and "\n" not in str(result.exception)
        assert server.served == []
    assert not (tmp_path / "cache" / "calibration.json").exists()


def test_a_malformed_calibration_entry_is_one_line_naming_the_store(tmp_path):
    from booklens.judges import DEFAULTS_DIR

    shipped = json.loads((DEFAULTS_DIR / "calibration.json").read_text())
    key, entry = next(iter(shipped["calibrations"].items()))
    cache = tmp_path / "cache"
    cache.mkdir()
    for figures in ("x", {"kappa": {"value": "high"}}, {"f1": {"faithful": [0.5]}}):
        (cache / "calibration.json").write_text(json.dumps({"calibrations": {key: {**entry, "figures": figures}}}))
        proc = run_command(["judges", "--cache-dir", cache])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"error: calibration store {cache / 'calibration.json'}: the entry {key!r} is "
                                   "malformed (")
    (cache / "calibration.json").write_text(json.dumps(shipped))  # the shipped entries pass
    assert run_command(["judges", "--cache-dir", cache]).returncode == 0


def _calibrated_coherence(tmp_path, server, books: int):
    """A coherence calibration of `books` fixture books stored in tmp_path/store.json: the command's
    arguments, the store's data, and its one entry's key and value (to edit and write back)."""
    args = ["calibrate", "--judge", "coherence", "--coherence-data", human_fixture(tmp_path / "human"), "--books",
            str(books), "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache", "-o",
            tmp_path / "store.json"]
    assert run_command(args).returncode == 0
    data = json.loads((tmp_path / "store.json").read_text())
    (key, entry), = data["calibrations"].items()
    return args, data, key, entry


@pytest.mark.parametrize("part, value", [("n", {"sentences": "many"}), ("n", {"sentences": [10]}),
                                         ("counts", {"tp": {"found": 2}})])
def test_a_stored_sample_size_or_count_that_is_no_number_is_refused_before_any_call(tmp_path, part, value):
    """`calibrate` compares the new calibration's size with the stored one's: a stored size that is no
    number ended the command in "internal error: TypeError: '<' not supported between instances of
    'int' and 'str'", after every judgment; the judge lines print the counts."""
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        args, data, key, entry = _calibrated_coherence(tmp_path, server, books=1)
        entry[part] = {**entry[part], **value}
        store.write_text(json.dumps(data))
        before, served = store.read_bytes(), len(server.served)
        proc = run_command(args)
        assert len(server.served) == served
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: calibration store {store}: the entry {key!r} is malformed ("), proc.stderr
    assert store.read_bytes() == before


@pytest.mark.parametrize("command", ["score", "verify", "check"])
def test_a_malformed_calibration_store_is_refused_before_any_call(tmp_path, command):
    """Every judgment's record carries its judge's calibration, read from the store beside the LM
    cache: a malformed store stopped `verify` and `check` only after every claim was judged, with no
    record written. Like `score`, they refuse it before the first call."""
    cache = tmp_path / "cache"
    cache.mkdir()
    store = cache / "calibration.json"
    store.write_text(json.dumps({"kind": "booklens.calibrations", "calibrations": {"x": {"figures": 3}}}))
    book = tmp_path / "book.txt"
    book.write_text("Mara keeps the lighthouse on Gull Rock. Zed appears at the door one winter night.")
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara keeps the lighthouse.", "Zed appears at the door."]))
    args = {"score": [summary], "verify": ["--book", book, "--claims", claims],
            "check": [book, summary]}[command]
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answer) as server:
        proc = run_command([command, *args, "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache,
                            "-o", out])
        assert server.served == []
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: calibration store {store}: the entry 'x' is malformed")
    assert not out.exists()


def test_judges_shows_the_batched_coherence_judge_that_calibrate_stored(tmp_path):
    """`calibrate --batch-size 3` stores the batched judge's figures apart from the per-sentence one's;
    `judges --batch-size 3` shows that judge with them, as `score --batch-size 3` would judge."""
    from booklens.testing import PipelineResponder

    cache = tmp_path / "cache"
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache]
        result = invoke(["calibrate", "--judge", "coherence", "--batch-size", "3", "--books", "2",
                         "--coherence-data", human_fixture(tmp_path / "human"), *lm], tmp_path)
        assert result.exit_code == 0, result.output
    shown = invoke(["judges", "--batch-size", "3", *lm], tmp_path)
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.output.splitlines() if line.startswith("judge: ")]
    assert len(lines) == 3
    assert "coherence program (batched, " in lines[0] and "agreement with humans on" in lines[0]
    plain = invoke(["judges", *lm], tmp_path)
    first = plain.output.splitlines()
    assert "coherence program (per-sentence, " in first[0] and "never measured" in first[1]
    assert invoke(["judges", "--batch-size", "0", *lm], tmp_path).exit_code != 0


@pytest.mark.parametrize("option", [["--lm", "openai/fake"], ["--api-base", "http://127.0.0.1:9/v1"],
                                    ["--cache-dir", "elsewhere"], ["--batch-size", "4"]])
def test_judges_build_refuses_the_options_that_only_show_the_judges(tmp_path, option):
    # `judges build` reads annotations with no LM: an option of `judges` given before it would do nothing.
    out = tmp_path / "built"
    result = run_command(["judges", *option, "build", "-o", out])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert option[0] in result.stderr and "build" in result.stderr
    assert not out.exists()


def test_judges_build_without_o_never_changes_the_shipped_judges(tmp_path, shared_dir, monkeypatch):
    """With no -o, `judges build` rewrites the shipped judges only as they are: annotations that
    build other judges are refused in one line, and the shipped files stay; -o writes them anywhere."""
    import shutil

    import booklens.judges
    from booklens.judges import DEFAULT_FILES, DEFAULTS_DIR

    shipped = tmp_path / "defaults"
    shutil.copytree(DEFAULTS_DIR, shipped)
    monkeypatch.setattr(booklens.judges, "DEFAULTS_DIR", shipped)
    before = {name: (shipped / name).read_bytes() for name in DEFAULT_FILES.values()}
    human = shared_dir / "data" / "booookscore" / "human"
    fables = shared_dir / "data" / "fables" / "FABLES.json"
    other = tmp_path / "FABLES.json"  # the same annotations written another way: another sha256 to record
    other.write_text(json.dumps(json.loads(fables.read_text(encoding="utf-8"))), encoding="utf-8")

    result = run_command(["judges", "build", "--coherence-data", human, "--fables-data", other])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "verification.json" in result.stderr and "-o" in result.stderr
    assert {name: (shipped / name).read_bytes() for name in DEFAULT_FILES.values()} == before
    assert sorted(p.name for p in shipped.iterdir()) == sorted(p.name for p in DEFAULTS_DIR.iterdir())

    result = run_command(["judges", "build", "--coherence-data", human, "--fables-data", fables])
    assert result.returncode == 0, result.stderr  # the same annotations: the same bytes
    assert {name: (shipped / name).read_bytes() for name in DEFAULT_FILES.values()} == before

    result = run_command(["judges", "build", "--coherence-data", human, "--fables-data", other, "-o", shipped])
    assert result.returncode == 0, result.stderr  # named: replaced
    assert (shipped / "verification.json").read_bytes() != before["verification.json"]
    assert (shipped / "coherence.json").read_bytes() == before["coherence.json"]


def test_judges_build_refuses_an_output_folder_whose_judge_file_is_its_input(tmp_path, shared_dir):
    """FABLES kept as verification.json in the -o folder was read, then replaced by the judge built
    from it: refused in one line before anything is built or written. (The coherence annotations
    are read from summary-*.json files, never under a judge's file name.)"""
    import shutil

    out = tmp_path / "judges"
    out.mkdir()
    fables = out / "verification.json"
    shutil.copy(shared_dir / "data" / "fables" / "FABLES.json", fables)
    before = fables.read_bytes()
    result = run_command(["judges", "build", "--coherence-data", shared_dir / "data" / "booookscore" / "human",
                          "--fables-data", fables, "-o", out])
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "verification.json" in result.stderr and "input" in result.stderr
    assert result.stderr.rstrip().endswith("choose another -o folder")  # -o names a folder here, not a file
    assert fables.read_bytes() == before
    assert [p.name for p in out.iterdir()] == ["verification.json"]  # nothing else written either


@pytest.mark.parametrize("first, bad", [(first, bad) for first in ("coherence", "verification")
                                        for bad in ("missing", "empty", "not-json")]
                         + [("coherence", "no-labelled-claim")])
def test_calibrate_checks_every_judges_data_before_the_first_judges_calls(tmp_path, first, bad):
    """Two judges in one run: the data of the second one is read (and refused) before the first one
    makes a call, not after its whole calibration."""
    from booklens.errors import BooklensError

    human = human_fixture(tmp_path / "human")
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    broken = {"missing": tmp_path / "nowhere.json", "empty": tmp_path / "empty.json",
              "not-json": tmp_path / "notes.json"}.get(bad)
    if bad == "empty":
        broken.write_text("")
    elif bad == "not-json":
        broken.write_text("just notes\n")
    second = "verification" if first == "coherence" else "coherence"
    data = {"coherence": ["--coherence-data", human], "verification": ["--fables-data", fables]}
    if bad == "no-labelled-claim":  # readable, but the binary rater's sample (Table 5's books) is empty
        second, broken = "binary", fables
    else:
        data["verification" if second == "binary" else second][1] = broken
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", first, "--judge", second, *data["coherence"], *data["verification"],
                         "--books", "1", "--lm", "openai/fake", "--api-base", server.url, "-o", store], tmp_path)
        assert isinstance(result.exception, BooklensError), result.output
        assert "\n" not in str(result.exception)
        assert server.served == []
    assert not store.exists()


def test_judges_build_refuses_a_folder_under_a_file_before_reading_any_annotation(tmp_path):
    """A file where a folder of -o should be was found only when the first program was written,
    after every annotation had been read and every demo chosen."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "judges"
    result = run_command(["judges", "build", "--coherence-data", tmp_path / "nowhere", "--fables-data",
                          tmp_path / "nowhere.json", "-o", out])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr == f"error: cannot write the judges to {out}: {blocker} is not a folder\n"


# ---------------------------------------------------------------------------
# A window too small for every demo beside a long summary: the judge is then run with fewer demos,
# and every command that judges says so, not only `score`.

LONG_BOOK = "gamma"  # in the test split with seed 0 (`FIVE_BOOKS`)


def long_summary_fixture(folder: Path) -> Path:
    """`human_fixture`, with 150 more sentences in the summary of LONG_BOOK: beside it, the default
    coherence judge's demos do not all fit gpt-4's 8K window."""
    human_fixture(folder)
    path = folder / "summary-gpt4-4096-inc.json"
    data = json.loads(path.read_text())
    data[LONG_BOOK]["summary"] += "".join(f" Anna counts boat number {i} as it comes into the old harbour town "
                                          "from the grey northern sea." for i in range(150))
    path.write_text(json.dumps(data))
    return folder


def test_evaluate_says_which_summaries_the_judge_saw_with_fewer_demos(tmp_path):
    human = long_summary_fixture(tmp_path / "human")
    out = tmp_path / "eval.json"
    with FakeOpenAIServer(responder=answer) as server:  # gpt-4: an 8K window LiteLLM knows
        result = invoke(["evaluate", "coherence", "--data", human, "--program", "default", "--lm", "openai/gpt-4",
                         "--api-base", server.url, "-o", out], tmp_path)
        shown = {len(body["messages"]) for body in server.served if LONG_BOOK in body["messages"][-1]["content"]}
    assert result.exit_code == 0, result.output
    zero, default = json.loads(out.read_text())["results"]
    assert zero["label"] == "zero-shot" and zero["notes"] == []
    (note,) = default["notes"]  # the long summary only; its every sentence kept the same demos
    assert note.startswith(f"'{LONG_BOOK}' (summary-gpt4-4096-inc.json): ") and "demos were left out" in note
    from booklens.judges import load_judge

    # beside the zero-shot prompts (a system and a user message), one prompt of fewer demos than the judge's
    (few_shot,) = shown - {2}
    assert few_shot < 1 + 2 * len(load_judge("coherence").detect.demos) + 1
    assert f"note: default few-shot: {note}" in result.output, result.output


def test_calibrate_says_which_summaries_the_judge_saw_with_fewer_demos(tmp_path):
    human = long_summary_fixture(tmp_path / "human")
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", "coherence", "--coherence-data", human, "--books", "2",
                         "--lm", "openai/gpt-4", "--api-base", server.url, "--cache-dir", tmp_path / "cache",
                         "-o", store], tmp_path)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(store.read_text())["calibrations"].values()
    assert entry["data"]["books"] == ["epsilon", LONG_BOOK]
    (note,) = entry["notes"]
    assert note.startswith(f"'{LONG_BOOK}' (summary-gpt4-4096-inc.json): ") and "demos were left out" in note
    rows = {row["book"]: row for row in entry["summaries"]}
    assert rows["epsilon"]["demos_left_out"] == 0 and rows[LONG_BOOK]["demos_left_out"] > 0
    assert f"note: {note}" in result.output, result.output


def test_calibrate_progress_names_the_judge_and_counts_the_summaries_it_judges(tmp_path):
    """The binary rater's progress read "verification: 1/2 summaries", and stopped there: a summary
    with no claim of the labels measured was counted in the total but never judged."""
    fables = fables_fixture(tmp_path / "FABLES.json", ("Pet", "yellowface"))
    data = json.loads(fables.read_text())
    for claim in data["FABLES"]["yellowface"]["GPT-4"]["claims"].values():
        claim["label"] = "PartialSupport"  # nothing the binary rater is measured on
    fables.write_text(json.dumps(data))
    entry, output = calibrated(["--judge", "binary", "--fables-data", fables], tmp_path)
    assert entry["n"]["summaries"] == 1
    progress = [line for line in output.splitlines() if "/" in line and line.endswith("summaries")]
    assert progress == ["binary: 1/1 summaries"], output


def test_a_summary_the_judge_failed_on_throughout_is_no_resampling_unit(tmp_path):
    """The intervals resample summaries; one whose every sentence got no verdict has nothing to
    compare, yet it was drawn in resamples in place of summaries that had: the intervals came out
    as if over fewer summaries. They are those of the summaries compared."""
    from booklens.metrics.bootstrap import confusion_counts, figure

    books = [f"book{i:02d}" for i in range(25)]
    marks = {}  # book -> (sentences the judge flags: those naming Zed, sentences the humans mark)
    data = {}
    for i, name in enumerate(books):
        zed, marked = {i % 5, (2 * i + 1) % 5}, {(i + 1) % 5, 3 * i % 5}
        marks[name] = (zed, marked)
        s = [f"{'Zed' if k in zed else 'Mara'} walks past the {name} mark number {k}." for k in range(5)]
        data[name] = {"summary": " ".join(s), "relations": [], "singles": [
            {"id": str(k), "span": s[k], "questions": "Why?", "labels": ["salience"]} for k in sorted(marked)]}
    human = tmp_path / "human"
    human.mkdir()
    (human / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    first = {}

    def failing(body):  # every sentence of the first sampled summary fails
        sentence = body["messages"][-1]["content"].split("[[ ## sentence ## ]]", 1)[-1]
        return "not an answer" if first and first["book"] in sentence else answer(body)

    store = tmp_path / "store.json"
    from booklens.calibration import coherence_sample

    sample = sorted({a.book for _, a in coherence_sample(human, books=None)[0]})  # the whole test split
    with FakeOpenAIServer(responder=failing) as server:
        args = ["calibrate", "--judge", "coherence", "--coherence-data", human, "--books", str(len(sample)),
                "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache", "-o", store]
        assert len(sample) >= 4
        first["book"] = sample[0] + " "
        result = invoke(args, tmp_path)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(store.read_text())["calibrations"].values()
    assert entry["n"]["failed"] == 5 and entry["n"]["summaries"] == len(sample)
    compared = [confusion_counts([k in marks[b][0] for k in range(5)], [k in marks[b][1] for k in range(5)])
                for b in sample[1:]]
    assert len({tuple(c) for c in compared}) > 1
    for name in ("precision", "recall", "f1", "kappa", "accuracy"):
        assert entry["figures"][name] == figure(compared, name, n=entry["n"]["compared"], seed=0), name


def test_calibrate_refuses_a_summary_too_long_for_the_window_before_any_judge_calls(tmp_path):
    """A coherence sample summary that does not fit the model's window even with no demo was found at
    its own call: after the verifier's calls and the summaries judged before it."""
    from test_judges import long_human_fixture

    human = long_human_fixture(tmp_path / "human")
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:  # a model name whose 8,192-token window LiteLLM knows
        result = invoke(["calibrate", "--judge", "verification", "--judge", "coherence", "--coherence-data", human,
                         "--fables-data", fables, "--lm", "openai/gpt-4", "--api-base", server.url,
                         "--cache-dir", tmp_path / "cache", "-o", store], tmp_path)
        served = len(server.served)
    from booklens.errors import BooklensError

    assert isinstance(result.exception, BooklensError) and served == 0 and not store.exists()
    message = str(result.exception)
    assert message.startswith("the summary 'gamma' of summary-gpt4-4096-inc.json (") and "\n" not in message
    assert "does not fit the model's 8,192-token context window even with none of the judge's demos" in message


@pytest.mark.parametrize("judge, kind", [("coherence", "none"), ("coherence", "all"), ("verification", "none"),
                                         ("verification", "all"), ("binary", "none")])
def test_a_sample_whose_human_labels_are_all_of_one_kind_is_refused_before_any_call(tmp_path, judge, kind):
    """Humans who marked no sentence of the sample confusing (or every one) leave kappa 0 or undefined
    whatever the judge says, and the unfaithful F1 is 0 or undefined on a sample with no unfaithful
    claim: such a calibration was stored ("this judge found 0 of 0 sentences humans marked confusing")
    and shown beside every later score as the judge's agreement."""
    from booklens.errors import BooklensError

    if judge == "coherence":
        human = human_fixture(tmp_path / "human")
        data = json.loads((human / "summary-gpt4-4096-inc.json").read_text())
        for entry in data.values():  # no span, or one over the whole summary (its five sentences)
            entry["singles"] = ([] if kind == "none" else
                                [{"id": "1", "span": entry["summary"], "questions": "Why?", "labels": ["salience"]}])
        (human / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
        args = ["--coherence-data", human, "--books", "2"]
        expected = ("coherence calibration: the humans marked "
                    + ("none of the 10 sentences" if kind == "none" else "all 10 sentences")
                    + f" of the sample drawn from {human} confusing")
    else:
        books = FIVE_BOOKS if judge == "verification" else ("Pet", "yellowface")
        fables = fables_fixture(tmp_path / "FABLES.json", books)
        data = json.loads(fables.read_text())
        for summaries in data["FABLES"].values():
            for claim in summaries["GPT-4"]["claims"].values():
                if claim["label"] in ("Yes", "No"):
                    claim["label"] = "Yes" if kind == "none" else "No"
        fables.write_text(json.dumps(data))
        args = ["--fables-data", fables] + (["--books", "2"] if judge == "verification" else [])
        expected = (f"{judge} calibration: the humans labelled "
                    + ("none of the 6 faithful or unfaithful claims" if kind == "none" else "all 6 faithful or "
                       "unfaithful claims") + f" of the sample drawn from {fables} unfaithful")
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        result = invoke(["calibrate", "--judge", judge, *args, "--lm", "openai/fake", "--api-base", server.url,
                         "--cache-dir", tmp_path / "cache", "-o", store], tmp_path)
        served = len(server.served)
    assert isinstance(result.exception, BooklensError), result.output
    assert served == 0 and not store.exists()
    message = str(result.exception)
    assert message.startswith(expected) and message.endswith("; nothing stored") and "\n" not in message, message


def test_calibrate_names_a_program_that_is_a_folder_or_no_file_as_score_does(tmp_path):
    """`calibrate --program` said "not found" of a folder that is there, and of /dev/null."""
    args = ["--cache-dir", tmp_path / "cache", "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"]
    for program, message in ((tmp_path, f"program artifact is a directory, not a file: {tmp_path}"),
                             (Path(os.devnull), f"program artifact is empty ({os.devnull})"),
                             (tmp_path / "nowhere.json", f"program artifact not found: {tmp_path / 'nowhere.json'}")):
        proc = run_command(["calibrate", "--program", program, *args])
        assert proc.returncode == 2 and proc.stderr == f"error: {message}\n", proc.stderr


def test_a_test_split_whose_books_hold_no_claim_is_not_called_empty(tmp_path):
    """The refusal said "its test split is empty: give the whole data set" of a test split of two books
    whose summaries hold no claim: the data set was whole, and the advice pointed nowhere."""
    from booklens.errors import BooklensError

    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    data = json.loads(fables.read_text())
    for summaries in data["FABLES"].values():
        summaries["GPT-4"]["claims"] = {}
    fables.write_text(json.dumps(data))
    result = invoke(["calibrate", "--judge", "verification", "--fables-data", fables, "--books", "2", "--lm",
                     "openai/fake", "--api-base", "http://127.0.0.1:9/v1", "-o", tmp_path / "store.json"], tmp_path)
    assert isinstance(result.exception, BooklensError), result.output
    assert str(result.exception) == (f"verification calibration: the sample drawn from {fables} holds no labelled "
                                     "claim (the summaries of the 2 books it drew from the test split have no claim "
                                     "with a label); nothing stored")


@pytest.mark.parametrize("lm, message", [
    ("nosuchprovider/xyz", "unknown model 'nosuchprovider/xyz': use 'local' or a LiteLLM model string such as "
                           "openai/gpt-4o-mini"),
    ("local/whatever", "unknown model 'local/whatever': use 'local' or a LiteLLM model string such as "
                       "openai/gpt-4o-mini"),
])
def test_judges_refuses_a_model_no_command_could_run_as_score_does(tmp_path, lm, message):
    """`judges --lm` with a model string `score` and `calibrate` refuse listed every judge as never
    measured for it, with a `booklens calibrate --lm ...` hint that would then fail."""
    proc = run_command(["judges", "--lm", lm, "--cache-dir", tmp_path / "cache"])
    assert proc.returncode == 2 and proc.stderr == f"error: {message}\n" and proc.stdout == "", proc.stderr


def test_a_coherence_calibration_is_sized_by_the_sentences_its_figures_rest_on(tmp_path):
    """The store keeps the larger of two calibrations of a judge. A coherence calibration leaves the
    sentences the judge gave no verdict on out of its figures, yet its size counted them: one that
    compared 2 of 20 sentences kept out one that compared all of 10 ("its 10 sentences are fewer
    than the 20 of ...")."""
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer) as server:
        args, data, key, entry = _calibrated_coherence(tmp_path, server, books=2)
        assert entry["n"] == {"summaries": 2, "sentences": 10, "compared": 10, "failed": 0}
        entry["n"] = {"summaries": 4, "sentences": 20, "compared": 2, "failed": 18}  # a judge that mostly failed
        store.write_text(json.dumps(data))
        proc = run_command(args)
    assert proc.returncode == 0, proc.stderr
    assert f"stored in {store}" in proc.stderr, proc.stderr
    assert json.loads(store.read_text())["calibrations"][key]["n"]["compared"] == 10


def test_a_calibration_stopped_by_a_server_error_resumes_with_only_the_calls_it_lacks(tmp_path):
    """The server fails for good after 13 answers, with four calls in flight: the coherence calibration
    (10 sentences) is stored, the verifier's is not, and the rerun asks for exactly the 7 calls of
    the 20 (10 sentences, 10 claims) no answer was kept for."""
    import threading

    human = human_fixture(tmp_path / "human")
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    data = json.loads(fables.read_text())
    for book, summaries in data["FABLES"].items():  # claims of their own in each book: no answer is shared
        for claim in summaries["GPT-4"]["claims"].values():
            claim["claim"] = claim["claim"].rstrip(".") + f" near {book}."
    fables.write_text(json.dumps(data))
    lock, asked, broken = threading.Lock(), [0], [True]

    def failing_after_13(body):
        with lock:
            asked[0] += 1
            if broken[0] and asked[0] > 13:
                return (400, "the server gave up")
        return answer(body)

    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=failing_after_13) as server:
        args = ["calibrate", "--coherence-data", human, "--fables-data", fables, "--books", "2", "--concurrency",
                "4", "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache", "-o", store]
        first = run_command(args)
        answered = len(server.served)
        stored = [entry["judge"] for entry in json.loads(store.read_text())["calibrations"].values()]
        broken[0] = False
        again = run_command(args)
        asked_again = len(server.served) - answered
    assert first.returncode == 2 and first.stderr.strip().splitlines()[-1].endswith("the server gave up")
    assert answered == 13 and asked_again == 7 and stored == ["coherence"], (answered, asked_again, stored)
    assert again.returncode == 0, again.stderr
    entries = json.loads(store.read_text())["calibrations"].values()
    assert sorted(entry["judge"] for entry in entries) == ["coherence", "verification"]
    assert "coherence: 10 LM calls (10 from cache)" in again.stderr
    assert "verification: 10 LM calls (3 from cache)" in again.stderr


def test_calibrate_names_sentence_annotations_given_as_the_human_spans(tmp_path):
    """GPT-4's released labels (book -> {sentence: {questions, types}}) given as --coherence-data were
    refused with "'summary' must be a non-empty string", as if one field of the right file were wrong."""
    human = tmp_path / "human"
    human.mkdir()
    labels = {"alpha": {"Zed waves from the boat.": {"questions": "Who is Zed?", "types": ["entity omission"]}}}
    (human / "summary-gpt4-2048-inc.json").write_text(json.dumps(labels))
    proc = run_command(["calibrate", "--judge", "coherence", "--coherence-data", human, "--lm", "openai/fake",
                        "--api-base", "http://127.0.0.1:9/v1", "--cache-dir", tmp_path / "cache"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: annotation file {human / 'summary-gpt4-2048-inc.json'}, book 'alpha': no "
                                  "'singles' or 'relations': not human span annotations (this is the shape of "
                                  "sentence annotations, book -> {sentence: {questions, types}}"), proc.stderr


def test_the_printed_calibrate_advice_names_the_cache_the_run_used_and_the_record_does_not(tmp_path):
    """`booklens calibrate` stores its figures in the default cache unless told: after a run with
    another --cache-dir, the advice it printed stored them where that run never looks. The printed
    advice names that cache; the judge record keeps the advice without it, the same for any cache
    (a sweep's results and a resumed run compare records)."""
    summary = tmp_path / "summary.txt"
    summary.write_text(SUMMARY)
    elsewhere = tmp_path / "my cache"
    printed, records = {}, {}
    with FakeOpenAIServer(responder=answer) as server:
        for name, cache in (("default", tmp_path / "cache"), ("elsewhere", elsewhere)):
            out = tmp_path / f"{name}.json"
            result = invoke(["score", summary, "--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache,
                             "-o", out], tmp_path)
            assert result.exit_code == 0, result.output
            printed[name] = [line for line in result.output.splitlines() if line.startswith("warning: no calibration")]
            records[name] = json.loads(out.read_text())["judge"]
        advice = f"booklens calibrate --lm openai/fake --api-base {server.url}"
    assert len(printed["default"]) == len(printed["elsewhere"]) == 1
    assert printed["default"][0].endswith(f"({advice})")
    assert printed["elsewhere"][0].endswith(f"({advice} --cache-dir '{elsewhere}')")
    assert records["elsewhere"] == records["default"]
    assert records["default"]["warning"].endswith(f"({advice})")

    listed = invoke(["judges", "--lm", "openai/fake", "--cache-dir", elsewhere], tmp_path)
    assert listed.exit_code == 0, listed.output
    warnings = [line for line in listed.output.splitlines() if line.startswith("warning: no calibration")]
    assert [line.rsplit("(", 1)[1] for line in warnings] == [
        f"booklens calibrate --lm openai/fake{how} --cache-dir '{elsewhere}')"
        for how in ("", "", " --judge binary")]


def within_window(window: int):
    """`answer` for prompts of at most `window` tokens (a quarter of their characters, with the answer
    budget); a longer one refused in llama-cpp-python's words, as a server started with that n_ctx."""
    def respond(body):
        wanted = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + (body.get("max_tokens") or 0)
        if wanted > window:
            return (400, f"Requested tokens ({wanted}) exceed context window of {window}")
        return answer(body)
    return respond


def test_calibrate_plans_the_coherence_judge_for_a_given_context_window(tmp_path):
    """A server that states no window (llama-cpp-python's) is planned for with 8,192 tokens, in which
    LONG_BOOK's summary fits; with --context-window 2048 it does not, and is refused before any call."""
    human = long_summary_fixture(tmp_path / "human")
    with FakeOpenAIServer(responder=answer) as server:
        proc = run_command(["calibrate", "--judge", "coherence", "--coherence-data", human, "--books", "2",
                            "--context-window", "2048", "--lm", "openai/fake", "--api-base", server.url,
                            "--cache-dir", tmp_path / "cache", "-o", tmp_path / "store.json"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: the summary '{LONG_BOOK}' of summary-gpt4-4096-inc.json (") and \
        "does not fit the model's 2,048-token context window even with none of the judge's demos; set " \
        "--context-window to " in lines[0]
    assert server.received == [] and not (tmp_path / "store.json").exists()


def test_calibrate_plans_for_the_window_the_server_states_before_any_call(tmp_path):
    """llama.cpp's /props says 2048 tokens: the coherence data's long summary is refused without the
    option, by the window the judges' LM will have, before any call of the judge that runs first."""
    human = long_summary_fixture(tmp_path / "human")
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    pages = {"/props": {"default_generation_settings": {"n_ctx": 2048}}}
    with FakeOpenAIServer(responder=answer, pages=pages) as server:
        proc = run_command(["calibrate", "--judge", "verification", "--judge", "coherence", "--fables-data", fables,
                            "--coherence-data", human, "--books", "2", "--lm", "openai/fake", "--api-base",
                            server.url, "--cache-dir", tmp_path / "cache", "-o", tmp_path / "store.json"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "does not fit the model's 2,048-token context window even with none of the judge's demos" in lines[0]
    assert server.received == [] and server.fetched == ["/v1/models", "/props"]


def test_calibrate_names_its_context_window_when_a_verification_prompt_is_refused_and_plans_for_it(tmp_path):
    """The annotators' quotes fill what an 8,192-token window holds: a server with 3,072 refuses the
    first prompt, and the line says which option plans for its window; with it, every claim is judged."""
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    data = json.loads(fables.read_text())
    for summaries in data["FABLES"].values():
        for claim in summaries["GPT-4"]["claims"].values():
            claim["evidence"] = [" ".join(["Mara walked along the shore, watching the boats come in."] * 400)]
    fables.write_text(json.dumps(data))
    store = tmp_path / "store.json"
    args = ["calibrate", "--judge", "verification", "--fables-data", fables, "--concurrency", "1",
            "--cache-dir", tmp_path / "cache", "-o", store]
    with FakeOpenAIServer(responder=within_window(3072)) as server:
        refused = run_command([*args, "--lm", "openai/fake", "--api-base", server.url])
        asked = len(server.received)
        planned = run_command([*args, "--lm", "openai/fake", "--api-base", server.url, "--context-window", "3072"])
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and lines[-1].endswith(
        "fit the 3072-token context window of 'openai/fake': the judge plans for a 8192-token window; set "
        "--context-window to 3072 or less"), refused.stderr
    assert asked == 1 and "Traceback" not in refused.stderr
    assert planned.returncode == 0, planned.stderr
    (entry,) = json.loads(store.read_text())["calibrations"].values()
    assert entry["n"]["claims"] == len(FIXTURE_CLAIMS) and entry["counts"]["failed"] == 0


def test_calibrate_refuses_a_context_window_larger_than_the_embedded_models(tmp_path):
    human = human_fixture(tmp_path / "human")
    proc = run_command(["calibrate", "--judge", "coherence", "--coherence-data", human, "--context-window", "16384",
                        "--cache-dir", tmp_path / "cache", "-o", tmp_path / "store.json"])
    assert proc.returncode == 2 and proc.stderr == ("error: --context-window 16384 is larger than this model's 8192: "
                                                    "set --context-window to 8192 or less\n"), proc.stderr
    assert not (tmp_path / "store.json").exists()


def test_calibrate_takes_a_context_window_within_the_one_the_server_states(tmp_path):
    """LiteLLM knows 8,192 tokens for gpt-4; a vLLM server serving a model under that name with 16,384
    states it, and a window within it is planned for, as setup_lm checks it, not refused on LiteLLM's figure."""
    pages = {"/v1/models": {"object": "list", "data": [{"id": "gpt-4", "max_model_len": 16384}]}}
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    store = tmp_path / "store.json"
    with FakeOpenAIServer(responder=answer, pages=pages) as server:
        proc = run_command(["calibrate", "--judge", "verification", "--fables-data", fables, "--context-window",
                            "12288", "--lm", "openai/gpt-4", "--api-base", server.url, "--cache-dir",
                            tmp_path / "cache", "-o", store])
        asked = len(server.served)
    assert proc.returncode == 0, proc.stderr
    (entry,) = json.loads(store.read_text())["calibrations"].values()
    assert entry["n"]["claims"] == asked == len(FIXTURE_CLAIMS)


def test_a_calibration_made_for_a_judges_window_is_the_one_runs_with_that_window_are_told(tmp_path):
    """A judge planned for a smaller window (fewer demos, less evidence) is measured as a judge of its
    own: its calibration is keyed by the window, found by a run planned for the same one, and not
    shown for the model's own window, whose advice names no window; another window's names it."""
    fables = fables_fixture(tmp_path / "FABLES.json", FIVE_BOOKS)
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara walks along the shore."]))
    cache = tmp_path / "cache"
    with FakeOpenAIServer(responder=answer) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache]
        calibrated = run_command(["calibrate", "--judge", "verification", "--fables-data", fables, "--books", "2",
                                  "--context-window", "3072", *lm])
        judged = {window: run_command(["verify", "--claims", claims, "--evidence", "none", *lm,
                                       *(["--context-window", window] if window else [])])
                  for window in (None, "3072", "4096")}
    assert calibrated.returncode == 0, calibrated.stderr
    (key, entry), = json.loads((cache / "calibration.json").read_text())["calibrations"].items()
    assert key.endswith("|window=3072") and entry["context_window"] == 3072
    lines = {window: [line for line in proc.stderr.splitlines() if line.startswith(("judge:", "warning:"))]
             for window, proc in judged.items()}
    assert lines["3072"][0].startswith("judge: default few-shot verification program (") and \
        ", planned for a 3072-token window; agreement with humans on " in lines["3072"][0], lines["3072"]
    assert not any(line.startswith("warning: no calibration") for line in lines["3072"])
    assert lines[None][-1].startswith("warning: no calibration") and "--context-window" not in lines[None][-1]
    assert lines["4096"][-1].startswith("warning: no calibration") and \
        f" --context-window 4096 --cache-dir {cache})" in lines["4096"][-1], lines["4096"]


def test_calibrate_as_library_calls_yields_each_judge_and_ends_naming_the_one_that_judged_nothing(
        tmp_path, shared_dir):
    """`booklens.calibration`'s plan, sample check and `calibrate_judges` are what `calibrate` runs."""
    import dspy

    from booklens.calibration import calibrate_judges, check_calibration_samples, plan_calibration
    from booklens.errors import BooklensError
    from booklens.lm import BooklensAdapter, make_lm

    human = shared_dir / "data" / "booookscore" / "human"
    fables = shared_dir / "data" / "fables" / "FABLES.json"
    store = tmp_path / "store.json"
    with pytest.raises(BooklensError, match="^fables_data is for the verification and binary judges"):
        plan_calibration(["coherence"], fables_data=fables, store=store)
    plan = plan_calibration(books=1, coherence_data=human, store=store)
    assert list(plan.programs) == ["coherence", "verification"] and plan.store == store

    def no_verdicts(body):
        if "[[ ## claim ## ]]" in body["messages"][-1]["content"]:
            return "Sorry, I cannot help with that."
        return answer(body)

    done = []
    with FakeOpenAIServer(responder=no_verdicts) as server, dspy.context(
            lm=make_lm("openai/fake", api_base=server.url, cache_dir=tmp_path / "cache"), adapter=BooklensAdapter()):
        check_calibration_samples(plan)
        assert server.served == []  # the samples are read and checked with no call
        with pytest.raises(BooklensError, match="^verification calibration: the judge gave no valid verdict"):
            for judged in calibrate_judges(plan, dspy.settings.lm, concurrency=2):
                done.append(judged)
    assert [(d.judge, d.not_stored) for d in done] == [("coherence", None)]
    assert done[0].usage["calls"] > 0 and done[0].entry["judge"] == "coherence"
    assert [e["judge"] for e in json.loads(store.read_text())["calibrations"].values()] == ["coherence"]
