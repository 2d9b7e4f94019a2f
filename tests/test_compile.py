"""Compiling with every optimizer, artifacts, loading checks and evaluation, with a scripted LM.

The scripted "model" classifies the mood of a text correctly only when its prompt teaches it:
when the prompt carries demos or an instruction that names MOOD-RULE. Zero-shot it always
answers "happy". So a compiled program scores better than the zero-shot one exactly when the
compiled demos or instructions reach the prompt.
"""

from __future__ import annotations

import json
import math
import re
from typing import Literal

import booklens  # noqa: F401  (offline defaults before dspy/litellm load)
import dspy
import pytest

from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter, configure
from booklens.lm.usage import UsageTracker, usage_scope
from booklens.optimizers.artifacts import (
    ARTIFACT_FORMAT_VERSION,
    artifact_metadata,
    load_program,
    save_program,
)
from booklens.optimizers.compile import OPTIMIZERS, Budget, compile_program, usable_demos
from booklens.optimizers.evaluate import EvalResult, bootstrap_ci, evaluate_program, format_table, metered
from booklens.optimizers.tasks import Task, subsample
from booklens.programs.base import Module, Predict
from booklens.testing import ScriptedLM

RULE = "MOOD-RULE"
HAPPY = ["sunny", "glad", "bright", "joy", "smile", "warm"]
SAD = ["rain", "tears", "grey", "loss", "cold", "alone"]


class Mood(dspy.Signature):
    """Say whether the text sounds happy or sad."""

    text: str = dspy.InputField()
    label: Literal["happy", "sad"] = dspy.OutputField()


# On booklens's program bases, as the shipped programs are: DSPy's own classes walk the whole stack on
# every call (see programs/base.py), a fifth of this file's time.
class MoodProgram(Module):
    def __init__(self):
        super().__init__()
        self.classify = Predict(Mood)

    def forward(self, text):
        return self.classify(text=text)


class TwoStepProgram(Module):
    """Another program shape: artifacts of MoodProgram must not load into it."""

    def __init__(self):
        super().__init__()
        self.first = Predict(Mood)
        self.second = Predict(Mood)

    def forward(self, text):
        return self.second(text=text)


def mood_examples() -> list[dspy.Example]:
    out = []
    for i in range(12):
        out.append(dspy.Example(text=f"a {HAPPY[i % 6]} day, number {i}", label="happy", book=f"h{i}",
                                note="extra field").with_inputs("text"))
        out.append(dspy.Example(text=f"a {SAD[i % 6]} day, number {i}", label="sad", book=f"s{i}",
                                note="extra field").with_inputs("text"))
    return out


def responder(call):
    if not call.output_fields:  # a free-form prompt: GEPA's reflection asks for a new instruction
        return f"```\nDecide by the {RULE}: sunny, glad, bright, joy, smile and warm mean happy; else sad.\n```"
    if call.output_fields == ["label"] and "text" in call.inputs:
        taught = RULE in call.system or len(call.messages) > 2  # an instruction or demos in the prompt
        text = call.inputs["text"]
        if taught:
            return {"label": "happy" if any(w in text for w in HAPPY) else "sad"}
        return {"label": "happy"}
    # MIPRO's proposer steps (dataset observations, summaries, proposed instructions)
    return {name: f"Label each text by the {RULE}." for name in call.output_fields}


def accuracy(example, prediction, trace=None):
    return float(getattr(prediction, "label", None) == example.label)


TOY = Task(name="toy-mood", description="mood of a sentence", metric_name="accuracy", build_program=MoodProgram,
           load_splits=lambda path, seed: {}, metric=accuracy,
           feedback=lambda gold, pred, score: f"the right label was {gold.label}")
BUDGET = Budget(demos=2, candidates=2, trials=3, threads=2)


@pytest.fixture
def splits():
    examples = mood_examples()
    return examples[:12], examples[12:]


def compile_toy(optimizer, train, dev, *, cache_dir=None, seed=0):
    lm = configure(ScriptedLM(responder, cache_dir=cache_dir))
    program = compile_program(TOY, train, dev, optimizer=optimizer, budget=BUDGET, seed=seed)
    return program, lm


