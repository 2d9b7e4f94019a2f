"""The task registry wired to the real programs, with small annotation files in the real formats
and a scripted LM: each task compiles, and its artifact, loaded the way the task's command loads
it, puts the compiled demos into that command's prompts."""

from __future__ import annotations

import json

import booklens  # noqa: F401
import dspy
import pytest

from booklens.errors import BooklensError
from booklens.lm import configure
from booklens.optimizers.artifacts import load_program, save_program
from booklens.optimizers.compile import Budget, compile_program
from booklens.optimizers.evaluate import evaluate_program
from booklens.optimizers.tasks import get_task, load_task_splits, task_names
from booklens.testing import ScriptedLM, parse_fields

BUDGET = Budget(demos=2, candidates=2, trials=2, threads=2)


def taught(call) -> bool:
    return len(call.messages) > 2  # demos in the prompt


# ---------------------------------------------------------------------------
# coherence


def human_annotations(path, repeat_opening: bool = False):
    """Ten summaries of four sentences; the third names a stranger nobody introduces. With
    `repeat_opening`, each ends by saying its first sentence again (five sentences)."""
    data = {}
    for b in range(10):
        opening = f"Mara runs the mill in the valley town {b}."
        odd = f"A mysterious figure named Zed{b} arrives at the mill."
        summary = (f"{opening} Her brother Tom keeps its books. {odd} Mara and Tom sell the mill. {opening}"
                   if repeat_opening else
                   f"{opening} Her brother Tom keeps its books. {odd} Mara and Tom sell the mill at the end of the year.")
        data[f"book-{b}.epub"] = {"summary": summary, "relations": [],
                                  "singles": [{"span": odd, "questions": f"Who is Zed{b}?",
                                               "labels": ["entity omission"]}]}
    path.write_text(json.dumps(data))
    return path


def detector(call):
    if "sentence" in call.inputs:  # the per-sentence predictor
        if taught(call) and "mysterious" in call.inputs["sentence"]:
            return {"verdict": "confusion", "questions": ["Who is this?"], "error_types": ["entity omission"]}
        return {"verdict": "no confusion", "questions": [], "error_types": []}
    if "sentences" in call.inputs:  # the batched predictor (the summarize task's judge)
        numbers = [line.split(":", 1)[0] for line in call.inputs["sentences"].splitlines() if ":" in line]
        return {"answers": [{"number": int(n), "verdict": "no confusion", "questions": [], "error_types": []}
                            for n in numbers]}
    return {name: "A short text about the story." for name in call.output_fields}


def test_coherence_compiles_and_score_uses_the_artifact(tmp_path):
    from booklens.steps import score_summaries
    from booklens.programs.coherence import build_scorer

    task = get_task("coherence")
    splits = load_task_splits(task, human_annotations(tmp_path / "human.json"), seed=0)
    assert splits.info["sizes"]["train"] == 8 and {e.verdict for e in splits.test} == {"confusion", "no confusion"}
    configure(ScriptedLM(detector))
    compiled = compile_program(task, splits.train, splits.dev, optimizer="bootstrap", budget=BUDGET)
    assert len(compiled.detect.demos) == 2 and compiled.detect_batch.demos == []
    assert {"summary", "sentence", "verdict", "questions", "error_types", "augmented"} >= set(compiled.detect.demos[0])
    artifact = tmp_path / "coherence.json"
    save_program(compiled, artifact, task="coherence")

    base = evaluate_program(task.build_program(), splits.test, task.metric, label="zero-shot")
    tuned = evaluate_program(compiled, splits.test, task.metric, label="compiled")
    assert base.mean < tuned.mean == 1.0

    # `booklens score --program`: the artifact loaded into the scorer the command builds.
    scorer = load_program(build_scorer(batch_size=1, concurrency=1), artifact, task="coherence")
    lm = configure(ScriptedLM(detector))
    summary = splits.test[0].summary
    results = score_summaries({"one": summary}, scorer=scorer)
    assert results["one"].n_confusing == 1
    demo_summary = compiled.detect.demos[0]["summary"]
    assert all(demo_summary in json.dumps(c.messages) for c in lm.backend.calls)


