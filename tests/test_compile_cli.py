"""`booklens compile` / `booklens evaluate` and `--program` as a user runs them (subprocesses):
an end-to-end compile and evaluation against a fake OpenAI-compatible server, and the
one-line errors for an unknown optimizer, a wrong-task artifact and a corrupted artifact."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from booklens.errors import BooklensError
from booklens.testing import FakeOpenAIServer, parse_fields, run_command

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "examples" / "sample_story.txt"


def run_cli(args, tmp_path, **env):
    """`booklens ARGS` in this process (see booklens.testing.run_command), with its own cache."""
    return run_command(args, env={**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache"), **env})


def assert_one_line_error(proc, *needles, output=None):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    if output is not None:
        assert not Path(output).exists()


def tiny_fables(path: Path) -> Path:
    """Ten books, one summary each, two faithful claims and two with 'never' that are not."""
    data = {}
    for b in range(10):
        claims = {}
        for c in range(4):
            bad = c % 2 == 1
            text = f"In book {b}, Ada {'never ' if bad else ''}visits harbor {c}."
            claims[str(c)] = {"claim": text, "label": "No" if bad else "Yes",
                              "evidence": [f"Ada walked to harbor {c} at dawn."], "reason": ["see the quote"]}
        data[f"Book {b}"] = {"GPT-4": {"summary": f"Ada visits harbors in book {b}.", "claims": claims}}
    path.write_text(json.dumps(data))
    return path


def fake_verifier(body):
    """Labels right only when the prompt carries demos; zero-shot it calls everything faithful."""
    messages = body["messages"]
    claim = parse_fields(messages[-1]["content"]).get("claim", "")
    taught = len(messages) > 2
    label = "unfaithful" if taught and "never" in claim else "faithful"
    return json.dumps({"label": label, "supporting_passages": [], "refuting_passages": [], "reason": "as quoted"})


def test_compile_then_evaluate_zero_shot_against_compiled(tmp_path):
    data = tiny_fables(tmp_path / "fables.json")
    artifact = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "2",
                        "-o", artifact, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        first = artifact.read_bytes()
        meta = json.loads(first)["metadata"]["booklens"]
        assert meta["task"] == "verification" and meta["optimizer"] == "labeled"
        assert meta["budget"]["demos"] == 2 and meta["seed"] == 0
        assert meta["dataset"]["sha256"] and meta["split"]["sizes"]["train"] == 16
        assert meta["metrics"]["dev"]["value"] == 1.0 and meta["metrics"]["test"]["value"] == 1.0
        assert meta["metrics"]["test"]["scored"] == meta["metrics"]["test"]["n"] > 0
        assert meta["lm"] == "openai/fake-model"
        assert "label accuracy" in proc.stdout and "compiled on test" in proc.stdout

        # The same command over the same cache writes the same artifact, with no new call.
        served = len(server.served)
        again = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "2",
                         "-o", artifact, *lm], tmp_path)
        assert again.returncode == 0, again.stderr
        assert artifact.read_bytes() == first and len(server.served) == served

        # A fresh cache: every call of both programs reaches the server.
        proc = run_cli(["evaluate", "verification", "--data", data, "--program", artifact, *lm,
                        "--cache-dir", tmp_path / "fresh"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        demo_prompts = [b for b in server.served[served:] if len(b["messages"]) == 2 + 2 * 2]
    header, _, metric_row = proc.stdout.splitlines()[:3]
    assert "zero-shot" in header and "verify.json" in header
    assert "0.500 [" in metric_row and "1.000 [1.000, 1.000]" in metric_row
    assert "verify.json - zero-shot: +0.500" in proc.stdout
    assert demo_prompts, "the compiled demos never reached the model"
    demo_texts = [d["claim"] for d in json.loads(first)["verify"]["demos"]]
    assert any(text in json.dumps(demo_prompts[0]["messages"]) for text in demo_texts)


def make_artifact(tmp_path, task: str, name: str) -> Path:
    """A real artifact of `task`: its zero-shot program saved with the metadata."""
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task

    spec = get_task(task)
    path = tmp_path / name
    save_program(spec.build_program(), path, task=spec.name)
    return path


def test_unknown_optimizer_is_a_one_line_error(tmp_path):
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "annealing", "-o", out], tmp_path)
    assert_one_line_error(proc, "unknown optimizer 'annealing'", "random-search", output=out)


def test_a_budget_the_optimizer_does_not_spend_is_a_one_line_error(tmp_path):
    """--trials with `labeled` would be recorded in the artifact's budget without having done anything."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    for optimizer, extra, unused in (("labeled", ["--trials", "9", "--max-rounds", "5"], "--trials, --max-rounds"),
                                     ("bootstrap", ["--candidates", "9"], "--candidates"),
                                     ("gepa", ["--demos", "2", "--minibatch-size", "3"], "--demos, --minibatch-size")):
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, *extra, "-o", out],
                       tmp_path)
        assert_one_line_error(proc, f"the {optimizer} optimizer does not use {unused}; it spends", output=out)


def test_test_size_with_no_test_is_a_one_line_error(tmp_path):
    """Nothing runs on the test split with --no-test: a --test-size would be recorded in the artifact
    (split.sizes.test) as if it had applied."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    for size in ("5", "0"):
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--no-test",
                        "--test-size", size, "-o", out], tmp_path)
        assert_one_line_error(proc, "error: --test-size sizes the test split, and --no-test scores nothing on it",
                              output=out)


def test_the_artifact_records_only_the_budget_its_optimizer_spent(tmp_path):
    """The same budget table that refuses an unspent option says what is recorded, with the failed-run
    limit the optimizer applied (it was recorded as 0, which no option sets)."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for optimizer, extra, budget in (
                ("labeled", ["--demos", "2"], {"demos": 2, "threads": 2}),
                ("bootstrap", ["--max-rounds", "2"], {"demos": 3, "threads": 2, "max_rounds": 2, "max_errors": None}),
                ("random-search", ["--candidates", "1"],
                 {"demos": 3, "candidates": 1, "threads": 2, "max_rounds": 1, "max_errors": None})):
            proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, *extra, "--no-test",
                            "-o", out, *lm], tmp_path)
            assert proc.returncode == 0, proc.stderr
            meta = json.loads(out.read_text())["metadata"]["booklens"]
            if "max_errors" in budget:  # one more than the runs it may make: (train + dev + 1) x rounds
                sizes = meta["split"]["sizes"]
                budget = {**budget, "max_errors": (sizes["train"] + sizes["dev"] + 1) * budget["max_rounds"]}
            assert meta["budget"] == budget, optimizer
            assert f", budget {budget}" in proc.stderr.splitlines()[0]
            assert "test" not in meta["metrics"]