def run_recorded(program, text):
    """Run the program with a fresh scripted LM; return the messages of its one call."""
    lm = ScriptedLM(responder)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = program(text=text)
    assert len(lm.backend.calls) == 1
    return prediction, lm.backend.calls[0].messages


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_each_optimizer_compiles_and_the_loaded_artifact_carries_demos_and_instructions(optimizer, splits, tmp_path):
    train, dev = splits
    compiled, _ = compile_toy(optimizer, train, dev)
    predictor = compiled.classify
    zero_shot = MoodProgram().classify
    changed_instructions = predictor.signature.instructions != zero_shot.signature.instructions
    if optimizer in ("labeled", "bootstrap", "random-search"):
        assert len(predictor.demos) == BUDGET.demos
    if optimizer == "gepa":
        assert RULE in predictor.signature.instructions
    assert predictor.demos or changed_instructions, "the optimizer changed nothing"

    artifact = tmp_path / f"{optimizer}.json"
    save_program(compiled, artifact, task=TOY.name, optimizer=optimizer, budget=BUDGET.as_dict(), seed=0)
    state = json.loads(artifact.read_text())
    assert "classify" in state and state["metadata"]["booklens"]["task"] == TOY.name
    assert state["metadata"]["dependency_versions"]["dspy"]  # DSPy's own save format underneath

    loaded = load_program(MoodProgram(), artifact, task=TOY.name)
    assert loaded.classify.signature.instructions == predictor.signature.instructions
    assert [dict(d) for d in loaded.classify.demos] == [dict(d) for d in predictor.demos]

    prediction, messages = run_recorded(loaded, "a bright morning")
    system, rest = messages[0]["content"], messages[1:]
    assert predictor.signature.instructions.strip().splitlines()[0] in system
    demo_turns = rest[:-1]
    assert len(demo_turns) == 2 * len(predictor.demos)  # one user and one assistant turn per demo
    for demo, turn in zip(predictor.demos, demo_turns[::2]):
        assert demo["text"] in turn["content"]
    assert "bright morning" in rest[-1]["content"]

    # The compiled program does better than the zero-shot one on held-out examples.
    configure(ScriptedLM(responder))
    base = evaluate_program(MoodProgram(), dev, accuracy, threads=2, label="zero-shot")
    tuned = evaluate_program(loaded, dev, accuracy, threads=2, label=optimizer)
    assert base.mean == 0.5 and tuned.mean == 1.0
    assert tuned.usage["calls"] == base.usage["calls"] == len(dev)
    if predictor.demos:
        assert tuned.usage["prompt_tokens"] > base.usage["prompt_tokens"]


@pytest.mark.parametrize("optimizer", ["random-search", "mipro", "gepa"])
def test_same_seed_and_cache_give_the_same_artifact(optimizer, splits, tmp_path):
    train, dev = splits
    files = []
    for run in range(2):
        compiled, lm = compile_toy(optimizer, train, dev, cache_dir=tmp_path / "cache")
        path = tmp_path / f"run{run}.json"
        save_program(compiled, path, task=TOY.name, optimizer=optimizer, budget=BUDGET.as_dict(), seed=0)
        files.append(path.read_bytes())
        if run == 1:
            assert lm.usage.snapshot()["calls"] == 0  # everything came from the cache
    assert files[0] == files[1]


@pytest.mark.parametrize("optimizer", ["bootstrap", "random-search"])
def test_the_optimizers_progress_bars_show_only_when_verbose(optimizer, splits, capsys):
    train, dev = splits
    configure(ScriptedLM(responder))
    compile_program(TOY, train, dev, optimizer=optimizer, budget=BUDGET)
    quiet = capsys.readouterr()
    assert "%|" not in quiet.err and "it/s" not in quiet.err and quiet.out == ""
    configure(ScriptedLM(responder))
    compile_program(TOY, train, dev, optimizer=optimizer, budget=BUDGET, verbose=True)
    assert "%|" in capsys.readouterr().err  # what --verbose shows


def test_the_seed_changes_the_labeled_demos(splits):
    train, dev = splits
    a, _ = compile_toy("labeled", train, dev, seed=0)
    b, _ = compile_toy("labeled", train, dev, seed=1)
    assert [d["text"] for d in a.classify.demos] != [d["text"] for d in b.classify.demos]


def test_demos_keep_only_the_predictors_fields(splits):
    train, dev = splits
    compiled, _ = compile_toy("labeled", train, dev)
    for demo in compiled.classify.demos:
        assert set(demo.keys()) == {"text", "label"}  # book and note dropped
    predictor = dspy.Predict(Mood)
    predictor.demos = [dspy.Example(text="x", other="y"), dspy.Example(text="x", label="sad", book="b")]
    assert [dict(d) for d in usable_demos(predictor)] == [{"text": "x", "label": "sad"}]