# ---------------------------------------------------------------------------
# verification and decomposition (FABLES)


def fables(path):
    data = {}
    for b in range(10):
        claims = {}
        for c in range(4):
            bad = c % 2 == 1
            claims[str(c)] = {"claim": f"In book {b}, Ada {'never ' if bad else ''}visits harbor {c}.",
                              "label": "No" if bad else "Yes", "evidence": [f"Ada walked to harbor {c}."],
                              "reason": ["as the quote says"]}
        data[f"Book {b}"] = {"GPT-4": {"summary": f"Ada visits four harbors in book {b}. She sails home.",
                                       "claims": claims}}
    path.write_text(json.dumps(data))
    return path


def verifier(call):
    if "claim" in call.inputs and "label" in call.output_fields:
        label = "unfaithful" if taught(call) and "never" in call.inputs["claim"] else "faithful"
        out = {"label": label, "reason": "as quoted"}
        if "supporting_passages" in call.output_fields:
            out.update(supporting_passages=[1], refuting_passages=[])
        return out
    if "claims" in call.output_fields:
        return {"claims": ["Ada visits harbors.", "Ada sails home."]}
    return {name: "text" for name in call.output_fields}


def test_verification_compiles_and_verify_uses_the_artifact(tmp_path):
    from booklens.programs.faithfulness import build_checker, build_verifier

    task = get_task("verification")
    splits = load_task_splits(task, fables(tmp_path / "FABLES.json"), seed=0)
    assert splits.info["sizes"] == {"train": 16, "dev": 8, "test": 16}
    configure(ScriptedLM(verifier))
    compiled = compile_program(task, splits.train, splits.dev, optimizer="random-search", budget=BUDGET)
    assert compiled.verify.demos
    artifact = tmp_path / "verify.json"
    save_program(compiled, artifact, task="verification")
    assert evaluate_program(compiled, splits.test, task.metric).mean == 1.0
    assert evaluate_program(task.build_program(), splits.test, task.metric).mean == 0.5

    # `booklens verify --program` / `check --program`: the checker runs the loaded verifier.
    checker = build_checker(evidence_mode="given", verifier=load_program(build_verifier(), artifact,
                                                                         task="verification"))
    lm = configure(ScriptedLM(verifier))
    result = checker(claims=["Ada never visits harbor 9."], given_evidence=[["Ada walked to harbor 9."]])
    assert result.claims[0].label == "unfaithful"
    assert any(compiled.verify.demos[0]["claim"] in m["content"] for m in lm.backend.calls[0].messages)


def test_examples_the_judge_gave_no_answer_on_are_counted_as_failed(tmp_path):
    """The verifier returns its error instead of raising: such an example scores 0 and is counted
    as failed, and a judge that never answers is an error, not an accuracy of 0."""
    task = get_task("verification")
    splits = load_task_splits(task, fables(tmp_path / "FABLES.json"), seed=0)
    ruined = {e.claim for e in splits.test[::2]}

    def answers(call):
        return "not json at all" if call.inputs.get("claim") in ruined else verifier(call)

    configure(ScriptedLM(answers))
    result = evaluate_program(task.build_program(), splits.test, task.metric, failure=task.failure)
    assert result.failures == len(ruined) > 0 and result.errors[0].startswith("no answer: ")
    configure(ScriptedLM(lambda call: "not json at all"))
    with pytest.raises(BooklensError, match="failed on every example"):
        evaluate_program(task.build_program(), splits.test, task.metric, failure=task.failure)