def test_no_test_records_an_empty_test_split(tmp_path):
    """Nothing runs on the test split with --no-test: the artifact does not record the size it
    would have had (it recorded the default subset size, as if the program had been scored on it)."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        scored = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "-o", out, *lm],
                         tmp_path)
        assert scored.returncode == 0, scored.stderr
        with_test = json.loads(out.read_text())["metadata"]["booklens"]["split"]
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--no-test",
                        "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
    split = json.loads(out.read_text())["metadata"]["booklens"]["split"]
    assert with_test["sizes"]["test"] > 0 and with_test["groups"]["test"] > 0
    assert split["sizes"] == {**with_test["sizes"], "test": 0}
    assert split["groups"] == {**with_test["groups"], "test": 0}
    assert split["available"] == with_test["available"]  # the data still holds a test split
    assert " / 0 test examples" in proc.stderr.splitlines()[0]


def test_wrong_task_and_corrupted_artifacts_are_one_line_errors(tmp_path):
    data = tiny_fables(tmp_path / "fables.json")
    verify_artifact = make_artifact(tmp_path, "verification", "verify.json")

    proc = run_cli(["evaluate", "decomposition", "--data", data, "--program", verify_artifact], tmp_path)
    assert_one_line_error(proc, "compiled 'verification' program", "'decomposition'")

    out = tmp_path / "summary.json"
    proc = run_cli(["summarize", STORY, "--program", verify_artifact, "-o", out], tmp_path)
    assert_one_line_error(proc, "compiled 'verification' program", "'summarize'", output=out)

    broken = tmp_path / "broken.json"
    broken.write_text(verify_artifact.read_text()[:200])
    proc = run_cli(["evaluate", "verification", "--data", data, "--program", broken], tmp_path)
    assert_one_line_error(proc, "program artifact is not valid JSON", str(broken))


def test_malformed_artifact_metadata_is_one_line_error_in_every_command(tmp_path):
    """A list where an object belongs used to end in an internal error; no LM is reached (closed port)."""
    data = tiny_fables(tmp_path / "fables.json")
    lm = ["--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"]
    summary = tmp_path / "summary.txt"
    summary.write_text("Ada visits the harbor. She meets the keeper.")
    verify_artifact = make_artifact(tmp_path, "verification", "verify.json")
    coherence_artifact = make_artifact(tmp_path, "coherence", "coherence.json")
    for path, edit, needle in [
        (verify_artifact, lambda s: s.update(metadata=[1]), "its metadata is a list, not an object"),
        (verify_artifact, lambda s: s["metadata"]["booklens"].update(program_config="binary"),
         "its program_config is a string, not an object"),
        (verify_artifact, lambda s: s["metadata"]["booklens"].update(dataset="FABLES"),
         "its dataset is a string, not an object"),
        (coherence_artifact, lambda s: s.update(metadata=[1]), "its metadata is a list, not an object"),
    ]:
        state = json.loads(path.read_text())
        edit(state)
        broken = tmp_path / f"broken-{path.name}"
        broken.write_text(json.dumps(state))
        if path is verify_artifact:
            commands = [["evaluate", "verification", "--data", data, "--no-zero-shot"],
                        ["calibrate", "--fables-data", data, "-o", tmp_path / "cal.json"]]
        else:
            commands = [["score", summary]]
        for args in commands:
            proc = run_cli([*args, "--program", broken, *lm], tmp_path)
            assert proc.returncode == 2, proc.stderr
            assert_one_line_error(proc, f"{broken} is not a valid booklens artifact: {needle}")


@pytest.mark.parametrize("command", ["score", "claims", "verify", "check"])
def test_run_commands_accept_a_compiled_program(command, tmp_path):
    """Every run command takes --program; a wrong-task artifact stops it before any model call
    (the LM points at a closed port: reaching it would fail differently)."""
    other_artifact = make_artifact(tmp_path, "decomposition" if command == "score" else "coherence",
                                       "other.json")
    summary = tmp_path / "summary.txt"
    summary.write_text("Ada visits the harbor. She meets the keeper.")
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Ada visits the harbor."]))
    args = {"score": [summary], "claims": [summary], "verify": ["--claims", claims, "--evidence", "none"],
            "check": [STORY, summary]}[command]
    proc = run_cli([command, *args, "--program", other_artifact, "--lm", "openai/fake-model",
                    "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, "compiled '")


def test_a_compiled_coherence_program_is_not_run_without_its_demos(tmp_path):
    """compile makes per-sentence coherence programs: with --batch-size above 1 the batched predictor
    would judge with none of the compiled demos (zero-shot under the artifact's name)."""
    import dspy

    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task

    spec = get_task("coherence")
    program = spec.build_program()
    program.detect.demos = [dspy.Example(summary="Ada sails. Zed waits.", sentence="Zed waits.",
                                         verdict="confusion", questions=["Who is Zed?"],
                                         error_types=["entity omission"])]
    artifact = tmp_path / "compiled.json"
    save_program(program, artifact, task="coherence", program_config=spec.program_config)
    summary = tmp_path / "summary.txt"
    summary.write_text("Ada visits the harbor. She meets the keeper.")
    out = tmp_path / "scored.json"
    proc = run_cli(["score", summary, "--program", artifact, "--batch-size", "4", "-o", out, "--lm",
                    "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, f"{artifact} holds its 1 demo for per-sentence judging (--batch-size 1) only",
                          "drop --batch-size", output=out)


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_every_seed_option_takes_the_same_range_before_any_work(tmp_path, seed):
    """numpy's RNG takes seeds 0 .. 2**32-1: beyond them compile failed with an internal error
    and calibrate only after all its LM calls."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    with FakeOpenAIServer() as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for args in (["compile", "verification", "--data", data, "--optimizer", "labeled", "-o", out, "--no-test"],
                     ["evaluate", "verification", "--data", data],
                     ["calibrate", "--judge", "verification", "--fables-data", data, "-o", out]):
            proc = run_cli([*args, "--seed", seed, *lm], tmp_path)
            assert proc.returncode == 2, proc.stderr
            assert_one_line_error(proc, f"Invalid value for '--seed': must be from 0 to 4294967295 (got {seed})",
                                  f"booklens {args[0]}", output=out)
        assert server.received == []


def test_sentence_annotations_as_coherence_data_say_what_compile_and_evaluate_take(tmp_path):
    """compile and evaluate have no --summaries: the error names the data they do take."""
    data = tmp_path / "gpt4-2048-hier.json"
    data.write_text(json.dumps({"lighthouse": {"Zed appears.": {"questions": "Who?", "types": ["entity omission"]}}}))
    out = tmp_path / "a.json"
    for args in (["compile", "coherence", "--data", data, "--optimizer", "labeled", "-o", out],
                 ["evaluate", "coherence", "--data", data]):
        proc = run_cli([*args, "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
        assert_one_line_error(proc, f"annotation file {data} holds sentence annotations, which need the summaries "
                                    "they refer to; the coherence task learns from a BooookScore human annotation "
                                    "file such as summary-gpt4-4096-inc.json, or a folder of them", output=out)
        assert "--summaries" not in proc.stderr


def test_a_models_verdicts_are_not_taken_as_human_coherence_labels(tmp_path, shared_dir):
    """The precision study holds GPT-4's sentence verdicts; a `score` output holds the judge's own:
    neither is the human gold compile and evaluate score against."""
    study = shared_dir / "data" / "booookscore" / "human" / "annotations-gpt4-4096-inc.json"
    scored = tmp_path / "scored.json"
    scored.write_text(json.dumps({"kind": "booklens.coherence", "book": "lighthouse", "summary": "Zed appears.",
                                  "annotator": "program", "sentences": []}))
    out = tmp_path / "a.json"
    for data, who in ((study, "'gpt4'"), (scored, "'program'")):
        for args in (["compile", "coherence", "--data", data, "--optimizer", "labeled", "-o", out],
                     ["evaluate", "coherence", "--data", data]):
            proc = run_cli([*args, "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
            assert_one_line_error(proc, f"{data} holds {who} annotations, not human ones: the coherence task "
                                        "learns from a BooookScore human annotation file", output=out)


def test_evaluate_says_when_an_artifact_is_scored_on_what_it_was_compiled_on(tmp_path):
    """Another seed or the training split puts the artifact's own demos among the examples: the
    figures are not held out, and evaluate says so (and how many examples are demos)."""
    data = tiny_fables(tmp_path / "fables.json")
    artifact = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "3",
                        "--no-test", "-o", artifact, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        demos = {d["claim"] for d in json.loads(artifact.read_text())["verify"]["demos"]}
        assert len(demos) == 3

        def notes(*args):
            proc = run_cli(["evaluate", "verification", "--data", data, "--program", artifact, *args, *lm], tmp_path)
            assert proc.returncode == 0, proc.stderr
            return [line for line in proc.stderr.splitlines() if line.startswith("note: ")]

        assert notes() == []  # the test split of the seed it was compiled with
        assert notes("--split", "train", "--size", "0") == [
            f"note: {artifact} was compiled on this train split: its figures on it are not held out",
            f"note: 3 of the 16 examples are demos of {artifact}: its figures on them are inflated"]
        found = notes("--seed", "2", "--size", "0")  # seed 2's test split holds books the demos came from
        # counted, not "may hold": the books of seed 0's training split among seed 2's test examples
        from booklens.optimizers.tasks import get_task, load_task_splits

        spec = get_task("verification")
        sizes = json.loads(artifact.read_text())["metadata"]["booklens"]["split"]["sizes"]
        learned = {e.book for e in load_task_splits(spec, data, seed=0, sizes=sizes).train}
        shared = [e.book for e in load_task_splits(spec, data, seed=2, sizes={"test": 0}).test if e.book in learned]
        assert shared and len(set(shared)) < len(shared)  # the fixture makes the note count both
        books = len(set(shared))
        assert found[0] == (f"note: {artifact} was compiled with seed 0; with seed 2, {len(shared)} of the 16 test "
                            f"examples are from {books} book{'s' if books > 1 else ''} it was compiled on (use --seed 0)")
        assert re.fullmatch(rf"note: [123] of the 16 examples are demos of {re.escape(str(artifact))}: its figures "
                            "on them are inflated", found[1]), found


def test_an_artifact_run_on_another_lm_than_it_was_compiled_with_gets_a_note(tmp_path):
    """Bootstrapped demos are the compiling LM's own answers that the metric accepted: evaluate and
    the judge line say when another LM runs them, and the record names the LM. Annotated demos
    (`labeled`) were chosen by no LM: no note."""
    data = tiny_fables(tmp_path / "fables.json")
    bootstrapped, labeled = tmp_path / "bootstrapped.json", tmp_path / "labeled.json"
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara keeps the light."]))
    with FakeOpenAIServer(responder=fake_verifier) as server:
        for optimizer, artifact in (("bootstrap", bootstrapped), ("labeled", labeled)):
            proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, "--demos", "2",
                            "--no-test", "-o", artifact, "--lm", "openai/fake-model", "--api-base", server.url],
                           tmp_path)
            assert proc.returncode == 0, proc.stderr
        assert json.loads(bootstrapped.read_text())["metadata"]["booklens"]["lm"] == "openai/fake-model"

        def notes(artifact, model):
            proc = run_cli(["evaluate", "verification", "--data", data, "--program", artifact, "--no-zero-shot",
                            "--size", "2", "--lm", model, "--api-base", server.url], tmp_path)
            assert proc.returncode == 0, proc.stderr
            return [line for line in proc.stderr.splitlines() if "was compiled with openai/" in line]

        assert notes(bootstrapped, "openai/fake-model") == []
        assert notes(bootstrapped, "openai/other-model") == [
            f"note: {bootstrapped} was compiled with openai/fake-model: its demos and instructions were chosen by "
            "how that LM did with them, and may serve openai/other-model less well"]
        assert notes(labeled, "openai/other-model") == []

        out = tmp_path / "verdicts.json"
        proc = run_cli(["verify", "--claims", claims, "--book", STORY, "--evidence", "bm25", "--program", bootstrapped,
                        "--lm", "openai/other-model", "--api-base", server.url, "-o", out], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert "note: the verification program was compiled with openai/fake-model: its demos" in proc.stderr
    judge = json.loads(out.read_text())["judge"]
    assert (judge["lm"], judge["compiled_with"]) == ("openai/other-model", "openai/fake-model")


def test_summarizer_and_decomposition_artifacts_on_another_lm_get_a_note(tmp_path):
    """The programs without a judge line say it in a note of their own: summarize, claims, check, run."""
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task
    from booklens.testing import PipelineResponder

    def artifact(task: str, name: str) -> Path:  # as `compile --optimizer bootstrap --lm openai/fake-model` records it
        spec = get_task(task)
        save_program(spec.build_program(), tmp_path / name, task=spec.name, optimizer="bootstrap",
                     lm="openai/fake-model")
        return tmp_path / name

    summarizer, decomposer = artifact("summarize", "summarizer.json"), artifact("decomposition", "claims.json")
    summary = tmp_path / "summary.txt"
    summary.write_text("Mara keeps the light. Tobin brings oil for the winter.", encoding="utf-8")
    commands = [["summarize", STORY, "--program", summarizer, "-o", tmp_path / "summary.json"],
                ["claims", summary, "--program", decomposer, "-o", tmp_path / "claims-out.json"],
                ["check", STORY, summary, "--evidence", "bm25", "--program", decomposer, "-o", tmp_path / "check.json"],
                ["run", STORY, "--evidence", "bm25", "--program", summarizer, "--program", decomposer,
                 "-o", tmp_path / "run"]]
    expected = [[summarizer], [decomposer], [decomposer], [summarizer, decomposer]]
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        for model in ("openai/fake-model", "openai/other-model"):
            for args, paths in zip(commands, expected):
                proc = run_cli([*args, "--lm", model, "--api-base", server.url], tmp_path)
                assert proc.returncode == 0, proc.stderr
                notes = [line for line in proc.stderr.splitlines() if "was compiled with" in line]
                want = [] if model == "openai/fake-model" else [
                    f"note: {path} was compiled with openai/fake-model: its demos and instructions were chosen by "
                    "how that LM did with them, and may serve openai/other-model less well" for path in paths]
                assert notes == want, (args[0], model)
                if args[0] == "claims":
                    assert "2 claims; 1 LM call (0 from cache), " in proc.stderr, proc.stderr
        # An artifact of another task is refused in one line: no note about it comes first.
        wrong = artifact("verification", "verify.json")
        proc = run_cli(["summarize", STORY, "--program", wrong, "--lm", "openai/other-model", "--api-base", server.url,
                        "-o", tmp_path / "never.json"], tmp_path)
        assert_one_line_error(proc, "compiled 'verification' program", output=tmp_path / "never.json")


def test_summarize_takes_only_books_and_says_when_nothing_will_score_the_program(tmp_path):
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    with FakeOpenAIServer() as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "summarize", "--data", data, "--optimizer", "labeled", "-o", out, *lm], tmp_path)
        assert_one_line_error(proc, f"{data} is not a book: the summarize task takes a .txt or .epub book, or a "
                                    "folder of them", output=out)
        assert server.received == []
        books = tmp_path / "books"
        books.mkdir()
        (books / "story.txt").write_text(STORY.read_text())
        proc = run_cli(["compile", "summarize", "--data", books, "--optimizer", "labeled", "-o", out, *lm], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (f"note: the dev and test splits of {books} are empty: nothing will score the compiled program there "
            "(the data is split by book, 40/20/40 %: more books fill them)") in proc.stderr.splitlines()
    assert ("note: the training split holds no example the summarize program can show as a demo (labeled takes the "
            "annotated ones): the artifact is the zero-shot program") in proc.stderr.splitlines()


def lighthouse_books(folder: Path) -> Path:
    """Five small books; split by book with seed 0: train 1, 2; dev 0; test 3, 4."""
    folder.mkdir()
    for i in range(5):
        (folder / f"lighthouse{i}.txt").write_text(f"The keeper of lighthouse {i} lit the lamp every night. " * 30)
    return folder


def lighthouse_judge(broken: set[int]):
    """Summaries of two sentences, the second confusing (BooookScore 0.5); the judge answers garbage
    on the summaries of the books in `broken`."""
    def answer(body):
        last = str(body["messages"][-1]["content"])
        book = int(re.search(r"lighthouse (\d+)", last).group(1))
        if "as plain text" in last:
            return f"The keeper of lighthouse {book} lit the lamp. A stranger hides the key of lighthouse {book}."
        if book in broken:
            return json.dumps({"answers": ["garbage"]})
        answers = []
        for line in parse_fields(last)["sentences"].splitlines():
            number, _, sentence = line.partition(":")
            if number.strip().isdigit():
                confusing = "hides" in sentence
                answers.append({"number": int(number), "verdict": "confusion" if confusing else "no confusion",
                                "questions": ["Who is the stranger?"] if confusing else [],
                                "error_types": ["entity omission"] if confusing else []})
        return json.dumps({"answers": answers})
    return answer


NO_VERDICT = "no score: the judge gave no valid verdict on any of the 2 sentences (first: no answer for sentence 1)"


def test_a_summary_the_judge_gave_no_verdict_on_is_a_failure_left_out_of_the_booookscore(tmp_path):
    """Not a BooookScore of 0: the summary has no score, like a `score` whose judge answered nothing."""
    books = lighthouse_books(tmp_path / "books")
    with FakeOpenAIServer(responder=lighthouse_judge({3})) as server:
        proc = run_cli(["evaluate", "summarize", "--data", books, "--lm", "openai/fake-model", "--api-base",
                        server.url, "-o", tmp_path / "eval.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {cells[0]: cells[1] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()[2:8])}
    assert rows["BooookScore (95% CI)"] == "0.500"  # book 4's summary alone: one unit, no interval
    assert rows["examples (failed)"] == "2 (1)"
    assert ("The BooookScore means leave out the examples the metric has no score for (counted as failed): "
            "1 of 2 for zero-shot.") in proc.stdout.splitlines()
    assert proc.stderr.splitlines() == [f"zero-shot: 1 failed example(s), e.g. {NO_VERDICT}",
                                        f"wrote {tmp_path / 'eval.json'}"]
    result = json.loads((tmp_path / "eval.json").read_text())["results"][0]
    assert (result["n"], result["scored"], result["failures"], result["metric"]) == (2, 1, 1, 0.5)


def test_a_judge_that_never_gives_a_verdict_ends_evaluate_and_compile_summarize_in_one_line(tmp_path):
    books = lighthouse_books(tmp_path / "books")
    out = tmp_path / "summarizer.json"
    with FakeOpenAIServer(responder=lighthouse_judge(set(range(5)))) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["evaluate", "summarize", "--data", books, *lm], tmp_path)
        assert_one_line_error(proc, "error: zero-shot failed on every example; the first failure: " + NO_VERDICT)
        assert proc.stdout == ""
        # The compile itself fails: nothing to write.
        proc = run_cli(["compile", "summarize", "--data", books, "--optimizer", "bootstrap", "-o", out, *lm],
                       tmp_path)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr and not out.exists(), proc.stderr
        errors = [line for line in proc.stderr.splitlines() if not line.startswith(("compiling ", "note: "))]
        assert errors == ["error: compiling with bootstrap failed on every example it scored; the first failure: "
                          + NO_VERDICT], proc.stderr
        # The compile succeeds and only its scoring fails: the program is written, unscored, and the
        # command still fails, at the first split that failed (test is not asked after dev).
        served = len(server.served)
        proc = run_cli(["compile", "summarize", "--data", books, "--optimizer", "labeled", "-o", out, *lm],
                       tmp_path)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if not line.startswith(("compiling ", "note: "))]
        assert errors == [f"wrote {out}",
                          f"error: compiled on dev failed on every example; the first failure: {NO_VERDICT} "
                          f"({out} holds the compiled program, not scored on dev: `booklens evaluate summarize "
                          f"--data {books} --program {out} --split dev` scores it)"], proc.stderr
        meta = json.loads(out.read_text())["metadata"]["booklens"]
        assert meta["optimizer"] == "labeled" and meta["metrics"] == {}
        # only book 0, the dev split, was asked about: the test books 3 and 4 were not
        asked = {re.search(r"lighthouse (\d+)", str(b["messages"][-1]["content"])).group(1)
                 for b in server.served[served:]}
        assert asked == {"0"}


def test_evaluate_scores_an_artifact_on_the_split_its_compile_scored(tmp_path):
    """A program compiled with --test-size is evaluated on the same test examples by default, so
    that evaluate gives the figure compile reported; --size still chooses, and an artifact compiled
    with --no-test (nothing scored on the test split) leaves the task's subset size."""
    data = tiny_fables(tmp_path / "fables.json")
    artifact, untested = tmp_path / "verify.json", tmp_path / "untested.json"

    def half_right(body):  # wrong on the claims of even books: subsets of other books score otherwise
        answer = json.loads(fake_verifier(body))
        claim = parse_fields(body["messages"][-1]["content"]).get("claim", "")
        if int(re.search(r"book (\d+)", claim).group(1)) % 2 == 0:
            answer["label"] = "unfaithful" if answer["label"] == "faithful" else "faithful"
        return json.dumps(answer)

    with FakeOpenAIServer(responder=half_right) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "2",
                        "--test-size", "6", "-o", artifact, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "2",
                        "--no-test", "-o", untested, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        reported = json.loads(artifact.read_text())["metadata"]["booklens"]["metrics"]["test"]

        def evaluated(program, *args):
            out = tmp_path / "evaluation.json"
            proc = run_cli(["evaluate", "verification", "--data", data, "--program", program, "--no-zero-shot",
                            *args, "-o", out, *lm], tmp_path)
            assert proc.returncode == 0, proc.stderr
            return json.loads(out.read_text())["results"][0]

        result = evaluated(artifact)
        assert (result["n"], result["metric"], result["ci95"]) == (6, reported["value"], reported["ci95"])
        assert evaluated(artifact, "--size", "0")["n"] == 16
        assert evaluated(artifact, "--seed", "1")["n"] == 16  # another split: the task's subset size
        assert evaluated(untested)["n"] == 16  # the task's 24, more than the split holds


def test_the_same_data_named_by_its_folder_or_its_file_is_the_same_data(tmp_path):
    """FABLES given as its folder (which holds a licence too) or as FABLES.json is the one file the
    task reads: evaluate takes it as the data the artifact was compiled on (no note that its splits
    may overlap, and the split size compile scored)."""
    folder = tmp_path / "fables"
    folder.mkdir()
    data = tiny_fables(folder / "FABLES.json")
    (folder / "LICENSE").write_text("terms\n")
    artifact = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "verification", "--data", folder, "--optimizer", "labeled", "--demos", "2",
                        "--test-size", "6", "-o", artifact, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = tmp_path / "evaluation.json"
        proc = run_cli(["evaluate", "verification", "--data", data, "--program", artifact, "--no-zero-shot",
                        "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert "note:" not in proc.stderr
    assert json.loads(out.read_text())["results"][0]["n"] == 6


def test_demos_0_with_an_optimizer_that_only_picks_demos_is_a_one_line_error(tmp_path):
    """labeled, bootstrap and random-search choose demos and nothing else: with --demos 0 the artifact
    is the zero-shot program (labeled said the training split held no usable example)."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    for optimizer in ("labeled", "bootstrap", "random-search"):
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, "--demos", "0",
                        "-o", out], tmp_path)
        assert_one_line_error(proc, f"--demos 0 leaves the {optimizer} optimizer nothing to choose", output=out)


def test_more_demos_than_the_training_split_holds_is_a_one_line_error_before_any_call(tmp_path):
    """Demos come from the training split: asking for more than it holds would record a budget the
    artifact does not have (--demos 100000 in its metadata, 16 demos in its predictors)."""
    data = tiny_fables(tmp_path / "fables.json")  # 16 training claims
    out = tmp_path / "a.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for optimizer in ("labeled", "bootstrap", "random-search", "mipro"):
            proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, "--demos", "100000",
                            "-o", out, *lm], tmp_path)
            assert_one_line_error(proc, "--demos 100000", "16 examples", "--train-size", output=out)
        assert server.received == []
        # As many demos as there are training examples is a budget it can spend.
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--demos", "16",
                        "--no-test", "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert len(json.loads(out.read_text())["verify"]["demos"]) == 16
        # A default above what the split holds is no request: it spends what there is, and records that.
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--train-size", "2",
                        "--no-test", "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        state = json.loads(out.read_text())
        assert len(state["verify"]["demos"]) == 2 and state["metadata"]["booklens"]["budget"]["demos"] == 2


def test_a_size_above_what_the_split_holds_is_a_one_line_error_before_any_call(tmp_path):
    """--train-size, --dev-size, --test-size and evaluate's --size ask for that many examples: more
    than the split holds is refused, naming how many it does, rather than run on fewer than asked
    (0 still means all of them, and a task's default subset size may exceed a small split)."""
    data = tiny_fables(tmp_path / "fables.json")  # 16 training, 8 dev and 16 test claims
    out = tmp_path / "a.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for option, split, held in (("--train-size", "training", 16), ("--dev-size", "dev", 8),
                                    ("--test-size", "test", 16)):
            proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", option, "100000",
                            "-o", out, *lm], tmp_path)
            assert_one_line_error(proc, f"{option} 100000 asks for more examples than the {held} of the {split} "
                                        f"split of {data} (split by book with seed 0): give at most {held}, or 0 "
                                        "for all of them", output=out)
        proc = run_cli(["evaluate", "verification", "--data", data, "--size", "17", *lm], tmp_path)
        assert_one_line_error(proc, f"--size 17 asks for more examples than the 16 of the test split of {data} "
                                    "(split by book with seed 0): give at most 16, or 0 for all of them")
        proc = run_cli(["evaluate", "verification", "--data", data, "--split", "dev", "--size", "9", "--seed", "0",
                        *lm], tmp_path)
        assert_one_line_error(proc, "--size 9 asks for more examples than the 8 of the dev split")
        assert server.received == []
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "labeled", "--train-size", "16",
                        "--dev-size", "8", "--test-size", "16", "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(out.read_text())["metadata"]["booklens"]["split"]["sizes"] == {"train": 16, "dev": 8,
                                                                                         "test": 16}


def test_a_coherence_size_above_six_sentences_a_summary_is_a_one_line_error(tmp_path, shared_dir):
    """Coherence subsets read at most 6 sentences of each summary: a size between what that gives
    and the whole split (0) came out at that cap, fewer than asked, and said nothing."""
    human = shared_dir / "data" / "booookscore" / "human"
    with FakeOpenAIServer(responder=coherence_answer) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["evaluate", "coherence", "--data", human, "--size", "3000", *lm], tmp_path)
        assert_one_line_error(proc, f"--size 3000 asks for more examples than the 480 the test split of {human} "
                                    "gives at 6 per summary (split by book with seed 0): give at most 480, or 0 for "
                                    "all 3197 of them")
        proc = run_cli(["compile", "coherence", "--data", human, "--optimizer", "labeled", "--train-size", "1000",
                        "-o", tmp_path / "a.json", *lm], tmp_path)
        assert_one_line_error(proc, "--train-size 1000 asks for more examples than the ", " the training split of ",
                              output=tmp_path / "a.json")
        assert server.received == []


