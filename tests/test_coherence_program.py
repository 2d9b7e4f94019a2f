"""CoherenceScorer with a scripted LM: per-sentence and batched modes, re-asks, bounded failures."""

from __future__ import annotations

import json
import threading

import booklens  # noqa: F401  (offline defaults before dspy/litellm load)
import dspy
import pytest

from booklens.lm import BooklensAdapter
from booklens.programs.coherence import CoherenceScorer, build_scorer, check_answer, number_sentences
from booklens.testing import ScriptedLM

SUMMARY = (
    "Mara keeps the lighthouse on Gull Rock with her father. "
    "One winter night Zed appears at the door. "
    "Her father falls ill and Mara must keep the lamp burning alone. "
    "The lamp stays lit and a ship reaches the harbor. "
    "In spring Mara leaves the island to study at the naval school."
)
SENTENCES = [
    "Mara keeps the lighthouse on Gull Rock with her father.",
    "One winter night Zed appears at the door.",
    "Her father falls ill and Mara must keep the lamp burning alone.",
    "The lamp stays lit and a ship reaches the harbor.",
    "In spring Mara leaves the island to study at the naval school.",
]
NO = {"verdict": "no confusion", "questions": [], "error_types": []}
ZED = {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission"]}


def answer_for(sentence: str) -> dict:
    return ZED if "Zed" in sentence else NO


def batch_numbers(call) -> list[int]:
    return [int(line.split(":", 1)[0]) for line in call.inputs["sentences"].splitlines() if line.strip()]


def run(responder, batch_size=1, tries=3, concurrency=4, sentences=SENTENCES, latency=0.0):
    lm = ScriptedLM(responder, latency=latency)
    scorer = CoherenceScorer(batch_size=batch_size, tries=tries, concurrency=concurrency)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = scorer(summary=SUMMARY, sentences=sentences)
    return prediction, lm.backend.calls


def run_in_mode(one, batch_size):
    """`run` with `one(sentence, attempt)` answering each sentence, per sentence (batch size 1) or
    in numbered batches."""
    def responder(call):
        if batch_size == 1:
            return one(call.inputs["sentence"], call.attempt)
        return {"answers": [{"number": n, **one(SENTENCES[n - 1], call.attempt)} for n in batch_numbers(call)]}

    return run(responder, batch_size=batch_size)


def test_per_sentence_mode_one_call_per_sentence_and_eq1():
    prediction, calls = run(lambda call: answer_for(call.inputs["sentence"]))
    assert len(calls) == len(SENTENCES)
    assert all(call.wants("verdict", "questions", "error_types") for call in calls)
    flags = [a.confusing for a in prediction.annotations]
    assert flags == [False, True, False, False, False]
    assert prediction.annotations[1].types == ["entity omission"]
    assert prediction.annotations[1].questions == ["Who is Zed?"]
    assert [a.index for a in prediction.annotations] == list(range(5))
    assert prediction.score == pytest.approx(4 / 5)
    assert prediction.n_failed == 0


def test_per_sentence_prompt_puts_the_summary_before_the_sentence():
    _, calls = run(lambda call: answer_for(call.inputs["sentence"]))
    assert len({c.system for c in calls}) == 1  # identical instructions for every sentence
    users = [c.messages[-1]["content"] for c in calls]
    for user, sentence in zip(users, SENTENCES):
        assert user.index(SUMMARY) < user.index("[[ ## sentence ## ]]")
    prefix = users[0].split("[[ ## sentence ## ]]")[0]
    assert all(u.startswith(prefix) for u in users)  # shared prefix: cacheable


def test_the_summary_is_split_into_sentences_when_not_given():
    lm = ScriptedLM(lambda call: answer_for(call.inputs["sentence"]))
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = build_scorer()(summary=SUMMARY)
    assert prediction.sentences == SENTENCES
    assert prediction.score == pytest.approx(0.8)


def test_unknown_error_type_is_reasked_then_recorded_as_failure_per_sentence():
    def responder(call):
        if "Zed" in call.inputs["sentence"]:
            return {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["plot hole"]}
        return NO

    prediction, calls = run(responder, tries=3)
    zed_calls = [c for c in calls if "Zed" in c.inputs["sentence"]]
    assert len(zed_calls) == 3  # bounded: asked exactly `tries` times
    assert [c.attempt for c in zed_calls] == [0, 1, 2]  # each re-ask is a fresh sample
    failed = prediction.annotations[1]
    assert failed.status == "failed" and failed.confusing is None  # never a silent "no confusion"
    assert failed.attempts == 3 and failed.error
    assert prediction.n_failed == 1
    # Eq. 1 over the answered sentences only
    assert prediction.score == pytest.approx(1.0)


def test_garbage_answers_end_after_bounded_tries():
    prediction, calls = run(lambda call: "I think it is fine!!", tries=2, concurrency=1)
    assert len(calls) == 2 * len(SENTENCES)
    assert all(a.status == "failed" and a.confusing is None for a in prediction.annotations)
    assert prediction.score is None


def test_contradictory_answers_are_reasked():
    seen = {"n": 0}

    def responder(call):
        if "Zed" in call.inputs["sentence"] and call.attempt == 0:
            return {"verdict": "no confusion", "questions": [], "error_types": ["entity omission"]}
        if "father falls" in call.inputs["sentence"] and call.attempt == 0:
            return {"verdict": "confusion", "questions": [], "error_types": ["causal omission"]}
        seen["n"] += 1
        return answer_for(call.inputs["sentence"])

    prediction, calls = run(responder)
    assert len(calls) == len(SENTENCES) + 2
    assert prediction.annotations[1].confusing is True and prediction.annotations[1].attempts == 2
    assert prediction.annotations[2].confusing is False and prediction.annotations[2].attempts == 2


def test_batched_mode_asks_k_sentences_per_call_with_their_numbers():
    def responder(call):
        assert call.wants("answers")
        return {"answers": [{"number": n, **answer_for(SENTENCES[n - 1])} for n in batch_numbers(call)]}

    prediction, calls = run(responder, batch_size=2)
    assert sorted(batch_numbers(c) for c in calls) == [[1, 2], [3, 4], [5]]
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert prediction.score == pytest.approx(0.8)


def test_batched_answer_that_skips_a_sentence_reasks_only_that_sentence():
    def responder(call):
        numbers = batch_numbers(call)
        if call.attempt == 0:
            numbers = [n for n in numbers if n != 2]  # sentence 2 is skipped
        return {"answers": [{"number": n, **answer_for(SENTENCES[n - 1])} for n in numbers]}

    prediction, calls = run(responder, batch_size=5)
    assert len(calls) == 2
    assert batch_numbers(calls[1]) == [2]  # the re-ask carries only the missing sentence, same number
    assert calls[1].attempt == 1
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert prediction.annotations[1].confusing is True and prediction.annotations[1].attempts == 2
    assert prediction.annotations[0].attempts == 1


def test_batched_unknown_type_is_reasked_then_recorded_as_failure():
    def responder(call):
        answers = []
        for n in batch_numbers(call):
            if n == 2:
                answers.append({"number": 2, "verdict": "confusion", "questions": ["Who?"],
                                "error_types": ["plot hole"]})
            else:
                answers.append({"number": n, **answer_for(SENTENCES[n - 1])})
        return {"answers": answers}

    prediction, calls = run(responder, batch_size=5, tries=3)
    assert len(calls) == 3
    assert [batch_numbers(c) for c in calls[1:]] == [[2], [2]]
    bad = prediction.annotations[1]
    assert bad.status == "failed" and bad.confusing is None and "plot hole" in bad.error
    assert bad.attempts == 3
    assert all(a.status == "ok" for i, a in enumerate(prediction.annotations) if i != 1)
    assert prediction.n_failed == 1


def test_batched_answers_that_settled_nothing_leave_the_cache(tmp_path):
    """Sentence 2's type is refused in every round: the first answer settled the other four and is
    kept; the re-asks settled nothing and are dropped, so a rerun replays round one and asks again."""
    fixed = {"now": False}

    def responder(call):
        answers = []
        for n in batch_numbers(call):
            if n == 2 and not fixed["now"]:
                answers.append({"number": 2, "verdict": "confusion", "questions": ["Who?"],
                                "error_types": ["plot hole"]})
            else:
                answers.append({"number": n, **answer_for(SENTENCES[n - 1])})
        return {"answers": answers}

    lm = ScriptedLM(responder, cache_dir=tmp_path)
    scorer = CoherenceScorer(batch_size=5, tries=3, concurrency=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        first = scorer(summary=SUMMARY, sentences=SENTENCES)
        assert first.n_failed == 1 and len(lm.backend.calls) == 3 and len(lm.call_cache) == 1
        fixed["now"] = True
        second = scorer(summary=SUMMARY, sentences=SENTENCES)
    assert second.n_failed == 0 and second.annotations[1].confusing is True
    assert len(lm.backend.calls) == 4 and batch_numbers(lm.backend.calls[-1]) == [2]


def test_batched_misaligned_numbers_and_duplicates_are_not_trusted():
    def responder(call):
        numbers = batch_numbers(call)
        if call.attempt == 0 and numbers[0] == 1:
            # sentence 2 answered (wrongly but validly), two different answers for 3
            return {"answers": [{"number": 1, **NO}, {"number": 2, **NO}, {"number": 3, **NO},
                                {"number": 3, **ZED}]}
        if call.attempt == 0:
            return {"answers": [{"number": 1, **NO}, {"number": 2, **NO}]}  # 4 and 5 renumbered from 1
        return {"answers": [{"number": n, **answer_for(SENTENCES[n - 1])} for n in numbers]}

    prediction, calls = run(responder, batch_size=3, sentences=SENTENCES, concurrency=1)
    # batch [1,2,3] and batch [4,5] both get a second round for what was not validly answered
    second_round = sorted(batch_numbers(c) for c in calls if c.attempt == 1)
    assert second_round == [[3], [4, 5]]
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert prediction.annotations[1].confusing is False  # sentence 2 answered (wrongly but validly) first round
    assert prediction.annotations[2].attempts == 2


def test_batched_garbage_is_bounded():
    prediction, calls = run(lambda call: "not json", batch_size=5, tries=3)
    assert len(calls) == 3
    assert all(a.status == "failed" and "unparseable" in a.error for a in prediction.annotations)


def test_sentences_are_scored_concurrently():
    # The first calls wait until four are in flight at once, which only a concurrent scorer reaches;
    # the wait's timeout only ends the test if it never happens.
    lock = threading.Lock()
    four_in_flight = threading.Event()
    state = {"now": 0, "max": 0}

    def responder(call):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            if state["now"] == 4:
                four_in_flight.set()
        four_in_flight.wait(timeout=60)
        with lock:
            state["now"] -= 1
        return answer_for(call.inputs["sentence"])

    prediction, calls = run(responder, concurrency=4, sentences=SENTENCES * 2)
    assert state["max"] == 4  # the --concurrency limit is reached and never exceeded
    assert len(calls) == 10 and len(prediction.annotations) == 10
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False] * 2


def test_check_answer_and_numbering():
    assert check_answer("no confusion", [], []) is None
    assert check_answer("confusion", ["Why?"], ["causal omission"]) is None
    assert "unknown" in check_answer("confusion", ["Why?"], ["plot hole"])
    assert check_answer("confusion", [], ["salience"])
    assert check_answer("confusion", ["Why?"], [])
    assert check_answer("maybe", [], [])
    assert check_answer("no confusion", ["Who is she?"], []) is None  # stray questions are dropped
    assert check_answer("no confusion", [], ["salience"])
    assert number_sentences(["A b.", "C\n d."], [1]) == "2: C d."


def test_invalid_construction():
    from booklens.errors import BooklensError

    with pytest.raises(BooklensError, match="batch_size must be at least 1"):
        CoherenceScorer(batch_size=0)
    with pytest.raises(BooklensError, match=r"tries must be from 1 to 10 \(got 0\)"):
        CoherenceScorer(tries=0)
    scorer = build_scorer(batch_size=10)
    assert scorer.mode == "batched" and scorer.batch_size == 10
    # both predictors are parameters, so a compiled artifact can carry demos/instructions for either
    names = [name for name, _ in scorer.named_predictors()]
    assert names == ["detect", "detect_batch"]


def test_stray_questions_next_to_no_confusion_are_dropped():
    prediction, calls = run(lambda call: {"verdict": "no confusion", "questions": ["Who is Mara?"],
                                          "error_types": []})
    assert len(calls) == len(SENTENCES)  # valid first time: not re-asked
    assert all(a.confusing is False and a.questions == [] for a in prediction.annotations)


def test_batched_one_malformed_answer_costs_a_reask_of_that_sentence_only():
    """Answers are read one by one: a question written as a string, `null` for an empty list or a
    missing verdict spoil only their own sentence, not the answers of the rest of the batch."""
    def responder(call):
        numbers = batch_numbers(call)
        answers = [{"number": n, **answer_for(SENTENCES[n - 1])} for n in numbers]
        if call.attempt == 0:
            answers[1]["questions"] = "Who is Zed?"  # one question, not in a list
            answers[0]["error_types"] = None  # null for "none"
            answers[0]["questions"] = None
            del answers[2]["verdict"]  # no verdict for sentence 3
            answers[3]["number"] = "four"  # no usable number for sentence 4
        return {"answers": answers}

    prediction, calls = run(responder, batch_size=5)
    assert [batch_numbers(c) for c in calls] == [[1, 2, 3, 4, 5], [3, 4]]
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert [a.attempts for a in prediction.annotations] == [1, 1, 2, 2, 1]
    assert prediction.annotations[1].questions == ["Who is Zed?"]
    assert prediction.annotations[0].confusing is False and prediction.annotations[0].types == []


def test_batched_answer_schema_still_asks_for_every_field():
    from booklens.signatures.coherence import SentenceVerdict

    schema = SentenceVerdict.model_json_schema()
    assert schema["required"] == ["number", "verdict"]
    assert schema["properties"]["number"]["type"] == "integer"
    assert schema["properties"]["questions"]["type"] == "array"
    assert schema["properties"]["error_types"]["items"]["enum"][0] == "entity omission"


def test_per_sentence_answers_with_null_missing_or_lone_string_lists_are_read():
    """`null` or nothing for "no questions / no kinds", and a lone question or kind written as a
    string, are answers, not parse failures asked again until the sentence is left unjudged."""
    def responder(call):
        sentence = call.inputs["sentence"]
        if "Zed" in sentence:
            return {"verdict": "confusion", "questions": "Who is Zed?", "error_types": "entity omission"}
        if "harbor" in sentence:
            return {"verdict": "no confusion"}
        return {"verdict": "no confusion", "questions": None, "error_types": None}

    prediction, calls = run(responder)
    assert len(calls) == len(SENTENCES)
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert prediction.annotations[1].questions == ["Who is Zed?"]
    assert prediction.annotations[1].types == ["entity omission"]


def test_a_lenient_answer_is_read_as_dspy_reads_json():
    """DSPy reads answers with json_repair: a trailing comma does not turn off the lenient reading."""
    from booklens.lm.adapter import lenient_answer
    from booklens.signatures.coherence import DetectConfusion, SentenceVerdict

    read = json.loads(lenient_answer(DetectConfusion, '{"verdict": "Confusion", "questions": "Who?", '
                                                      '"error_types": "Entity omission ",}'))
    assert read == {"verdict": "confusion", "questions": ["Who?"], "error_types": ["entity omission"]}
    # A number in digits other than ASCII's is no sentence number (int('\u00b2') fails; it cost the batch).
    assert SentenceVerdict.model_validate({"number": "\u00b2", "verdict": "no confusion"}).number is None


def test_a_confusion_answered_without_questions_is_still_asked_again():
    def responder(call):
        if "Zed" in call.inputs["sentence"]:
            return ({"verdict": "confusion", "error_types": ["entity omission"]} if call.attempt == 0
                    else ZED)
        return NO

    prediction, calls = run(responder)
    assert len(calls) == len(SENTENCES) + 1
    assert prediction.annotations[1].attempts == 2 and prediction.annotations[1].questions == ["Who is Zed?"]


def test_batched_the_same_answer_given_twice_is_one_answer():
    """A sentence answered twice with the same verdict and kinds (in another order, or once with its
    questions) is answered, not asked again as if the answers disagreed."""
    two_kinds = {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission", "salience"]}

    def responder(call):
        answers = [{"number": n, **(two_kinds if n == 2 else answer_for(SENTENCES[n - 1]))}
                   for n in batch_numbers(call)]
        return {"answers": answers + [{"number": 2, "verdict": "confusion", "questions": [],
                                       "error_types": ["salience", "entity omission", "salience"]}]}

    prediction, calls = run(responder, batch_size=5)
    assert len(calls) == 1
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert prediction.annotations[1].types == ["entity omission", "salience"]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_verdicts_and_kinds_in_another_case_are_read(batch_size):
    """'No Confusion', '**Confusion**' or '(Entity Omission)' (a model without its answer schema
    enforced) are the verdicts and kinds they name, read as every closed-set answer is
    (`signatures.answers`), not unknown values asked again until the sentence is unjudged."""
    def one(sentence, attempt):
        if "Zed" in sentence:
            return {"verdict": "**Confusion**", "questions": ["Who is Zed?"],
                    "error_types": ["(Entity Omission) ", "Salience."]}
        return {"verdict": " No confusion", "questions": [], "error_types": []}

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (5 if batch_size == 1 else 2)
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert prediction.annotations[1].types == ["entity omission", "salience"]


@pytest.mark.parametrize("confusing, clear", [
    ("Verdict: confusion", "Verdict: no confusion"), ("**confusing**", "The sentence is not confusing"),
    ("Confusion.", "No confusion"), ("yes, it is confusing", "No, it is not confusing."),
    ("Confusion - a reader cannot tell who Zed is", "Not confusing"),
    ("**Verdict:** confusion", "**Verdict**: no confusion"), ("*Verdict:* **confusion**", "__Verdict:__ No confusion"),
    ("**Yes**, it is confusing", "**No**, it is not confusing."), ("*Yes*: confusing", "**No.** Not confusing")])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_verdict_with_a_label_or_in_a_phrase_is_read_in_both_modes(batch_size, confusing, clear):
    """'Verdict: confusion' or 'The sentence is not confusing' (a model without its answer schema
    enforced) name one verdict: refused, they were asked again until the sentence was unjudged."""
    def one(sentence, attempt):
        return {**ZED, "verdict": confusing} if "Zed" in sentence else {**NO, "verdict": clear}

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (5 if batch_size == 1 else 2)
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]


@pytest.mark.parametrize("written", ["confusing or not", "maybe", "not sure", "Yes", "not confusion",
                                     "Yes, it is not confusing", "No, it is confusing", "somewhat confusing",
                                     "Confusion - or no confusion, hard to say", "**Verdict:** confusing or not",
                                     "**Verdict**: not sure", "**Yes**, it is not confusing"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_verdict_naming_no_single_value_is_still_asked_again(batch_size, written):
    def one(sentence, attempt):
        return {**ZED, "verdict": written} if "Zed" in sentence else NO

    prediction, calls = run_in_mode(one, batch_size)
    assert [a.status for a in prediction.annotations] == ["ok", "failed", "ok", "ok", "ok"]
    assert prediction.annotations[1].attempts == 3 and prediction.annotations[1].confusing is None


def test_batched_answers_numbered_from_zero_are_not_taken():
    """Answers numbered 0..4 for sentences 1..5 would give each sentence its neighbour's verdict:
    the 0 that was not asked shows the numbering is off, so no answer of that reply is taken."""
    def responder(call):
        shift = 1 if call.attempt == 0 else 0
        return {"answers": [{"number": n - shift, **answer_for(SENTENCES[n - 1])} for n in batch_numbers(call)]}

    prediction, calls = run(responder, batch_size=5)
    assert [batch_numbers(c) for c in calls] == [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert [a.attempts for a in prediction.annotations] == [2] * 5


def test_batched_numbering_that_stays_off_ends_in_failures_that_say_so():
    def responder(call):
        return {"answers": [{"number": n + 1, **answer_for(SENTENCES[n - 1])} for n in batch_numbers(call)]}

    prediction, calls = run(responder, batch_size=5, tries=2)
    assert len(calls) == 2
    assert all(a.status == "failed" and a.confusing is None for a in prediction.annotations)
    assert all("6" in a.error and "not asked" in a.error for a in prediction.annotations)


def test_batched_an_extra_number_beside_all_asked_ones_is_not_trusted():
    """Answers for 1, 2, 3 and 4 when 1, 2 and 3 were asked: the model may have judged a sentence it was
    not shown, or split one and numbered on from there; which answer belongs to which sentence is unknown."""
    def responder(call):
        numbers = batch_numbers(call)
        answers = [{"number": n, **answer_for(SENTENCES[n - 1])} for n in numbers]
        if call.attempt == 0 and numbers[0] == 1:
            answers.append({"number": 4, **NO})
        return {"answers": answers}

    prediction, calls = run(responder, batch_size=3, concurrency=1)
    assert sorted(batch_numbers(c) for c in calls) == [[1, 2, 3], [1, 2, 3], [4, 5]]
    assert [a.attempts for a in prediction.annotations] == [2, 2, 2, 1, 1]
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]


def test_batched_a_reask_numbered_from_one_is_not_trusted():
    """Sentences 2 and 4 are asked again; answers numbered 1 and 2 (the model's own list numbers) would
    give sentence 2 the verdict meant for sentence 4."""
    def responder(call):
        numbers = batch_numbers(call)
        if call.attempt == 0:
            numbers = [n for n in numbers if n not in (2, 4)]
        elif call.attempt == 1:
            return {"answers": [{"number": k, **answer_for(SENTENCES[n - 1])} for k, n in enumerate(numbers, 1)]}
        return {"answers": [{"number": n, **answer_for(SENTENCES[n - 1])} for n in numbers]}

    prediction, calls = run(responder, batch_size=5)
    assert [batch_numbers(c) for c in calls] == [[1, 2, 3, 4, 5], [2, 4], [2, 4]]
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert [a.attempts for a in prediction.annotations] == [1, 3, 1, 3, 1]


def test_batched_an_unreadable_number_costs_only_its_own_sentence():
    """A number that is no whole number says nothing about the numbering: that answer belongs to no
    sentence, the rest of the reply stands."""
    def responder(call):
        answers = [{"number": n, **answer_for(SENTENCES[n - 1])} for n in batch_numbers(call)]
        if call.attempt == 0:
            answers[2]["number"] = "third"
            del answers[3]["number"]
        return {"answers": answers}

    prediction, calls = run(responder, batch_size=5)
    assert [batch_numbers(c) for c in calls] == [[1, 2, 3, 4, 5], [3, 4]]
    assert [a.status for a in prediction.annotations] == ["ok"] * 5


@pytest.mark.parametrize("batch_size", [1, 3])
def test_null_or_non_text_list_items_are_read_alike_in_both_modes(batch_size):
    """A `null` among the questions or kinds stands for nothing, as a `null` list does, and a question
    that is no text is no question: the rest of the answer is read, per sentence as in a batch."""
    def one(sentence, attempt):
        if "Zed" in sentence:
            return {"verdict": "confusion", "questions": ["Who is Zed?", None, 7], "error_types": ["entity omission", None]}
        return {"verdict": "no confusion", "questions": [None], "error_types": [None]}

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (5 if batch_size == 1 else 2)
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert prediction.annotations[1].questions == ["Who is Zed?"]
    assert prediction.annotations[1].types == ["entity omission"]


@pytest.mark.parametrize("none", [["no confusion"], ["None"], "none", "", [""], ["N/A"]])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_kinds_written_as_none_are_no_kinds_in_both_modes(batch_size, none):
    """BooookScore's own annotations write "Types: no confusion" for a clean sentence, and models write
    "none" or "" the same way: no kinds, not an unknown kind asked again until no sentence is judged."""
    def one(sentence, attempt):
        if "Zed" in sentence:
            return {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission"]}
        return {"verdict": "no confusion", "questions": [], "error_types": none}

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (5 if batch_size == 1 else 2)
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]
    assert prediction.score == pytest.approx(4 / 5)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_confusion_whose_kinds_say_none_is_asked_again(batch_size):
    def one(sentence, attempt):
        if "Zed" in sentence and attempt == 0:
            return {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["none"]}
        return answer_for(sentence)

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (6 if batch_size == 1 else 3)
    assert prediction.annotations[1].attempts == 2 and prediction.annotations[1].types == ["entity omission"]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_kind_that_is_no_text_is_asked_again_in_both_modes(batch_size):
    """A kind written as a number may mean a place in the list of kinds: which one is a guess."""
    def one(sentence, attempt):
        if "Zed" in sentence and attempt == 0:
            return {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": [1]}
        return answer_for(sentence)

    prediction, calls = run_in_mode(one, batch_size)
    assert len(calls) == (6 if batch_size == 1 else 3)
    assert [a.status for a in prediction.annotations] == ["ok"] * 5
    assert prediction.annotations[1].attempts == 2 and prediction.annotations[1].types == ["entity omission"]


def test_a_sentence_written_twice_is_judged_once_per_occurrence():
    """A summary that says one sentence twice (inc summaries do) gets a verdict for each copy: the
    per-sentence prompt says which occurrence it is, so the second can be a duplication and the
    first not. Before, both copies had one prompt and so one verdict. A sentence written once is
    asked exactly as before (caches and calibrations stay valid)."""
    repeated = "The lamp stays lit and a ship reaches the harbor."
    sentences = SENTENCES[:4] + [repeated] + SENTENCES[4:]
    seen = []

    def responder(call):
        target = call.inputs["sentence"]
        seen.append(target)
        if "occurrence 2" in target:
            return {"verdict": "confusion", "questions": ["Why is this said again?"], "error_types": ["duplication"]}
        return NO

    prediction, _ = run(responder, sentences=sentences, concurrency=1)
    marked = [s for s in seen if s.startswith(repeated)]
    assert len(marked) == 2 and len(set(marked)) == 2
    assert all("occurs 2 times" in s for s in marked)
    assert sorted(s for s in seen if not s.startswith(repeated)) == sorted(SENTENCES[:3] + SENTENCES[4:])
    flags = [(a.sentence, a.confusing) for a in prediction.annotations]
    assert flags[3] == (repeated, False) and flags[4] == (repeated, True)
    assert prediction.score == 5 / 6


@pytest.mark.parametrize("copy", ["The lamp stays lit\nand a ship reaches the harbor.",
                                  "The lamp stays  lit and a ship reaches the harbor."])
def test_a_repeated_sentence_wrapped_or_spaced_otherwise_is_still_the_same_sentence(copy):
    """A summary hard-wrapped at a line width breaks a sentence it says twice at different places: to
    a reader (and the model) both are the same sentence, so both prompts name their occurrence; the
    count and the ordinals are those the model sees in the summary."""
    repeated = "The lamp stays lit and a ship reaches the harbor."
    sentences = SENTENCES[:4] + [copy] + SENTENCES[4:]
    seen = {}

    def responder(call):
        target = call.inputs["sentence"]
        seen[target.split("\n(")[0]] = target
        return NO

    run(responder, sentences=sentences, concurrency=1)
    assert seen[repeated].endswith("(This sentence occurs 2 times in the summary; judge occurrence 1.)")
    assert seen[copy].endswith("(This sentence occurs 2 times in the summary; judge occurrence 2.)")
    assert all(seen[s] == s for s in SENTENCES if s != repeated)  # said once: asked as before


def test_sentences_taken_out_of_their_summary_are_asked_with_the_targets_given():
    """Compile's examples hold one annotated sentence each: the target passed with it (a copy's
    occurrence in the whole summary) is what its prompt asks, the sentence what is recorded; a
    target count that does not match the sentences is a one-line error, not a silent mismatch."""
    from booklens.errors import BooklensError

    repeated = SENTENCES[3]
    target = f"{repeated}\n(This sentence occurs 2 times in the summary; judge occurrence 2.)"
    seen = []

    def responder(call):
        seen.append(call.inputs["sentence"])
        return NO

    lm = ScriptedLM(responder)
    scorer = CoherenceScorer(batch_size=1, concurrency=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = scorer(summary=SUMMARY, sentences=[repeated], targets=[target])
        assert seen == [target] and [a.sentence for a in prediction.annotations] == [repeated]
        with pytest.raises(BooklensError, match=r"^2 prompt targets for 1 sentence: give one per sentence$"):
            scorer(summary=SUMMARY, sentences=[repeated], targets=[target, target])


def cut_until(tokens: int):
    """A scripted LM whose answers are cut off at the token limit while it is below `tokens`."""
    def responder(call):
        whole = {"answers": [{"number": n, **answer_for(SENTENCES[n - 1])} for n in batch_numbers(call)]}
        if call.request["max_tokens"] < tokens:
            lm.backend.finish_reason = "length"
            return json.dumps(whole)[:40]
        lm.backend.finish_reason = "stop"
        return whole

    lm = ScriptedLM(responder)
    return lm


def test_batched_an_answer_cut_off_at_the_token_limit_is_re_asked_with_a_larger_budget():
    """As every other answer is (README, "an answer cut off at the token limit"): the model was on its
    way and needs room, so the re-ask doubles the budget at the same temperature, up to 4x."""
    first = CoherenceScorer(batch_size=5)._budget(5)["max_tokens"]
    lm = cut_until(first * 4)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = CoherenceScorer(batch_size=5, tries=3)(summary=SUMMARY, sentences=SENTENCES)
    calls = lm.backend.calls
    assert [c.request["max_tokens"] for c in calls] == [first, first * 2, first * 4]
    assert [c.request["temperature"] for c in calls] == [calls[0].request["temperature"]] * 3
    assert prediction.n_failed == 0 and [a.attempts for a in prediction.annotations] == [3] * 5
    assert [a.confusing for a in prediction.annotations] == [False, True, False, False, False]


def test_batched_an_answer_always_cut_off_fails_saying_so():
    first = CoherenceScorer(batch_size=5)._budget(5)["max_tokens"]
    lm = cut_until(10 ** 6)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = CoherenceScorer(batch_size=5, tries=4)(summary=SUMMARY, sentences=SENTENCES)
    assert [c.request["max_tokens"] for c in lm.backend.calls] == [first, first * 2, first * 4, first * 4]
    assert prediction.n_failed == 5
    assert all(a.error.startswith(f"the answer was cut off at the token limit ({first * 4} tokens): ")
               for a in prediction.annotations)


def test_batched_a_larger_budget_that_does_not_fit_the_window_ends_the_tries_not_the_run():
    from booklens.lm import ContextWindowExceeded

    first = CoherenceScorer(batch_size=5)._budget(5)["max_tokens"]

    def responder(call):
        if call.request["max_tokens"] > first:
            raise ContextWindowExceeded("the prompt and its answer budget do not fit the context window")
        lm.backend.finish_reason = "length"
        return '{"answers": [{"number": 1, "verd'

    lm = ScriptedLM(responder)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        prediction = CoherenceScorer(batch_size=5, tries=3)(summary=SUMMARY, sentences=SENTENCES)
    assert len(lm.backend.calls) == 2 and prediction.n_failed == 5
    assert all(a.error.startswith(f"the answer was cut off at the token limit ({first} tokens): ") and
               a.error.endswith(f"; a larger answer budget ({first * 2} tokens) does not fit the context window")
               for a in prediction.annotations)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_summary_that_is_one_of_the_judges_demos_is_noted(batch_size):
    """A summary the judge holds among its demos is judged with its own labels in the prompt (the
    human file `score` reads has the default judge's two demo summaries in it): its verdicts repeat
    the labels, so its record says so; another summary gets no such note."""
    from booklens.steps import score_summaries

    scorer = CoherenceScorer(batch_size=batch_size)
    if batch_size == 1:
        scorer.detect.demos = [dspy.Example(summary=" ".join(SUMMARY.split(" ")), sentence=s, **answer_for(s))
                               for s in SENTENCES[:2]]
    else:
        answers = [{"number": n, **answer_for(s)} for n, s in enumerate(SENTENCES[:2], 1)]
        scorer.detect_batch.demos = [dspy.Example(summary=SUMMARY.replace(". ", ".\n"), sentences="",
                                                  answers=answers)]

    def responder(call):
        if batch_size == 1:
            return answer_for(call.inputs["sentence"])
        return {"answers": [{"number": n, **NO} for n in batch_numbers(call)]}

    with dspy.context(lm=ScriptedLM(responder), adapter=BooklensAdapter()):
        results = score_summaries({"own": SUMMARY, "other": "Anna walks."}, scorer=scorer)
    assert results["own"].notes == ["this summary is one of the judge's demos, with 2 of its sentences labelled: "
                                    "its verdicts on them repeat those labels, not the judge's reading"]
    assert results["other"].notes == []


@pytest.mark.parametrize("batch_size", [1, 3])
def test_an_unknown_kind_is_named_in_the_recorded_error_in_both_modes(batch_size):
    """The per-sentence record said only "1 validation error for list[literal[...]]", naming no kind,
    where the batched one names it: a user finding out why a model's answers were refused reads which
    kind it wrote in either mode."""
    def one(sentence, attempt):
        if "Zed" in sentence:
            return {"verdict": "confusion", "questions": ["Who is Zed?"],
                    "error_types": ["entity omission", "plot hole"]}
        return answer_for(sentence)

    prediction, _ = run_in_mode(one, batch_size)
    failed = prediction.annotations[1]
    assert failed.status == "failed" and failed.attempts == 3
    assert "unknown error type(s) 'plot hole'" in failed.error, failed.error


def test_a_summary_whose_full_stops_punkt_does_not_split_at_is_noted():
    """Sentences end at . ? ! and at Chinese and Japanese stops: a Chinese summary is judged in its
    sentences, with nothing to note. A Hindi one, whose danda ends no sentence here, is one
    sentence, so its score can only be 0 or 100; the record says how many run on past such a stop."""
    from booklens.steps import score_summaries

    with dspy.context(lm=ScriptedLM(lambda call: NO), adapter=BooklensAdapter()):
        results = score_summaries({"zh": "玛拉看守灯塔。泽德出现在门口。灯一直亮着。", "en": SUMMARY,
                                   "hi": "मारा दीपस्तंभ की रखवाली करती है। ज़ेड दरवाज़े पर आता है।",
                                   "end": "Mara keeps the light. मारा दीपस्तंभ की रखवाली करती है।"},
                                  scorer=CoherenceScorer())
    assert results["zh"].n_sentences == 3 and results["zh"].notes == []
    assert results["hi"].n_sentences == 1
    assert results["hi"].notes == ["sentences are split at . ? ! and 。 ！ ？ ． only: 1 of the summary's 1 "
                                   "sentences holds another full stop inside ('।'), and was judged whole"]
    assert results["en"].notes == [] and results["end"].notes == []


def test_list_items_without_a_full_stop_between_them_are_noted():
    """A bulleted summary whose items end in no . ? ! is one sentence to Punkt (it does not split at
    line breaks), judged whole; the record says so. Items that end in a full stop are sentences of
    their own, and prose hard-wrapped over lines is no list."""
    from booklens.steps import score_summaries

    with dspy.context(lm=ScriptedLM(lambda call: NO), adapter=BooklensAdapter()):
        results = score_summaries({
            "bare": "- Mara keeps the lighthouse\n- Zed appears at the door\n* The lamp stays lit",
            "stops": "- Mara keeps the lighthouse.\n- Zed appears at the door.\n- The lamp stays lit.",
            "wrapped": "Mara keeps the lighthouse on Gull Rock\nwith her father - and Zed\n- who is new - comes.",
        }, scorer=CoherenceScorer())
    assert results["bare"].n_sentences == 1
    assert results["bare"].notes == ["NLTK's Punkt does not split sentences at line breaks: 1 of the summary's "
                                     "1 sentences runs over several list items with no . ? ! between them, and "
                                     "was judged whole"]
    assert results["stops"].n_sentences == 3 and results["stops"].notes == []
    assert results["wrapped"].notes == []


def test_list_numbers_that_punkt_makes_sentences_of_are_noted():
    """Punkt ends a sentence after an item's number ("1."), which is then judged as a sentence of its
    own (or ends the item before it): the record says how many. A year ending a sentence is no such
    number."""
    from booklens.steps import score_summaries

    with dspy.context(lm=ScriptedLM(lambda call: NO), adapter=BooklensAdapter()):
        results = score_summaries({"numbered": "1. Mara keeps the lighthouse. 2. Zed appears at the door.",
                                   "dated": "Mara keeps the lighthouse until 1917. Zed comes in 1918."},
                                  scorer=CoherenceScorer())
    assert results["numbered"].sentences[0].sentence == "1."
    assert results["numbered"].notes == ["NLTK's Punkt ends sentences after a number and its stop: 2 of the "
                                         "summary's 4 sentences are or end in a number alone ('1.'), and were "
                                         "judged as sentences"]
    assert results["dated"].notes == []