def test_decomposition_compiles_with_labeled_demos(tmp_path):
    from booklens.programs.faithfulness import build_decomposer

    task = get_task("decomposition")
    splits = load_task_splits(task, fables(tmp_path / "FABLES.json"), seed=0)
    configure(ScriptedLM(verifier))
    compiled = compile_program(task, splits.train, splits.dev, optimizer="labeled", budget=BUDGET)
    assert [list(d.keys()) for d in compiled.decompose.demos] == [["summary", "claims"]] * 2
    artifact = tmp_path / "claims.json"
    save_program(compiled, artifact, task="decomposition")
    lm = configure(ScriptedLM(verifier))
    claims = load_program(build_decomposer(), artifact, task="decomposition")(summary="Ada sails.")
    assert claims.claims == ["Ada visits harbors.", "Ada sails home."]
    assert compiled.decompose.demos[0]["claims"][0] in json.dumps(lm.backend.calls[0].messages)


# ---------------------------------------------------------------------------
# summarize (judged by the confusion detector)


def summarizer(call):
    if "excerpt" in call.inputs and "summary" in call.output_fields:
        first = call.inputs["excerpt"].split(".")[0]
        return {"summary": f"{first}. The keeper is glad."}
    return detector(call)


def five_book_splits(tmp_path):
    """The summarize task over five small books, split 2 / 1 / 2."""
    books = tmp_path / "books"
    books.mkdir()
    for i in range(5):
        (books / f"book{i}.txt").write_text(f"The keeper of lighthouse {i} lit the lamp every night. " * 30)
    task = get_task("summarize")
    return task, load_task_splits(task, books, seed=0)


def test_summarize_compiles_with_the_coherence_metric_and_summarize_loads_it(tmp_path):
    from booklens.steps import summarize_book as build_summary

    task, splits = five_book_splits(tmp_path)
    assert [len(splits.get(n)) for n in ("train", "dev", "test")] == [2, 1, 2]
    lm = configure(ScriptedLM(summarizer))
    compiled = compile_program(task, splits.train, splits.dev, optimizer="bootstrap", budget=BUDGET)
    assert compiled.summarize_chunk.demos and compiled.summarize_chunk.demos[0].get("augmented")
    assert any(c.output_fields == ["answers"] for c in lm.backend.calls)  # the judge ran
    artifact = tmp_path / "summarizer.json"
    save_program(compiled, artifact, task="summarize")

    lm = configure(ScriptedLM(summarizer))
    record = build_summary(tmp_path / "books" / "book4.txt", program_path=artifact, remove_artifacts=False)
    assert record.summary.startswith("The keeper of lighthouse 4")
    demo_excerpt = compiled.summarize_chunk.demos[0]["excerpt"]
    assert demo_excerpt in json.dumps(lm.backend.calls[0].messages)
    with pytest.raises(BooklensError, match="does not fit"):
        build_summary(tmp_path / "books" / "book4.txt", method="inc", program_path=artifact)


def test_the_summarize_task_builds_and_records_the_summarizer_settings_given_and_checks_them_first(tmp_path):
    _, splits = five_book_splits(tmp_path)
    task = get_task("summarize", chunk_size=512, context_window=2048, max_summary_tokens=300)
    program = task.build_program()
    assert (program.chunk_size, program.context_window, program.max_summary_tokens) == (512, 2048, 300)
    assert task.program_config == {"method": "hier", "chunk_size": 512, "context_window": 2048,
                                   "max_summary_tokens": 300}
    lm = configure(ScriptedLM(summarizer, context_window=2048))
    for settings, line in (({}, "the default context window 8192 is larger than this model's 2048: set "
                                "context_window to 2048 or less"),  # a library call: its keywords
                           ({"context_window": 2048}, "set max_summary_tokens to 499 or less and chunk_size to "
                                                      "1021 or less, or raise context_window")):
        with pytest.raises(BooklensError) as refused:
            compile_program(get_task("summarize", **settings), splits.train, splits.dev, optimizer="labeled")
        assert line in str(refused.value)
    assert lm.backend.calls == []
    with pytest.raises(BooklensError, match="^the coherence task takes no chunk_size setting$"):
        get_task("coherence", chunk_size=512)


def test_unknown_task_is_a_user_error():
    assert task_names()[:4] == ["coherence", "verification", "decomposition", "summarize"]
    with pytest.raises(BooklensError, match="unknown task 'poetry'"):
        get_task("poetry")
    assert get_task("score").name == "coherence"  # a command name works too
    assert isinstance(get_task("verify").build_program(), dspy.Module)