def test_unknown_optimizer_and_empty_sets_are_user_errors(splits):
    train, dev = splits
    configure(ScriptedLM(responder))
    with pytest.raises(BooklensError, match="unknown optimizer 'simulated-annealing'"):
        compile_program(TOY, train, dev, optimizer="simulated-annealing")
    with pytest.raises(BooklensError, match="dev set is empty"):
        compile_program(TOY, train, [], optimizer="random-search")
    with pytest.raises(BooklensError, match="training set is empty"):
        compile_program(TOY, [], dev, optimizer="labeled")
    with pytest.raises(BooklensError, match=f"^demos {len(train) + 1} asks for more demos than the {len(train)} "):
        compile_program(TOY, train, dev, optimizer="labeled", budget=Budget(demos=len(train) + 1))
    with pytest.raises(BooklensError, match="threads must be at least 1"):
        compile_program(TOY, train, dev, optimizer="labeled", budget=Budget(threads=0))


# ---------------------------------------------------------------------------
# Loading checks


@pytest.fixture
def artifact(splits, tmp_path):
    train, dev = splits
    compiled, _ = compile_toy("labeled", train, dev)
    path = tmp_path / "mood.json"
    save_program(compiled, path, task=TOY.name)
    return path


def assert_one_line(exc_info, *needles):
    message = str(exc_info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_loading_into_the_wrong_task_says_so(artifact):
    program = MoodProgram()
    with pytest.raises(BooklensError) as exc:
        load_program(program, artifact, task="coherence")
    assert_one_line(exc, "compiled 'toy-mood' program", "'coherence'")
    assert program.classify.demos == []  # untouched


def test_loading_into_another_program_shape_says_so(artifact):
    with pytest.raises(BooklensError) as exc:
        load_program(TwoStepProgram(), artifact, task=TOY.name)
    assert_one_line(exc, "does not fit", "classify", "first, second")


def test_changed_signature_fields_are_detected(artifact):
    state = json.loads(artifact.read_text())
    state["metadata"]["booklens"]["fields"]["classify"] = ["passage", "label"]
    artifact.write_text(json.dumps(state))
    with pytest.raises(BooklensError) as exc:
        load_program(MoodProgram(), artifact, task=TOY.name)
    assert_one_line(exc, "another version", "recompile")


def _edit_signature(text: str, edit) -> str:
    state = json.loads(text)
    edit(state["classify"]["signature"])
    return json.dumps(state)


def _edit_demo(text: str, **values) -> str:
    state = json.loads(text)
    state["classify"]["demos"][0].update(values)
    return json.dumps(state)


@pytest.mark.parametrize("damage, needle", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: "\x00\x01binary", "not valid JSON"),
    (lambda text: text.replace('"demos": [', '"demos": [], "demos": [', 1),
     "program artifact is malformed: the key 'demos' appears twice in one object"),
    (lambda text: json.dumps([1, 2, 3]), "not a booklens program artifact"),
    (lambda text: json.dumps({**json.loads(text), "metadata": {"dependency_versions": {}}}),
     "not a booklens program artifact"),
    (lambda text: text.replace(f'"format_version": {ARTIFACT_FORMAT_VERSION}', '"format_version": 99'),
     "newer booklens"),
    (lambda text: text.replace(f'"format_version": {ARTIFACT_FORMAT_VERSION}', '"format_version": 0'),
     "its format version 0 is none booklens wrote"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "classify"}), "no state for classify"),
    (lambda text: text.replace('"demos": [', '"demos": 7, "x": ['), "corrupted"),
    (lambda text: text.replace('"demos": [', '"demos": ["not a demo", ', 1), "no list of demo objects"),
    # a hand edit DSPy's loader takes as it is: the program would fail on every call, each failure
    # recorded as the model's unparseable answer
    (lambda text: _edit_signature(text, lambda s: s.update(instructions=None)), "instructions are null"),
    (lambda text: _edit_signature(text, lambda s: s.update(instructions=5)), "instructions are a number"),
    (lambda text: _edit_signature(text, lambda s: s["fields"][0].update(prefix=None)), "field 1"),
    (lambda text: _edit_signature(text, lambda s: s["fields"][1].update(description=7)), "field 2"),
    (lambda text: _edit_signature(text, lambda s: s.update(fields={"a": 1})), "fields are an object"),
    # a demo answering a label the field does not allow would teach the model to give it
    (lambda text: _edit_demo(text, label="bogus"), "demo 1 answers label 'bogus', which is none of 'happy', 'sad'"),
])
def test_damaged_artifacts_give_one_line_errors(artifact, damage, needle):
    artifact.write_text(damage(artifact.read_text()))
    with pytest.raises(BooklensError) as exc:
        load_program(MoodProgram(), artifact, task=TOY.name)
    assert_one_line(exc, needle)