def test_a_coherence_program_compiled_to_new_instructions_is_not_run_batched(tmp_path):
    """MIPROv2 and GEPA compile instructions, not only demos, and compile runs the per-sentence
    predictor only: with --batch-size above 1 the batched one would judge with nothing compile chose
    (the original instructions, or ones no run ever scored) under the artifact's name."""
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task

    spec = get_task("coherence")
    program = spec.build_program()
    program.detect.signature = program.detect.signature.with_instructions("Flag every sentence about Zed.")
    artifact = tmp_path / "compiled.json"
    save_program(program, artifact, task="coherence", program_config=spec.program_config, optimizer="mipro")
    summary = tmp_path / "summary.txt"
    summary.write_text("Ada visits the harbor. She meets the keeper.")
    out = tmp_path / "scored.json"
    proc = run_cli(["score", summary, "--program", artifact, "--batch-size", "4", "-o", out, "--lm",
                    "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, f"{artifact} was compiled for per-sentence judging (--batch-size 1)",
                          "drop --batch-size", output=out)


def test_mipro_without_candidates_or_trials_is_refused_before_the_lm_starts(tmp_path):
    """MIPROv2 needs a candidate and a trial: said before any LM call (the embedded model loads for
    minutes), not after the first one."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    for extra in (["--candidates", "0"], ["--trials", "0"]):
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "mipro", *extra, "-o", out,
                        "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
        assert_one_line_error(proc, "mipro needs --candidates and --trials of at least 1", output=out)


def test_a_mipro_minibatch_larger_than_the_dev_split_is_refused_before_the_lm_starts(tmp_path):
    """A minibatch as large as the dev split is the whole of it: a larger one would be recorded in the
    artifact's budget while every trial was scored on the whole dev split."""
    data = tiny_fables(tmp_path / "fables.json")  # 8 dev claims
    out = tmp_path / "a.json"
    proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "mipro", "--minibatch-size", "9",
                    "-o", out, "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, "--minibatch-size 9", "8 examples", output=out)


@pytest.mark.parametrize("command", ["compile", "evaluate"])
@pytest.mark.parametrize("task", ["verification", "decomposition"])
def test_a_folder_without_fables_json_is_a_one_line_error(command, task, tmp_path):
    """A folder names the FABLES release by its FABLES.json: evaluate digests the data before it
    reads it, and a folder without one must not end in an internal error there."""
    folder = tmp_path / "fables"
    folder.mkdir()
    out = tmp_path / "a.json"
    extra = ["--optimizer", "labeled", "-o", out] if command == "compile" else []
    proc = run_cli([command, task, "--data", folder, *extra, "--lm", "openai/fake-model",
                    "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, f"FABLES data not found: {folder / 'FABLES.json'}")


def test_gepa_without_trials_is_refused_before_the_lm_starts(tmp_path):
    """GEPA's only work is its reflective proposals: with --trials 0 it scores the dev split and
    returns the program it was given, an artifact that is the zero-shot program."""
    data = tiny_fables(tmp_path / "fables.json")
    out = tmp_path / "a.json"
    proc = run_cli(["compile", "verification", "--data", data, "--optimizer", "gepa", "--trials", "0", "-o", out,
                    "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
    assert_one_line_error(proc, "--trials 0 leaves the gepa optimizer nothing to do", output=out)


def test_an_artifact_recording_its_folders_digest_is_still_on_the_same_data(tmp_path):
    """Artifacts compiled before the digest named the files a task reads recorded the digest of the
    whole folder given: evaluate on that folder still takes it as the same data."""
    from booklens.optimizers.artifacts import sha256_of

    folder = tmp_path / "fables"
    folder.mkdir()
    tiny_fables(folder / "FABLES.json")
    (folder / "LICENSE").write_text("terms\n")
    artifact = tmp_path / "verify.json"
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli(["compile", "verification", "--data", folder, "--optimizer", "labeled", "--demos", "2",
                        "--test-size", "6", "-o", artifact, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        state = json.loads(artifact.read_text())
        state["metadata"]["booklens"]["dataset"]["sha256"] = sha256_of(folder)
        artifact.write_text(json.dumps(state))
        out = tmp_path / "evaluation.json"
        proc = run_cli(["evaluate", "verification", "--data", folder, "--program", artifact, "--no-zero-shot",
                        "-o", out, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert "note:" not in proc.stderr
    assert json.loads(out.read_text())["results"][0]["n"] == 6


def test_an_optimizer_that_chooses_on_dev_with_no_dev_split_is_one_line(tmp_path):
    """Two books leave the dev split empty: the optimizers that choose on it stop in one line, not
    after a note that nothing will score the program there and the line that compiling began."""
    data = tmp_path / "fables.json"
    full = json.loads(tiny_fables(tmp_path / "ten.json").read_text())
    data.write_text(json.dumps({book: full[book] for book in ("Book 0", "Book 1")}))
    out = tmp_path / "a.json"
    for optimizer in ("random-search", "mipro", "gepa"):
        proc = run_cli(["compile", "verification", "--data", data, "--optimizer", optimizer, "-o", out,
                        "--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"], tmp_path)
        assert_one_line_error(proc, f"optimizer '{optimizer}' chooses among candidates on a dev set, and the dev "
                                    f"split of {data} is empty", output=out)


def test_calibrate_takes_the_fables_folder_as_compile_does(tmp_path):
    """compile --data takes FABLES.json or its folder; calibrate --fables-data refused the folder. Both
    read the file the verification task reads from the path, and store the same calibration."""
    folder = tmp_path / "fables"
    folder.mkdir()
    tiny_fables(folder / "FABLES.json")
    (folder / "README.txt").write_text("not FABLES")
    stores = {name: tmp_path / f"{name}.json" for name in ("folder", "file")}
    with FakeOpenAIServer(responder=fake_verifier) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        for name, data in (("folder", folder), ("file", folder / "FABLES.json")):
            proc = run_cli(["calibrate", "--judge", "verification", "--fables-data", data, "-o", stores[name], *lm],
                           tmp_path)
            assert proc.returncode == 0, proc.stderr
    entries = [json.loads(stores[name].read_text())["calibrations"] for name in ("folder", "file")]
    assert entries[0] == entries[1]
    (entry,) = entries[0].values()
    assert [f["name"] for f in entry["data"]["files"]] == ["FABLES.json"] and entry["n"]["claims"] > 0


def test_closed_book_verification_refuses_a_compiled_verifier_before_any_call(tmp_path):
    """compile runs and scores the verifier with evidence; --evidence none runs its other predictor,
    which compile never ran, under the artifact's name: refused (the LM is a closed port)."""
    artifact = make_artifact(tmp_path, "verification", "verify.json")
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Ada visits the harbor."]))
    summary = tmp_path / "summary.txt"
    summary.write_text("Ada visits the harbor. She meets the keeper.")
    out = tmp_path / "out.json"
    lm = ["--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"]
    for args in (["verify", "--claims", claims], ["check", STORY, summary]):
        proc = run_cli([*args, "--evidence", "none", "--program", artifact, "-o", out, *lm], tmp_path)
        assert_one_line_error(proc, f"{artifact} was compiled with evidence; closed-book verification (evidence "
                                    "none) runs a predictor it did not compile", output=out)
    from booklens.pipeline import JudgeConfig, load_judge_programs

    with pytest.raises(BooklensError, match="closed-book verification"):
        load_judge_programs(JudgeConfig(evidence="none", programs={"verification": artifact}))
    # The shipped judge's closed-book demos are annotations chosen for it: it still runs closed-book.
    assert load_judge_programs(JudgeConfig(evidence="none"))["verification"].verify_without_evidence.demos


def test_evaluate_refuses_the_binary_rater_saying_how_to_measure_it(tmp_path):
    """compile makes four-way verifiers, which evaluate runs; the binary rater (the shipped one, or one
    built with `judges build`) is measured by calibrate: the refusal says so, before any call."""
    import shutil

    from booklens.judges import default_path

    data = tiny_fables(tmp_path / "fables.json")
    built = tmp_path / "judges" / "verification-binary.json"
    built.parent.mkdir()
    shutil.copy(default_path("binary"), built)
    out = tmp_path / "eval.json"
    lm = ["--lm", "openai/fake-model", "--api-base", "http://127.0.0.1:9/v1"]
    for artifact, hint in ((default_path("binary"), "booklens calibrate --judge binary"),
                           (built, f"booklens calibrate --program {built}")):
        proc = run_cli(["evaluate", "verification", "--data", data, "--program", artifact, "-o", out, *lm], tmp_path)
        assert_one_line_error(proc, f"{artifact} is the binary (faithful / unfaithful) rater; evaluate runs the "
                                    "four-way verifiers compile makes", f"measure it with `{hint}`", output=out)


def coherence_answer(body):
    """Confusion on the sentences naming Zed, none on the others."""
    user = body["messages"][-1]["content"]
    sentence = user.split("[[ ## sentence ## ]]", 1)[-1].strip().split("\n\n")[0]
    if "Zed" in sentence:
        return json.dumps({"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission"]})
    return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_a_summary_too_long_for_the_window_is_refused_before_any_call(command, tmp_path):
    """As score and calibrate do: a test-split summary that does not fit the model's window even with
    no demo was found at its own call, after the compile and the summaries judged before it."""
    from test_judges import long_human_fixture

    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task

    human = long_human_fixture(tmp_path / "human")  # split with seed 0: gamma, the long one, is in test
    artifact = tmp_path / "coherence.json"
    # an artifact compiled elsewhere, whose notes (other data, another LM) are not printed before the refusal
    other = tmp_path / "other.json"
    save_program(get_task("coherence").build_program(), other, task="coherence", optimizer="bootstrap",
                 lm="openai/gpt-4o", dataset={"path": "elsewhere", "sha256": "0" * 64})
    args = (["compile", "coherence", "--data", human, "--optimizer", "labeled", "--demos", "1", "-o", artifact]
            if command == "compile" else
            ["evaluate", "coherence", "--data", human, "--split", "test", "--program", other])
    with FakeOpenAIServer(responder=coherence_answer) as server:  # a model whose 8,192-token window LiteLLM knows
        proc = run_cli([*args, "--lm", "openai/gpt-4", "--api-base", server.url], tmp_path)
        served = len(server.served)
    assert_one_line_error(proc, "error: the summary 'gamma' of summary-gpt4-4096-inc.json (",
                          "does not fit the model's 8,192-token context window even with none of the judge's demos",
                          output=artifact)
    assert served == 0


def test_a_compiled_program_whose_instructions_leave_a_summary_no_room_is_written_but_not_scored(tmp_path,
                                                                                                  monkeypatch):
    """mipro and gepa write instructions of their own: long ones can leave a dev or test summary no
    room in the window, which the check before the compile (on the uncompiled program) cannot see.
    The artifact is still written; the splits are not scored, with a note, instead of sending
    prompts the window cannot hold."""
    from test_judges import long_human_fixture

    import booklens.optimizers.compile as compile_module

    human = long_human_fixture(tmp_path / "human")
    data = json.loads((human / "summary-gpt4-4096-inc.json").read_text())
    data["gamma"]["summary"] = " ".join(data["gamma"]["summary"].split(". ")[:3])  # every summary fits
    (human / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    compile_program = compile_module.compile_program

    def wordy(*args, **kwargs):
        program = compile_program(*args, **kwargs)
        for _, predictor in program.named_predictors():
            predictor.signature = predictor.signature.with_instructions("Read every sentence slowly. " * 2000)
        return program

    monkeypatch.setattr(compile_module, "compile_program", wordy)
    artifact = tmp_path / "coherence.json"
    with FakeOpenAIServer(responder=coherence_answer) as server:  # a model whose 8,192-token window LiteLLM knows
        proc = run_cli(["compile", "coherence", "--data", human, "--optimizer", "labeled", "--demos", "1",
                        "-o", artifact, "--lm", "openai/gpt-4", "--api-base", server.url], tmp_path)
        served = len(server.served)
    assert proc.returncode == 0, proc.stderr
    assert served == 1  # the compile's one trial call (labeled makes no other); no scoring call was sent
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: the compiled program is not scored")]
    assert [n.split(":")[1].split()[-1] for n in notes] == ["dev", "test"], proc.stderr
    assert "does not fit the model's 8,192-token context window" in notes[0]
    block = json.loads(artifact.read_text())
    assert not block.get("metrics")


def test_a_prompt_too_large_mid_compile_is_one_line_and_the_rerun_asks_only_the_rest(tmp_path):
    """The context window's error that stops the optimizer is the command's one line (the server's
    figures in it), no artifact is written, and the same command, once the prompts fit, asks only the
    calls the first run did not get."""
    from booklens.testing import Reply

    data = tiny_fables(tmp_path / "fables.json")
    artifact = tmp_path / "verify.json"
    answered, window = [], [True]

    def small_window(body):
        if window[0] and len(answered) >= 2:
            return Reply(status=400, error="This model's maximum context length is 8192 tokens. However, your "
                                           "messages resulted in 9000 tokens.", error_code="context_length_exceeded")
        answered.append(body)
        return fake_verifier(body)

    args = ["compile", "verification", "--data", data, "--optimizer", "bootstrap", "--demos", "2",
            "--threads", "1", "--no-test", "-o", artifact]
    with FakeOpenAIServer(responder=small_window) as server:
        lm = ["--lm", "openai/fake-model", "--api-base", server.url]
        proc = run_cli([*args, *lm], tmp_path)
        assert proc.returncode != 0 and not artifact.exists()
        lines = proc.stderr.strip().splitlines()  # what the command starts, then the error alone
        assert len(lines) == 2 and lines[0].startswith("compiling verification"), proc.stderr
        assert lines[1].startswith("error: ") and "9000" in lines[1] and "8192" in lines[1]
        assert len(answered) == 2  # the first run and one of the optimizer's: no other went out
        window[0] = False
        proc = run_cli([*args, *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        rerun = len(answered) - 2
        proc = run_cli([*args, *lm], tmp_path / "fresh")
        assert proc.returncode == 0, proc.stderr
        fresh = len(answered) - 2 - rerun  # a cache of its own: every call the compile makes
        assert rerun == fresh - 2 > 0


def mid_length_human_fixture(folder: Path) -> Path:
    """`long_human_fixture` with gamma's summary (test split, seed 0) cut to fit an 8,192-token window
    with the judge's demos left out, but not a 2,048-token one."""
    from test_judges import long_human_fixture

    human = long_human_fixture(folder)
    path = human / "summary-gpt4-4096-inc.json"
    data = json.loads(path.read_text())
    data["gamma"]["summary"] = " ".join(data["gamma"]["summary"].split(". ")[:150])
    path.write_text(json.dumps(data))
    return human


def coherence_command(command: str, human: Path, tmp_path: Path) -> list:
    return (["compile", "coherence", "--data", human, "--optimizer", "labeled", "--demos", "1",
             "-o", tmp_path / "coherence.json"] if command == "compile" else
            ["evaluate", "coherence", "--data", human, "--split", "test", "--threads", "1"])


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_the_coherence_task_plans_for_a_given_context_window(command, tmp_path):
    """A server that states no window (llama-cpp-python's) is planned for with 8,192 tokens, in which
    gamma's summary fits; with --context-window 2048 it does not, and is refused before any call."""
    human = mid_length_human_fixture(tmp_path / "human")
    with FakeOpenAIServer(responder=coherence_answer) as server:
        proc = run_cli([*coherence_command(command, human, tmp_path), "--context-window", "2048",
                        "--lm", "openai/fake", "--api-base", server.url], tmp_path)
    assert_one_line_error(proc, "error: the summary 'gamma' of summary-gpt4-4096-inc.json (",
                          "does not fit the model's 2,048-token context window even with none of the judge's demos",
                          output=tmp_path / "coherence.json")
    assert server.received == []
    # The option set the window, so the line names it with the window that fits (it said to use
    # another model), and that window runs.
    fitting = re.search(r"; set --context-window to (\d+) or more$", proc.stderr.strip())
    assert fitting, proc.stderr
    with FakeOpenAIServer(responder=coherence_answer) as server:
        proc = run_cli([*coherence_command(command, human, tmp_path), "--context-window", fitting.group(1),
                        "--lm", "openai/fake", "--api-base", server.url], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert server.received


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_a_coherence_prompt_a_server_refuses_names_the_context_window_option(command, tmp_path):
    """gamma's summary fits the 8,192 tokens planned for a server that states no window; one started
    with 3,072 refuses it, and the line says which option plans for that window."""
    from booklens.testing import Reply

    human = mid_length_human_fixture(tmp_path / "human")

    def within_3072(body):
        wanted = sum(len(m["content"]) for m in body["messages"]) // 4 + (body.get("max_tokens") or 0)
        if wanted > 3072:
            return Reply(status=400, error=f"Requested tokens ({wanted}) exceed context window of 3072")
        return coherence_answer(body)

    with FakeOpenAIServer(responder=within_3072) as server:
        proc = run_cli([*coherence_command(command, human, tmp_path), "--lm", "openai/fake", "--api-base",
                        server.url], tmp_path)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert last.startswith("error: ") and last.endswith(
        "fit the 3072-token context window of 'openai/fake': the judge plans for a 8192-token window; set "
        "--context-window to 3072 or less"), proc.stderr
    assert not (tmp_path / "coherence.json").exists()


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_a_context_window_larger_than_the_embedded_models_is_refused(command, tmp_path):
    from test_judges import long_human_fixture

    human = long_human_fixture(tmp_path / "human")
    proc = run_cli([*coherence_command(command, human, tmp_path), "--context-window", "16384"], tmp_path)
    assert_one_line_error(proc, output=tmp_path / "coherence.json")
    assert proc.stderr == ("error: --context-window 16384 is larger than this model's 8192: set --context-window to "
                           "8192 or less\n")


@pytest.mark.parametrize("command", ["compile", "evaluate"])
@pytest.mark.parametrize("task", ["verification", "decomposition"])
def test_context_window_is_refused_for_the_tasks_whose_prompts_it_does_not_size(command, task, tmp_path):
    data = tiny_fables(tmp_path / "fables.json")
    args = ([command, task, "--data", data, "--context-window", "2048"] +
            (["--optimizer", "labeled", "-o", tmp_path / "out.json"] if command == "compile" else []))
    proc = run_cli(args, tmp_path)
    assert_one_line_error(proc, output=tmp_path / "out.json")
    assert proc.stderr == ("error: --context-window is the window the coherence judge's and the summarize task's "
                           f"prompts are planned for; the {task} task's prompts are not sized by a window: leave it "
                           "out\n")


@pytest.mark.parametrize("command", ["compile", "evaluate"])
@pytest.mark.parametrize("task, options, line", [
    ("coherence", ["--chunk-size", "512"], "--chunk-size sets the summarize task's summarizer; the coherence task "
                                           "runs none: leave it out"),
    ("verification", ["--max-summary-tokens", "900", "--chunk-size", "2048"],
     "--chunk-size and --max-summary-tokens set the summarize task's summarizer; the verification task runs none: "
     "leave them out"),
])
def test_summarizer_options_are_refused_for_the_tasks_that_run_no_summarizer(command, task, options, line, tmp_path):
    """Even at their default values: given, they would be taken to have shaped the figures."""
    if task == "verification":
        data = tiny_fables(tmp_path / "fables.json")
    else:
        data = tmp_path / "human"  # refused before it is read
        data.mkdir()
    args = ([command, task, "--data", data, *options] +
            (["--optimizer", "labeled", "-o", tmp_path / "out.json"] if command == "compile" else []))
    proc = run_cli(args, tmp_path)
    assert_one_line_error(proc, output=tmp_path / "out.json")
    assert proc.stderr == f"error: {line}\n"


def test_compile_and_evaluate_as_library_calls(tmp_path):
    """`booklens.optimizers.workflow` is what the two commands run: plan (no LM), then run."""
    import dspy

    from booklens.lm import BooklensAdapter, make_lm
    from booklens.optimizers.workflow import compile_task, evaluate_task, plan_compile

    data = tiny_fables(tmp_path / "fables.json")
    artifact = tmp_path / "verify.json"
    said = []
    with FakeOpenAIServer(responder=fake_verifier) as server, dspy.context(
            lm=make_lm("openai/fake-model", api_base=server.url, cache_dir=tmp_path / "cache"),
            adapter=BooklensAdapter()):
        # a plan that cannot run is refused before any call, as the command refuses it
        with pytest.raises(BooklensError, match="^test_size sizes the test split, and evaluate_test=False scores "
                                                "nothing"):
            plan_compile("verification", data, artifact, optimizer="labeled", test_size=2, evaluate_test=False)
        assert server.served == []
        done = compile_task("verification", data, artifact, optimizer="labeled", demos=2, notify=said.append)
        assert said[0].startswith("compiling verification with labeled: 16 train / ") and said[-1] == f"wrote {artifact}"
        assert [r.label for r in done.results] == ["compiled on dev", "compiled on test"]
        assert done.artifact["metrics"]["test"]["value"] == 1.0
        assert json.loads(artifact.read_text())["metadata"]["booklens"]["metrics"] == done.artifact["metrics"]
        assert "label accuracy" in done.summary()
        compared = evaluate_task("verification", data, programs=[artifact])
    assert [r.label for r in compared.results] == ["zero-shot", "verify.json"]
    assert [compared.as_dict()["results"][i]["metric"] for i in (0, 1)] == [0.5, 1.0]
    assert compared.as_dict()["lm"] == "openai/fake-model"