def test_split_keeps_books_apart_and_records_the_data(tmp_path):
    task = get_task("verification")
    path = fables(tmp_path / "FABLES.json")
    splits = load_task_splits(task, path, seed=0)
    books = [{e.book for e in splits.get(n)} for n in ("train", "dev", "test")]
    assert not (books[0] & books[1] or books[0] & books[2] or books[1] & books[2])
    assert splits.info["dataset"]["sha256"] and splits.info["seed"] == 0
    other = load_task_splits(task, path, seed=1)
    assert {e.book for e in other.test} != books[2]
    with pytest.raises(BooklensError, match="data not found"):
        load_task_splits(task, tmp_path / "missing.json")


def test_coherence_has_a_smaller_default_budget_and_options_override_it():
    coherence, verification = get_task("coherence"), get_task("verification")
    assert (coherence.default_budget().demos, coherence.default_budget().candidates,
            coherence.default_budget().trials) == (2, 2, 3)
    assert verification.default_budget() == Budget()
    assert coherence.default_budget(demos=5, trials=None).demos == 5
    assert coherence.default_budget(demos=5, trials=None).trials == 3


def test_the_metric_says_no_verdict_in_the_words_score_uses(monkeypatch):
    """One builder for the sentence: the summary metric's NoScore is what `score` says of the same
    summary judged the same way (`booklens.steps.sentences_judged_nothing`)."""
    import booklens.steps as steps
    from booklens.optimizers.evaluate import NoScore
    from booklens.optimizers.tasks import summary_coherence

    built = []
    builder = steps.sentences_judged_nothing
    monkeypatch.setattr(steps, "sentences_judged_nothing", lambda *a, **kw: built.append(a) or builder(*a, **kw))
    summary = "The keeper lit the lamp. He slept."
    configure(ScriptedLM(lambda call: "not json at all"))
    with pytest.raises(NoScore) as caught:
        summary_coherence(None, dspy.Prediction(summary=summary))
    assert len(built) == 1
    record = steps.score_coherence({"s": summary}, as_set=False, batch_size=4, concurrency=1)
    assert str(caught.value) == steps.judged_nothing(record)
    assert str(caught.value).startswith("the judge gave no valid verdict on any of the 2 sentences (first: ")


@pytest.mark.parametrize("optimizer", ["bootstrap", "random-search"])
def test_a_summary_the_judge_gave_no_verdict_on_has_no_score_not_a_booookscore_of_0(optimizer, tmp_path):
    """The metric says so (NoScore) instead of scoring 0, and an optimizer that got no score on
    any run has chosen nothing: an error, as an evaluation that failed on every example is."""
    from booklens.optimizers.evaluate import NoScore

    task, splits = five_book_splits(tmp_path)
    configure(ScriptedLM(lambda call: summarizer(call) if "excerpt" in call.inputs else "not json at all"))
    with pytest.raises(NoScore, match=r"^the judge gave no valid verdict on any of the 2 sentences \(first: "):
        task.metric(splits.dev[0], dspy.Prediction(summary="The keeper lit the lamp. He slept."))
    with pytest.raises(BooklensError, match=f"^compiling with {optimizer} failed on every example it scored; the "
                                            "first failure: no score: the judge gave no valid verdict on any of"):
        compile_program(task, splits.train, splits.dev, optimizer=optimizer, budget=BUDGET)