def test_a_demo_label_in_another_case_still_loads(artifact):
    """'Happy' is read as happy wherever a model's answer is: a hand edit that capitalises it is no damage."""
    artifact.write_text(_edit_demo(artifact.read_text(), label="Happy"))
    assert load_program(MoodProgram(), artifact, task=TOY.name).classify.demos[0]["label"] == "Happy"


@pytest.mark.parametrize("key, value, needle", [
    (None, [1], "its metadata is a list, not an object"),
    ("program_config", "binary", "its program_config is a string, not an object"),
    ("program_config", ["x"], "its program_config is a list, not an object"),
    ("predictors", [1, "classify"], "its predictor list holds 1, which is not a predictor name"),
    ("fields", {"classify": 5}, "the fields of predictor classify are a number, not a list of names"),
    ("dataset", "FABLES", "its dataset is a string, not an object"),
    # evaluate splits the data with an artifact's seed: one no --seed could give is no seed
    ("seed", -5, "its seed is -5, not one from 0 to 4294967295"),
    ("seed", 2**64, f"its seed is {2**64}, not one from 0 to 4294967295"),
    ("seed", True, "its seed is true, not one from 0 to 4294967295"),
    ("seed", "0", "its seed is a string, not one from 0 to 4294967295"),
])
def test_malformed_metadata_is_refused_where_the_artifact_is_read(artifact, key, value, needle):
    state = json.loads(artifact.read_text())
    if key is None:
        state["metadata"] = value
    else:
        state["metadata"]["booklens"][key] = value
    artifact.write_text(json.dumps(state))
    # every consumer reads through the same check: the metadata alone, and loading into a program
    for read in (artifact_metadata, lambda path: load_program(MoodProgram(), path, task=TOY.name)):
        with pytest.raises(BooklensError) as exc:
            read(artifact)
        assert_one_line(exc, f"{artifact} is not a valid booklens artifact: {needle}")


def test_pickles_and_missing_files_are_refused(tmp_path):
    import pickle

    path = tmp_path / "program.pkl"
    path.write_bytes(pickle.dumps({"classify": {}}))
    with pytest.raises(BooklensError, match="pickle"):
        load_program(MoodProgram(), path, task=TOY.name)
    with pytest.raises(BooklensError, match="not found"):
        load_program(MoodProgram(), tmp_path / "nope.json", task=TOY.name)


def test_plain_dspy_can_still_load_an_artifact(artifact):
    program = MoodProgram()
    program.load(str(artifact))
    assert len(program.classify.demos) == 2
    assert artifact_metadata(artifact)["predictors"] == ["classify"]


# ---------------------------------------------------------------------------
# Evaluation and subsets


def test_bootstrap_interval_is_reproducible_and_contains_the_mean():
    scores = [1.0] * 30 + [0.0] * 10
    lo, hi = bootstrap_ci(scores)
    assert (lo, hi) == bootstrap_ci(scores)
    assert lo < 0.75 < hi and 0.55 < lo and hi < 0.9
    # One unit is no interval: every resample of it gives it back.
    assert all(math.isnan(x) for x in bootstrap_ci([1.0])) and all(math.isnan(x) for x in bootstrap_ci([1.0, 0.0],
                                                                                                      units=["s", "s"]))
    one = [EvalResult(label, scores, units=["s", "s"], unit_name="summaries", examples="same")
           for label, scores in (("a", [1.0, 0.0]), ("b", [1.0, 1.0]))]
    table = format_table(one, title="t", metric_name="m")
    metric_row = next(line for line in table.splitlines() if line.startswith("| m (95% CI)"))
    assert "0.500" in metric_row and "1.000" in metric_row and "[" not in metric_row
    assert "b - a: +0.500 (no interval: only 1 summary to resample)" in table
    # Without units each example is its own: one example both have a score for is one to resample.
    single = [EvalResult(label, scores, examples="same") for label, scores in (("a", [1.0]), ("b", [0.0]))]
    assert "b - a: -1.000 (no interval: only 1 example to resample)" in format_table(single, title="t", metric_name="m")


def test_counts_name_their_noun_in_the_singular_or_the_plural():
    from booklens.vocabulary import counted, singular

    assert [counted(n, "summary") for n in (1, 2)] == ["1 summary", "2 summaries"]
    assert [counted(n, "day") for n in (1, 2)] == ["1 day", "2 days"]  # a vowel before the y keeps it
    assert counted(0, "claim") == "0 claims" and counted(1_200_000, "token", "1.2M") == "1.2M tokens"
    assert [singular(name) for name in ("summaries", "examples", "days")] == ["summary", "example", "day"]