def test_coherence_task_refuses_a_copy_of_an_annotation_file(tmp_path):
    """A copy beside the original would put every summary's sentences in the training data twice."""
    data = {"b": {"summary": "Ann sails. Ben waits.", "singles": [], "relations": []}}
    (tmp_path / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    (tmp_path / "summary-gpt4-4096-inc-copy.json").write_text(json.dumps(data))
    with pytest.raises(BooklensError, match=r"the summary of book 'b' is in both summary-gpt4-4096-inc-copy.json "
                                            r"and summary-gpt4-4096-inc.json"):
        load_task_splits(get_task("coherence"), tmp_path)


def test_the_recorded_data_is_the_files_the_task_reads_however_they_are_named(tmp_path):
    """A folder's other files (a licence, a file the task does not read) do not make it other data,
    and neither does naming the folder above the annotations; other annotations do."""
    coherence, verification = get_task("coherence"), get_task("verification")
    human = tmp_path / "booookscore" / "human"
    human.mkdir(parents=True)
    human_annotations(human / "summary-gpt4-4096-inc.json")
    (human / "notes.txt").write_text("read me\n")

    def digest(task, path):
        return load_task_splits(task, path, seed=0).info["dataset"]["sha256"]

    assert digest(coherence, human) == digest(coherence, human.parent)
    (human / "notes.txt").write_text("read me again\n")
    assert digest(coherence, human) == digest(coherence, human.parent)
    first = digest(coherence, human)
    data = json.loads((human / "summary-gpt4-4096-inc.json").read_text())
    data.pop("book-0.epub")
    (human / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    assert digest(coherence, human) != first

    (tmp_path / "fables").mkdir()
    path = fables(tmp_path / "fables" / "FABLES.json")
    (path.parent / "LICENSE").write_text("terms\n")
    assert digest(verification, path.parent) == digest(verification, path)


# ---------------------------------------------------------------------------
# coherence: a sentence the summary says twice


def test_compile_and_evaluate_ask_each_copy_of_a_repeated_sentence_as_score_does(tmp_path):
    """`score` names which occurrence of a repeated sentence it judges; the examples compile and
    evaluate run held the sentence alone, so both copies were asked one prompt that no run of the
    summary ever sends. Each example's prompt is now byte for byte the one `score` sends for that
    sentence of that summary; a sentence said once was and is asked exactly as before, and what the
    run records as the sentence is the sentence, not the prompt's note."""
    from booklens.programs.coherence import build_scorer

    task = get_task("coherence")
    splits = load_task_splits(task, human_annotations(tmp_path / "human.json", repeat_opening=True), seed=0,
                              sizes={"train": 0, "dev": 0, "test": 0})
    book = splits.test[0].book
    examples = [e for e in splits.test if e.book == book]
    assert [e.index for e in examples] == [0, 1, 2, 3, 4]
    summary = examples[0].summary

    lm = configure(ScriptedLM(detector))
    build_scorer(batch_size=1, concurrency=1)(summary=summary)  # `booklens score`'s program, one sentence a call
    by_score = [c.messages for c in lm.backend.calls]
    assert len(by_score) == 5
    assert "judge occurrence 1." in by_score[0][-1]["content"] and "judge occurrence 2." in by_score[4][-1]["content"]

    by_example, recorded = {}, {}
    for example in examples:
        lm = configure(ScriptedLM(detector))
        result = evaluate_program(task.build_program(), [example], task.metric, threads=1, keep_predictions=True)
        by_example[example.index] = [c.messages for c in lm.backend.calls]
        recorded[example.index] = [a.sentence for a in result.predictions[0].annotations]
    assert {i: by_example[i] == [by_score[i]] for i in by_example} == {i: True for i in range(5)}
    opening = f"Mara runs the mill in the valley town {book.split('-')[1].split('.')[0]}."
    assert recorded[0] == recorded[4] == [opening]


def test_compiled_demos_of_a_repeated_sentence_show_what_score_asks(tmp_path):
    """A labeled demo is the example itself: its sentence is the text the prompt judges, the copy's
    occurrence named as `score` names it, so a demo never shows a prompt no run asks."""
    from booklens.programs.coherence import build_scorer

    task = get_task("coherence")
    splits = load_task_splits(task, human_annotations(tmp_path / "human.json", repeat_opening=True), seed=0,
                              sizes={"train": 0, "dev": 0, "test": 0})
    configure(ScriptedLM(detector))
    compiled = compile_program(task, splits.train, splits.dev, optimizer="labeled",
                               budget=Budget(demos=len(splits.train), threads=1))
    demos = compiled.detect.demos
    assert len(demos) == len(splits.train) == 20
    asked: dict[str, list[str]] = {}
    for summary in {d["summary"] for d in demos}:
        lm = configure(ScriptedLM(detector))
        build_scorer(batch_size=1, concurrency=1)(summary=summary)
        asked[summary] = [c.inputs["sentence"] for c in lm.backend.calls]
    assert all(d["sentence"] in asked[d["summary"]] for d in demos)
    assert sum("judge occurrence 2." in d["sentence"] for d in demos) == 4  # one copy in each of 4 summaries


def test_the_released_summaries_with_a_repeated_sentence_are_asked_as_score_asks_them(shared_dir):
    """The annotation files list each summary's sentences as `score` cuts them, so the copies the
    examples name are the copies a run of the summary names: 5 of the 200 human-annotated summaries
    say a sentence more than once (15 examples are such copies), and every sentence of those
    summaries is asked as `score` asks it, the plain sentence kept for the record."""
    from booklens.programs.coherence import build_scorer
    from booklens.text import split_sentences

    task = get_task("coherence")
    splits = load_task_splits(task, shared_dir / "data" / "booookscore" / "human", seed=0,
                              sizes={"train": 0, "dev": 0, "test": 0})
    examples = splits.train + splits.dev + splits.test
    copies = [e for e in examples if e.sentence != e.sentences[0]]
    repeating = {(e.source, e.book) for e in copies}
    assert len(copies) == 15 and len(repeating) == 5
    # as README counts them: 4 incremental summaries and 1 hierarchical one
    assert sorted(source for source, _ in repeating).count("summary-gpt4-4096-inc.json") == 4
    for source, book in sorted(repeating):
        mine = [e for e in examples if (e.source, e.book) == (source, book)]
        lm = configure(ScriptedLM(detector))
        build_scorer(batch_size=1, concurrency=1)(summary=mine[0].summary)
        asked = [c.inputs["sentence"] for c in lm.backend.calls]
        plain = split_sentences(mine[0].summary)
        assert len(mine) == len(asked) == len(plain)
        assert all(e.sentence == asked[e.index] and e.sentences == [plain[e.index]] for e in mine)


# ---------------------------------------------------------------------------
# coherence: demos trimmed to a small context window


def uneven_annotations(path):
    """Ten summaries whose second sentence is far longer than the others."""
    counts = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
    data = {}
    for b in range(10):
        long = (f"Mara {b} remembers the winter of the flood, when " +
                ", ".join(f"her father carried {n} sacks of wet grain up to the loft" for n in counts) + ".")
        odd = f"A mysterious figure named Zed{b} arrives at the mill."
        summary = f"Mara runs the mill in the valley town {b}. {long} {odd} Mara and Tom sell the mill."
        data[f"book-{b}.epub"] = {"summary": summary, "relations": [],
                                  "singles": [{"span": odd, "questions": f"Who is Zed{b}?",
                                               "labels": ["entity omission"]}]}
    path.write_text(json.dumps(data))
    return path


def shown_demos(messages) -> int:
    return (len(messages) - 2) // 2  # system message, a user and an assistant turn per demo, the asked turn


def test_evaluate_keeps_the_demos_score_keeps_for_a_short_sentence_in_a_small_window(tmp_path):
    """Where the judge's window cannot hold every demo next to a summary, `score` sizes the room for
    the judged sentence by the summary's longest sentence, so every call of the summary keeps the same
    demos. The examples compile and evaluate run hold one sentence each: a short one must keep the
    demos `score` keeps for it, in the very prompt `score` sends, not more."""
    from booklens.judges import load_judge
    from booklens.programs.coherence import MODEL_TOKENS_PER_CL100K as RATIO
    from booklens.programs.coherence import instructions_and_demos_tokens, occurrence_targets
    from booklens.text import count_tokens, split_sentences

    task = get_task("coherence")
    splits = load_task_splits(task, uneven_annotations(tmp_path / "human.json"), seed=0,
                              sizes={"train": 0, "dev": 0, "test": 0})
    book = splits.test[0].book
    examples = [e for e in splits.test if e.book == book]
    summary = examples[0].summary
    targets = occurrence_targets(split_sentences(summary))
    short, long = min(targets, key=count_tokens), max(targets, key=count_tokens)
    assert count_tokens(long) > count_tokens(short) + 100
    program = load_judge("coherence", batch_size=1, concurrency=1)
    demos = program.detect.demos
    # A window that holds every demo beside the short sentence but not beside the long one.
    base = instructions_and_demos_tokens(program.detect, demos) + count_tokens(summary) + 120
    answer = program._budget(1)["max_tokens"]
    window = int((base + count_tokens(long)) * RATIO + answer) - 1
    assert (base + count_tokens(short)) * RATIO + answer < window

    lm = configure(ScriptedLM(detector, context_window=window))
    scored = load_judge("coherence", batch_size=1, concurrency=1)(summary=summary)
    by_score = {c.inputs["sentence"]: c.messages for c in lm.backend.calls}
    assert 0 < scored.demos_shown < len(demos)
    assert {shown_demos(m) for m in by_score.values()} == {scored.demos_shown}

    for example in examples:
        lm = configure(ScriptedLM(detector, context_window=window))
        result = evaluate_program(load_judge("coherence", batch_size=1, concurrency=1), [example], task.metric,
                                  threads=1, keep_predictions=True)
        assert result.predictions[0].demos_shown == scored.demos_shown, example.index
        assert [c.messages for c in lm.backend.calls] == [by_score[example.sentence]]


def test_compile_program_refuses_a_summary_too_long_for_the_window_before_any_call(tmp_path):
    """A training summary that does not fit the window even with no demo is refused up front, as
    `score` refuses one, not found at its own call in the middle of bootstrapping."""
    task = get_task("coherence")
    splits = load_task_splits(task, human_annotations(tmp_path / "human.json"), seed=0)
    long = next(e for e in splits.train)
    filler = " Anna counts the boats that came into the harbour of the old town that morning." * 600
    train = [e.copy(summary=e.summary + filler) if e.book == long.book else e for e in splits.train]
    lm = ScriptedLM(detector)
    configure(lm)
    with pytest.raises(BooklensError) as excinfo:
        compile_program(task, train, splits.dev, optimizer="bootstrap", budget=BUDGET)
    assert lm.backend.calls == []
    message = str(excinfo.value)
    assert message.startswith(f"the summary {long.book!r} of human.json (") and "\n" not in message
    assert "does not fit the model's 8,192-token context window even with none of the judge's demos" in message


def test_a_coherence_demo_with_an_unknown_error_type_is_refused_in_one_line(tmp_path):
    """A hand-edited demo naming a kind of confusion that is none of the eight would show the model an
    answer its own reply is refused for; as a demo's unknown verdict or label is, it is refused."""
    task = get_task("coherence")
    splits = load_task_splits(task, human_annotations(tmp_path / "human.json"), seed=0)
    confusing = next(e for e in splits.train if e.verdict == "confusion")
    program = task.build_program()
    program.detect.demos = [dspy.Example(summary=confusing.summary, sentence=confusing.sentence, verdict="confusion",
                                         questions=["Who is Zed?"], error_types=["entity omission"])]
    artifact = tmp_path / "coherence.json"
    save_program(program, artifact, task="coherence", program_config=task.program_config)
    state = json.loads(artifact.read_text())
    state["detect"]["demos"][0]["error_types"] = ["Entity omission"]  # read as a reply is: no damage
    artifact.write_text(json.dumps(state))
    load_program(task.build_program(), artifact, task="coherence")
    state["detect"]["demos"][0]["error_types"] = ["entity omission", "entity omision"]
    artifact.write_text(json.dumps(state))
    with pytest.raises(BooklensError) as excinfo:
        load_program(task.build_program(), artifact, task="coherence")
    message = str(excinfo.value)
    assert message.startswith(f"program artifact {artifact} is corrupted: predictor detect: demo 1 answers "
                              "error_types 'entity omision', which is none of 'entity omission', ")
    assert "\n" not in message