def test_a_figure_that_only_one_unit_defines_gets_no_interval():
    """Four summaries, but every sentence the judge flagged is in one: every resample that defines
    the precision repeats that summary's, which is no interval. Recall, which all four define, keeps one."""
    from booklens.metrics.bootstrap import figure

    units = [[0, 0, 2, 35], [0, 0, 4, 40], [4, 6, 10, 10], [0, 0, 20, 29]]  # tp, fp, fn, tn per summary
    precision, recall = figure(units, "precision", n=160), figure(units, "recall", n=160)
    assert precision == {"value": 0.4, "ci95": [None, None], "n": 160}
    lo, hi = recall["ci95"]
    assert recall["value"] == 0.1 and lo < 0.1 < hi
    # Two units that agree still make an interval, however narrow: the same value from two summaries.
    assert figure([[1, 1, 0, 5], [1, 1, 0, 5]], "precision", n=14)["ci95"] == [0.5, 0.5]


def test_table_shows_programs_side_by_side_with_a_paired_difference(splits):
    train, dev = splits
    compiled, _ = compile_toy("labeled", train, dev)
    configure(ScriptedLM(responder))
    results = [evaluate_program(MoodProgram(), dev, accuracy, label="zero-shot"),
               evaluate_program(compiled, dev, accuracy, label="compiled.json")]
    table = format_table(results, title="toy / test", metric_name="accuracy")
    header = table.splitlines()[0]
    assert "zero-shot" in header and "compiled.json" in header
    assert "0.500 [" in table and "1.000 [1.000, 1.000]" in table
    assert "compiled.json - zero-shot: +0.500" in table
    assert "LM calls (from cache)" in table and "prompt tokens" in table


def test_intervals_resample_whole_units_when_examples_share_one():
    """Twenty sentences of two summaries, right on every sentence of one and wrong on every one of
    the other: two pieces of evidence, not twenty, so the interval spans all the way."""
    from booklens.optimizers.evaluate import EvalResult

    scores = [1.0] * 10 + [0.0] * 10
    alone = EvalResult(label="zero-shot", scores=scores)
    lo, hi = alone.ci()
    assert 0.2 < lo < 0.5 < hi < 0.8
    grouped = EvalResult(label="zero-shot", scores=scores, units=["a"] * 10 + ["b"] * 10, unit_name="summaries",
                         examples="the same twenty")
    assert grouped.ci() == (0.0, 1.0) and grouped.n_units == 2
    assert grouped.as_dict()["resampled"] == {"unit": "summaries", "n": 2}
    # One unit per example is the same interval as no units at all.
    assert EvalResult(label="x", scores=scores, units=[str(i) for i in range(20)]).ci() == (lo, hi)
    better = EvalResult(label="compiled", scores=[1.0] * 10 + [0.5] * 10, units=grouped.units,
                        unit_name="summaries", examples=grouped.examples)
    also = EvalResult(label="other", scores=[1.0] * 20, units=grouped.units, unit_name="summaries",
                      examples=grouped.examples)
    table = format_table([grouped, better, also], title="t", metric_name="m")
    assert "Intervals resample whole summaries (2 of them)" in table
    # every program after the first is compared with the first, over the same units
    assert "compiled - zero-shot: +0.250 [+0.000, +0.500] (paired bootstrap over the same summaries" in table
    assert "other - zero-shot: +0.500 [+0.000, +1.000]" in table
    # compile's table: the same program on dev and on test, whose summaries are not as many
    on_dev = EvalResult(label="compiled on dev", scores=[1.0] * 6, units=["c"] * 6, unit_name="summaries")
    assert "(1 for compiled on dev, 2 for zero-shot)" in format_table([on_dev, grouped], title="t", metric_name="m")


def test_coherence_and_verification_intervals_resample_summaries(shared_dir):
    from booklens.optimizers.tasks import get_task, load_task_splits

    data = {"coherence": shared_dir / "data" / "booookscore" / "human",
            "verification": shared_dir / "data" / "fables" / "FABLES.json"}
    for name, path in data.items():
        task = get_task(name)
        test = load_task_splits(task, path, seed=0, sizes={}).get("test")
        units = task.units(test)
        assert task.interval_unit_name == "summaries"
        assert len(units) == len(test) and 1 < len(set(units)) < len(test)


def test_results_over_different_examples_of_the_same_size_are_not_paired(splits):
    """compile's table puts "compiled on dev" next to "compiled on test": a paired difference
    needs the same examples, not just as many."""
    train, dev = splits
    compiled, _ = compile_toy("labeled", train, dev)
    configure(ScriptedLM(responder))
    on_dev = evaluate_program(compiled, dev, accuracy, label="compiled on dev")
    on_train = evaluate_program(compiled, train, accuracy, label="compiled on train")
    assert on_dev.n == on_train.n
    table = format_table([on_dev, on_train], title="toy", metric_name="accuracy")
    assert "paired" not in table and "compiled on train - compiled on dev" not in table
    again = evaluate_program(MoodProgram(), list(dev), accuracy, label="zero-shot")
    assert "compiled on dev - zero-shot" in format_table([again, on_dev], title="toy", metric_name="accuracy")


def test_failed_examples_score_zero_and_are_counted(splits):
    _, dev = splits

    class Flaky(MoodProgram):
        def forward(self, text):
            if "sunny" in text:
                raise ValueError("no parseable answer")
            return super().forward(text=text)

    configure(ScriptedLM(responder))
    result = evaluate_program(Flaky(), dev, accuracy)
    assert result.failures == sum("sunny" in e.text for e in dev) > 0
    assert "no parseable answer" in result.errors[0]


def test_examples_the_metric_has_no_score_for_are_failed_and_left_out_of_the_mean(splits):
    """A metric that raises NoScore (a judge that gave no valid verdict) measured nothing: the
    example counts as failed, not as a 0; the paired difference is over what both programs scored."""
    from booklens.optimizers.evaluate import NoScore

    _, dev = splits

    def judged(example, prediction, trace=None):
        if "sunny" in example.text:
            raise NoScore("the judge gave no valid verdict")
        return accuracy(example, prediction, trace)

    configure(ScriptedLM(responder))
    result = evaluate_program(MoodProgram(), dev, judged)
    sunny = sum("sunny" in e.text for e in dev)
    assert result.failures == result.unscored == sunny > 0 and result.n == len(dev)
    assert result.errors[0] == "no score: the judge gave no valid verdict"
    assert result.mean == accuracy_of_scored(dev) and result.as_dict()["scored"] == len(dev) - sunny
    assert result.as_dict()["resampled"]["n"] == len(dev) - sunny

    units = ["a", "a", "b", "b"]
    first = EvalResult(label="zero-shot", scores=[1.0, None, 0.0, 0.0], units=units, unit_name="summaries",
                       examples="four")
    second = EvalResult(label="a.json", scores=[1.0, 1.0, None, 1.0], units=units, unit_name="summaries",
                        examples="four")
    assert (first.mean, second.mean, first.n_units, second.n_units) == (1 / 3, 1.0, 2, 2)
    table = format_table([first, second], title="t", metric_name="m").splitlines()
    assert ("The m means leave out the examples the metric has no score for (counted as failed): 1 of 4 for "
            "zero-shot, 1 of 4 for a.json.") in table
    assert table[-1] == ("a.json - zero-shot: +0.500 [+0.000, +1.000] (paired bootstrap over the same summaries, "
                         "95%) over the 2 of 4 examples both have a score for")
    none = EvalResult(label="b.json", scores=[None, 1.0, None, None], examples="four")
    assert format_table([first, none], title="t", metric_name="m").splitlines()[-1] == (
        "b.json - zero-shot: no example has a score from both")

    def unjudged(example, prediction, trace=None):
        raise NoScore("the judge gave no valid verdict")

    configure(ScriptedLM(responder))
    with pytest.raises(BooklensError, match="^zero-shot failed on every example; the first failure: no score: the "
                                            "judge gave no valid verdict$"):
        evaluate_program(MoodProgram(), dev, unjudged, label="zero-shot")


def accuracy_of_scored(dev) -> float:
    """Zero-shot answers "happy": right on every happy text; the sunny ones are left out."""
    kept = [e for e in dev if "sunny" not in e.text]
    return sum(e.label == "happy" for e in kept) / len(kept)


def test_usage_counts_cached_calls_with_their_tokens(splits, tmp_path):
    _, dev = splits
    configure(ScriptedLM(responder, cache_dir=tmp_path))
    first = evaluate_program(MoodProgram(), dev, accuracy)
    configure(ScriptedLM(responder, cache_dir=tmp_path))
    second = evaluate_program(MoodProgram(), dev, accuracy)
    assert second.usage["cached_calls"] == len(dev) and first.usage["cached_calls"] == 0
    assert second.usage["prompt_tokens"] == first.usage["prompt_tokens"] > 0


def test_a_metered_lm_counts_each_call_once_in_its_meter_and_in_the_open_scopes(tmp_path):
    lm = ScriptedLM(lambda call: {"label": "happy"}, cache_dir=tmp_path)
    meter = UsageTracker()
    view = metered(lm, meter)
    with usage_scope() as scope, dspy.context(lm=view, adapter=BooklensAdapter()):
        MoodProgram()(text="first")
        MoodProgram()(text="second")
        MoodProgram()(text="first")  # answered from the cache
    assert len(lm.backend.calls) == 2
    for work in (meter.work(), scope.work()):
        assert work["calls"] == 3 and work["cached_calls"] == 1
    # a copy an optimizer makes keeps counting in the same meter
    with dspy.context(lm=view.copy(temperature=0.5), adapter=BooklensAdapter()):
        MoodProgram()(text="third")
    assert meter.work()["calls"] == 4 and scope.work()["calls"] == 3


def test_rollouts_get_fresh_samples():
    seen = []
    lm = ScriptedLM(lambda call: seen.append(call.attempt) or {"label": "happy"})
    view = metered(lm)
    with dspy.context(lm=view.copy(rollout_id=7, temperature=1.0), adapter=BooklensAdapter()):
        MoodProgram()(text="x")
    with dspy.context(lm=view, adapter=BooklensAdapter()):
        MoodProgram()(text="x")
    assert seen[0] != 0 and seen[1] == 0


def test_subsets_are_balanced_seeded_and_keep_order():
    examples = mood_examples() + [dspy.Example(text=f"t{i}", label="happy").with_inputs("text") for i in range(20)]
    picked = subsample(examples, 10, seed=3, stratify="label")
    assert sum(e.label == "sad" for e in picked) == 5
    assert picked == subsample(examples, 10, seed=3, stratify="label")
    assert picked != subsample(examples, 10, seed=4, stratify="label")
    positions = [examples.index(e) for e in picked]
    assert positions == sorted(positions)
    assert subsample(examples, 0, seed=0) == examples


def test_a_backend_that_cannot_work_stops_compiling_at_once(splits):
    from booklens.errors import LMError

    train, dev = splits

    def broken(call):
        raise LMError("the prompt is larger than the context window of 'tiny'")

    lm = configure(ScriptedLM(broken))
    with pytest.raises(LMError, match="context window"):
        compile_program(TOY, train, dev, optimizer="random-search", budget=BUDGET)
    assert len(lm.backend.calls) <= 2


class Shout(dspy.Signature):
    """Repeat the text in capital letters."""

    text: str = dspy.InputField()
    loud: str = dspy.OutputField()


class CheckedProgram(Module):
    """Re-asks until the answer is in capitals, like the programs' closed-set checks."""

    def __init__(self):
        super().__init__()
        self.shout = Predict(Shout)

    def forward(self, text):
        from booklens.lm import predict_with_retries

        outcome = predict_with_retries(self.shout, check=lambda p: None if p.loud.isupper() else "not capitals",
                                       text=text)
        return outcome.prediction if outcome.ok else dspy.Prediction(loud=None)


def test_rejected_answers_never_become_demos(splits):
    train, dev = splits
    configure(ScriptedLM(lambda call: {"loud": call.inputs["text"].upper() if call.attempt else "quiet"}))
    task = Task(name="toy-shout", description="", metric_name="ok", build_program=CheckedProgram,
                load_splits=lambda p, s: {}, metric=lambda e, p, t=None: float(p.loud is not None))
    compiled = compile_program(task, train, dev, optimizer="bootstrap", budget=Budget(demos=4))
    demos = compiled.shout.demos
    assert len(demos) == 4 and all(d.get("augmented") for d in demos)
    assert all(d["loud"].isupper() for d in demos), [d["loud"] for d in demos]


def _failure(kind: str) -> Exception:
    from booklens.errors import LMError
    from booklens.lm import ContextWindowExceeded

    if kind == "backend":
        return LMError("the server went away")
    return ContextWindowExceeded("the prompt (9000 tokens) does not fit the 8192-token context window of 'scripted'")


@pytest.mark.parametrize("kind", ["backend", "context window"])
@pytest.mark.parametrize("optimizer", ["bootstrap", "random-search", "mipro", "gepa"])
def test_a_failure_mid_compile_stops_it_and_a_rerun_asks_only_the_missing_calls(optimizer, kind, splits, tmp_path):
    """DSPy's optimizers take a failed run for a bad example and go on: a backend lost halfway made a
    program chosen on the runs before it. So did a prompt too large for the context window that
    leaves the program (no step of it handles it), which is the run's setup, not one bad example.
    The compile stops instead with the error's own line, as evaluate does, and the rerun over the
    same cache asks exactly the calls it did not get and makes the same program."""
    import threading

    train, dev = splits
    full, lm = compile_toy(optimizer, train, dev, cache_dir=tmp_path / "full")
    total = len(lm.backend.calls)
    answered, lock = [0], threading.Lock()
    failure = _failure(kind)

    def failing(call):
        with lock:
            if answered[0] >= total // 2:
                raise failure
            answered[0] += 1
        return responder(call)

    configure(ScriptedLM(failing, cache_dir=tmp_path / "cut"))
    with pytest.raises(type(failure), match=re.escape(str(failure))):
        compile_program(TOY, train, dev, optimizer=optimizer, budget=BUDGET, seed=0)
    again, lm = compile_toy(optimizer, train, dev, cache_dir=tmp_path / "cut")
    assert len(lm.backend.calls) == total - answered[0] == total - total // 2
    assert again.dump_state() == full.dump_state()


class FallbackProgram(Module):
    """Handles a prompt too large itself (as the QA and DiverseSumm steps do): that example fails alone."""

    def __init__(self):
        super().__init__()
        self.classify = Predict(Mood)

    def forward(self, text):
        from booklens.lm import ContextWindowExceeded

        try:
            return self.classify(text=text)
        except ContextWindowExceeded:
            return dspy.Prediction(label=None)


def test_a_prompt_too_large_that_the_program_handles_does_not_stop_the_compile(splits):
    from booklens.lm import ContextWindowExceeded

    train, dev = splits

    def long_sad_texts(call):
        if call.output_fields == ["label"] and "number 3" in call.inputs.get("text", ""):
            raise ContextWindowExceeded("the prompt does not fit the context window of 'scripted'")
        return responder(call)

    configure(ScriptedLM(long_sad_texts))
    task = Task(name="toy-fallback", description="", metric_name="accuracy", build_program=FallbackProgram,
                load_splits=lambda p, s: {}, metric=accuracy)
    compiled = compile_program(task, train, dev, optimizer="bootstrap", budget=Budget(demos=4))
    demos = compiled.classify.demos
    assert len(demos) == 4 and not any("number 3" in d["text"] for d in demos)


@pytest.mark.parametrize("failure", ["backend", "context window"])
def test_the_failure_that_stops_a_compile_is_not_logged_with_the_example_first(failure, splits, capfd):
    """The one line the command prints is the error; DSPy's log of the failed run (the whole example, a
    book on real data) does not come before it."""
    from booklens.errors import LMError
    from booklens.lm import ContextWindowExceeded

    train, dev = splits
    error = LMError("the server went away") if failure == "backend" else ContextWindowExceeded("too large")
    calls = [0]

    def fails_after_the_first(call):
        calls[0] += 1
        if calls[0] > 1:
            raise error
        return responder(call)

    configure(ScriptedLM(fails_after_the_first))
    with pytest.raises(LMError):
        compile_program(TOY, train, dev, optimizer="bootstrap", budget=Budget(demos=2, threads=1))
    err = capfd.readouterr().err
    assert "number 0" not in err and "Failed to run" not in err, err


class RaisingProgram(Module):
    """A program whose own code fails on the examples numbered 0, 4 and 8: one bad example each time."""

    def __init__(self):
        super().__init__()
        self.classify = Predict(Mood)

    def forward(self, text):
        if int(text.rsplit(" ", 1)[1]) % 4 == 0:
            raise ValueError("the answer held no label")
        return self.classify(text=text)


@pytest.mark.parametrize("optimizer", ["bootstrap", "random-search"])
def test_a_run_failing_on_one_example_is_logged_in_one_line_without_the_example(optimizer, splits, capfd):
    """DSPy logs a failed run with its whole example (a book or a summary on real data), over many
    lines; the compile goes on, and the log says which error in one line."""
    train, dev = splits
    configure(ScriptedLM(responder))
    task = Task(name="toy-raising", description="", metric_name="accuracy", build_program=RaisingProgram,
                load_splits=lambda p, s: {}, metric=accuracy)
    compile_program(task, train, dev, optimizer=optimizer, budget=Budget(demos=2, candidates=1, threads=1))
    err = capfd.readouterr().err
    failed = [line for line in err.splitlines() if "the answer held no label" in line]
    assert failed and all(line.endswith("a program run failed on one example: the answer held no label")
                          for line in failed), err
    assert "day, number" not in err and "Failed to run" not in err and "Error for" not in err, err


def test_a_cut_json_file_says_where_its_unfinished_string_starts():
    """JSON's own message for a string cut short ends in 'starting at': the column completes it."""
    from booklens.records import parse_json

    with pytest.raises(BooklensError) as caught:
        parse_json('{"a": 1,\n  "demos": "cut', "p.json", "program artifact")
    assert str(caught.value) == ("program artifact is not valid JSON (p.json: line 2: Unterminated string starting "
                                 "at column 12)")
