"""The judges: default few-shot programs (demos from training books only, rebuilt byte for byte),
prompt layout for prefix reuse, verdicts that do not overclaim, calibration figures and the
store, and the judge object with its warning."""

from __future__ import annotations

import json
import random
from pathlib import Path

import dspy
import pytest

from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter
from booklens.testing import ScriptedLM

REPO = Path(__file__).resolve().parents[1]


def clean(call):
    return {"verdict": "no confusion", "questions": [], "error_types": []}


def run_with(responder, fn):
    lm = ScriptedLM(responder)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        return fn(), lm


# ---------------------------------------------------------------------------
# Prompt layout: what calls share comes first


def test_coherence_calls_of_one_summary_share_everything_up_to_the_sentence():
    from booklens.judges import load_judge

    scorer = load_judge("coherence", concurrency=1)
    summary = "Anna sails to Lisbon. Her brother stays home. The storm sinks the ship."
    sentences = ["Anna sails to Lisbon.", "Her brother stays home.", "The storm sinks the ship."]
    _, lm = run_with(clean, lambda: scorer(summary=summary, sentences=sentences))
    prompts = [c.messages for c in lm.backend.calls]
    assert len(prompts) == 3
    first, second = prompts[0], prompts[1]
    # system message and every demo turn identical; the last message differs only after the summary
    assert first[:-1] == second[:-1]
    assert len(first) == 1 + 2 * len(scorer.detect.demos) + 1
    last_a, last_b = first[-1]["content"], second[-1]["content"]
    shared = last_a.split("[[ ## sentence ## ]]")[0]
    assert shared == last_b.split("[[ ## sentence ## ]]")[0] and summary in shared
    assert last_a.index(summary) < last_a.index("[[ ## sentence ## ]]") < last_a.rindex(sentences[0])


def test_demos_of_one_summary_show_it_once():
    from booklens.judges import load_judge
    from booklens.programs.coherence import SAME_SUMMARY_NOTE

    scorer = load_judge("coherence", concurrency=1)
    demo_summaries = {d["summary"] for d in scorer.detect.demos}
    assert len(demo_summaries) == 2 and len(scorer.detect.demos) >= 20
    _, lm = run_with(clean, lambda: scorer(summary="One line.", sentences=["One line."]))
    text = json.dumps(lm.backend.calls[0].messages)
    for summary in demo_summaries:
        assert text.count(json.dumps(summary)[1:-1]) == 1  # each demo summary appears once
    user_turns = [m["content"] for m in lm.backend.calls[0].messages[1:-1] if m["role"] == "user"]
    assert sum(1 for t in user_turns if t.startswith(SAME_SUMMARY_NOTE)) == len(scorer.detect.demos) - 2


def test_grouping_keeps_demos_that_do_not_share_a_summary_apart():
    from booklens.programs.coherence import group_demos

    demos = [{"summary": "A", "sentence": "1"}, {"summary": "B", "sentence": "2"}, {"summary": "A", "sentence": "3"},
             {"sentence": "4"}]
    assert [[d["sentence"] for d in g] for g in group_demos(demos)] == [["1", "3"], ["2"], ["4"]]


def test_verification_calls_share_instructions_and_demos():
    from booklens.judges import load_judge
    from booklens.programs.faithfulness import build_checker

    verifier = load_judge("verification")
    checker = build_checker(evidence_mode="given", verifier=verifier, concurrency=1)
    respond = lambda call: {"label": "faithful", "reason": "Passage 1 says so.", "supporting_passages": [1],  # noqa: E731
                            "refuting_passages": []}
    _, lm = run_with(respond, lambda: checker(claims=["Anna sails.", "Bo stays."],
                                              given_evidence=[["Anna sailed."], ["Bo stayed at home."]]))
    a, b = (c.messages for c in lm.backend.calls)
    assert a[:-1] == b[:-1] and len(a) == 1 + 2 * 6 + 1
    assert a[-1]["content"].index("Anna sailed.") < a[-1]["content"].index("Anna sails.")


# ---------------------------------------------------------------------------
# Verdicts that do not overclaim


@pytest.mark.parametrize("label, reason, expected", [
    ("faithful", "can't verify", "can't verify"),
    ("faithful", "The passages do not mention Lisbon at all.", "can't verify"),
    ("unfaithful", "There is not enough information in the passages to tell.", "can't verify"),
    ("faithful", "The evidence neither supports nor contradicts the claim.", "can't verify"),
    ("partial support", "The claim cannot be verified from these passages.", "can't verify"),
    ("partial support", "Passage 1 shows the voyage but does not mention the storm.", "partial support"),
    ("faithful", "Passage 2 says Anna sailed to Lisbon.", "faithful"),
    ("unfaithful", "Passage 1 says she stayed in Porto, not Lisbon.", "unfaithful"),
    ("can't verify", "Nothing about this.", "can't verify"),
    # A reason that says the evidence goes against the claim keeps it unfaithful, even beside
    # words about what the evidence does not say.
    ("unfaithful", "The text does not say she sailed; passage 1 says she stayed home, so the claim is false.",
     "unfaithful"),
    ("unfaithful", "No evidence she sailed: passage 1 contradicts it.", "unfaithful"),
    ("unfaithful", "The passages do not mention Lisbon at all.", "can't verify"),
    # Partial support says part of the claim lacks evidence; only an undecidable reason moves it.
    ("partial support", "She sailed, but there is no evidence that it was to Lisbon.", "partial support"),
    ("faithful", "There is no evidence for this in the passages.", "can't verify"),
])
def test_a_reason_that_leaves_the_claim_open_makes_the_verdict_cant_verify(label, reason, expected):
    from booklens.programs.faithfulness import build_checker

    checker = build_checker(evidence_mode="given", concurrency=1)
    respond = lambda call: {"label": label, "reason": reason, "supporting_passages": [],  # noqa: E731
                            "refuting_passages": []}
    result, lm = run_with(respond, lambda: checker(claims=["Anna sails to Lisbon."],
                                                   given_evidence=[["Anna sailed to Lisbon in May."]]))
    verdict = result.claims[0]
    assert verdict.label == expected and len(lm.backend.calls) == 1
    if expected != label:
        assert verdict.model_label == label and "does not settle" in verdict.relabelled
        assert result.label_counts["can't verify"] == 1
    else:
        assert verdict.model_label is None and verdict.relabelled is None


@pytest.mark.parametrize("label, reason, expected", [
    # The reason cites a passage for the claim; what it says is missing is some other thing.
    ("faithful", "Passage 2 confirms it; nothing in the passages contradicts it.", "faithful"),
    ("faithful", "Passage 1 directly states this; there is no mention of any other cause.", "faithful"),
    ("faithful", "The text does not state it outright, but passage 2 implies it.", "faithful"),
    # What the passage says is itself about a lack: the story's, not the evidence's.
    ("faithful", "Passage 2 says Anna got no support from her family before she sailed.", "faithful"),
    ("faithful", "Passage 1 shows Anna had no information about the storm when she sailed.", "faithful"),
    ("faithful", "The passage shows Ben could not find any evidence of the theft, as the claim says.", "faithful"),
    # Partial support: one part supported, the rest open, is what the label means.
    ("partial support", "Passage 1 supports the voyage, but the date cannot be verified.", "partial support"),
    # A supported part does not make a faithful verdict of a claim whose other part is open.
    ("faithful", "Passage 1 mentions Lisbon, but whether Anna sailed there cannot be determined.", "can't verify"),
    ("faithful", "Nothing in passage 1 states that Anna sailed.", "can't verify"),
    ("faithful", "The book says nothing about Lisbon.", "can't verify"),
    ("partial support", "Passage 2 says nothing of the date; the claim cannot be verified.", "can't verify"),
    ("partial support", "The claim cannot be verified; passage 1 says Anna was in Porto in May.", "can't verify"),
    ("faithful", "Passage 1 mentions Lisbon; the passages do not say that Anna sailed there.", "can't verify"),
    ("faithful", "Passage 1 shows she sailed; there is no evidence she went to Lisbon.", "can't verify"),
    ("faithful", "Passage 1 shows she sailed, but it does not mention Lisbon.", "can't verify"),
])
def test_a_reason_that_cites_support_keeps_its_verdict(label, reason, expected):
    """The rule above read any "no mention", "nothing in" or "no support" as the evidence not settling
    the claim, so a strong judge's "Passage 2 confirms it; nothing in the passages contradicts it" was
    recorded as can't verify, and its faithful share came out too low."""
    from booklens.programs.faithfulness import build_checker

    checker = build_checker(evidence_mode="given", concurrency=1)
    respond = lambda call: {"label": label, "reason": reason, "supporting_passages": [1],  # noqa: E731
                            "refuting_passages": []}
    result, _ = run_with(respond, lambda: checker(claims=["Anna sails to Lisbon."],
                                                  given_evidence=[["Anna sailed to Lisbon in May."]]))
    verdict = result.claims[0]
    assert verdict.label == expected
    assert (verdict.model_label, verdict.relabelled is None) == ((None, True) if expected == label else (label, False))


def test_the_binary_rater_has_two_labels_and_keeps_them():
    from booklens.programs.faithfulness import build_checker, build_verifier

    checker = build_checker(evidence_mode="given", verifier=build_verifier(label_set="binary"), concurrency=1)
    answers = iter([{"label": "partial support", "reason": "x", "supporting_passages": [], "refuting_passages": []},
                    {"label": "faithful", "reason": "The passages do not mention it.", "supporting_passages": [],
                     "refuting_passages": []}])
    result, lm = run_with(lambda call: next(answers), lambda: checker(claims=["Anna sails."],
                                                                      given_evidence=[["Anna sailed."]]))
    verdict = result.claims[0]
    assert verdict.label == "faithful" and verdict.attempts == 2 and verdict.model_label is None
    schema = lm.backend.calls[0].request["schema"]
    assert set(schema["properties"]["label"]["enum"]) == {"faithful", "unfaithful"}


# ---------------------------------------------------------------------------
# The default programs


@pytest.mark.parametrize("judge, mode, demos", [("coherence", "per-sentence", 20), ("verification", "four-way", 6),
                                                ("binary", "binary", 6)])
def test_default_programs_load_with_their_recorded_fingerprint(judge, mode, demos):
    from booklens.judges import default_path, judge_mode, load_judge, program_fingerprint
    from booklens.optimizers.artifacts import artifact_metadata

    program = load_judge(judge)
    block = artifact_metadata(default_path(judge))
    assert program._booklens_judge == "default" and judge_mode(judge, program) == mode
    assert program_fingerprint(program) == block["fingerprint"]
    assert block["default"] is True and block["dataset"]["files"] and block["selection"]["rule"]
    predictor = program.detect if judge == "coherence" else program.verify
    assert len(predictor.demos) >= demos


def test_zero_shot_and_artifact_judges_are_told_apart(tmp_path):
    from booklens.judges import default_path, load_judge, program_fingerprint

    zero = load_judge("coherence", zero_shot=True)
    assert zero._booklens_judge == "zero-shot" and not zero.detect.demos
    assert program_fingerprint(zero) != program_fingerprint(load_judge("coherence"))
    copy = tmp_path / "mine.json"
    copy.write_bytes(default_path("verification").read_bytes())
    assert load_judge("verification", copy)._booklens_judge == str(copy)
    with pytest.raises(BooklensError, match="four-way verification program and cannot be loaded as a binary"):
        load_judge("binary", copy)
    with pytest.raises(BooklensError, match="^give either program or zero_shot, not both$"):
        load_judge("coherence", copy, zero_shot=True)


def test_a_missing_default_program_is_named_with_the_callers_words_for_the_way_out(tmp_path, monkeypatch):
    """The advice names the library's keyword for a library caller and the option within a command."""
    import booklens.judges as judges
    from booklens.errors import command_line

    monkeypatch.setattr(judges, "DEFAULTS_DIR", tmp_path)
    with pytest.raises(BooklensError, match=r"\(.*coherence.*\); reinstall booklens or pass zero_shot$"):
        judges.load_judge("coherence")
    within_command = command_line.set(True)
    try:
        with pytest.raises(BooklensError, match=r"; reinstall booklens or pass --zero-shot$"):
            judges.load_judge("coherence")
    finally:
        command_line.reset(within_command)


def test_the_judge_line_counts_one_demo_in_the_singular():
    from booklens.judges import judge_info, judge_line, load_judge

    program = load_judge("coherence")
    program.detect.demos = program.detect.demos[:1]
    line = judge_line(judge_info("coherence", program, ScriptedLM(clean), store={}))
    assert "(per-sentence, 1 demo, " in line, line


def test_default_coherence_prompt_leaves_room_for_a_summary_in_the_embedded_window():
    from booklens.judges import JUDGED_SUMMARY_TOKENS, coherence_demo_limit, coherence_prompt_tokens, load_judge

    assert coherence_prompt_tokens(load_judge("coherence")) <= coherence_demo_limit()
    assert coherence_demo_limit() + JUDGED_SUMMARY_TOKENS < 8192 / 1.1


def test_a_summary_as_long_as_judges_build_leaves_room_for_keeps_every_demo_when_scored():
    """`judges build` sizes the default demos by the rule each call fits them by: a summary of
    `JUDGED_SUMMARY_TOKENS` whose sentences are at most `TARGET_SENTENCE_TOKENS` long is judged in
    the embedded window with every demo."""
    from booklens.judges import EMBEDDED_WINDOW, JUDGED_SUMMARY_TOKENS, TARGET_SENTENCE_TOKENS, load_judge
    from booklens.text import count_tokens, split_sentences

    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    summary = sentence
    while count_tokens(summary + " " + sentence) <= JUDGED_SUMMARY_TOKENS:
        summary += " " + sentence
    assert count_tokens(summary) > JUDGED_SUMMARY_TOKENS - 40 and count_tokens(sentence) <= TARGET_SENTENCE_TOKENS
    scorer = load_judge("coherence", concurrency=1)
    lm = ScriptedLM(clean, context_window=EMBEDDED_WINDOW)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = scorer(summary=summary, sentences=split_sentences(summary)[:2])
    assert result.demos_dropped == 0 and result.demos_shown == len(scorer.detect.demos)


def test_the_default_coherence_prompt_fits_smollm2_tokens(shared_dir):
    """Counted with the embedded model's own tokenizer and chat template, on the longest test-split summary."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from booklens.data.booookscore import load_human_summaries
    from booklens.judges import load_judge
    from booklens.lm.embedded import local_model_path
    from booklens.programs.coherence import shared_summary_adapter
    from booklens.text import count_tokens

    items = load_human_summaries(shared_dir / "data" / "booookscore" / "human")
    longest = max((a for _, a in items), key=lambda a: count_tokens(a.summary))
    program = load_judge("coherence")
    messages = shared_summary_adapter(BooklensAdapter()).format(
        program.detect.signature, program.detect.demos,
        {"summary": longest.summary, "sentence": max(longest.sentences, key=len)})
    llm = llama_cpp.Llama(model_path=local_model_path(), n_ctx=512, vocab_only=True, verbose=False)
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata["tokenizer.chat_template"]
    prompt = Jinja2ChatFormatter(template, eos_token="", bos_token="")(messages=messages).prompt
    tokens = len(llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True))
    assert tokens + 256 <= 8192, tokens


# ---------------------------------------------------------------------------
# Demos come from training books only, and the build is reproducible


def test_no_demo_comes_from_a_test_split_book(shared_dir):
    from booklens.data.booookscore import load_human_summaries, split_human_summaries
    from booklens.data.fables import TABLE5_BOOKS, all_claims, load_fables, split_summaries
    from booklens.judges import load_judge

    human = shared_dir / "data" / "booookscore" / "human"
    splits = split_human_summaries(load_human_summaries(human))
    book_of = {a.summary: (name, a.book) for name, items in splits.items() for _, a in items}
    coherence = load_judge("coherence")
    demo_splits = {book_of[d["summary"]][0] for d in coherence.detect.demos + coherence.detect_batch.demos}
    assert demo_splits == {"train"}

    fables = split_summaries(load_fables(shared_dir / "data" / "fables" / "FABLES.json"))
    split_of = {c.claim.strip(): name for name, items in fables.items() for c in all_claims(items)}
    book_of_claim = {c.claim.strip(): c.book for items in fables.values() for c in all_claims(items)}
    for judge in ("verification", "binary"):
        program = load_judge(judge)
        claims = [d["claim"] for d in program.verify.demos]
        assert {split_of[c] for c in claims} == {"train"}
        assert not {book_of_claim[c] for c in claims} & set(TABLE5_BOOKS)
        assert [d["claim"] for d in program.verify_without_evidence.demos] == claims


def test_judges_build_regenerates_the_shipped_files_byte_for_byte(shared_dir, tmp_path):
    from booklens.judges import DEFAULT_FILES, DEFAULTS_DIR, build_defaults

    build_defaults(shared_dir / "data" / "booookscore" / "human", shared_dir / "data" / "fables" / "FABLES.json",
                   tmp_path)
    for name in DEFAULT_FILES.values():
        assert (tmp_path / name).read_bytes() == (DEFAULTS_DIR / name).read_bytes(), name


def test_the_package_ships_the_default_programs():
    """Each shipped judge file (and its calibration) is package data of a package the build installs."""
    import fnmatch

    try:
        import tomllib
    except ImportError:  # Python 3.10
        from pip._vendor import tomli as tomllib

    from booklens.judges import DEFAULTS_DIR

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "booklens.defaults" in setuptools["packages"]
    patterns = setuptools["package-data"]["booklens.defaults"]
    shipped = sorted(p.name for p in DEFAULTS_DIR.iterdir() if p.is_file())
    assert "calibration.json" in shipped and "coherence.json" in shipped and "verification.json" in shipped
    assert all(any(fnmatch.fnmatch(name, pattern) for pattern in patterns) for name in shipped), (shipped, patterns)


# ---------------------------------------------------------------------------
# Bootstrap figures


def test_figures_carry_value_interval_and_sample_size():
    from booklens.metrics.bootstrap import confusion_counts, figure

    units = [confusion_counts([True, False, True], [True, False, False]),
             confusion_counts([False, False], [True, False]), confusion_counts([True], [True])]
    f1 = figure(units, "f1", n=6)
    assert f1["value"] == round(2 * 2 / (2 * 2 + 1 + 1), 4) and f1["n"] == 6
    lo, hi = f1["ci95"]
    assert 0.0 <= lo <= f1["value"] <= hi <= 1.0
    assert figure(units, "f1", n=6) == f1  # fixed seed
    kappa = figure([[0, 0, 0, 5]], "kappa", n=5)
    assert kappa["value"] is None and kappa["ci95"] == [None, None]


# ---------------------------------------------------------------------------
# Calibration, the store, the judge object


def scripted_judge(call):
    if call.wants("verdict"):
        sentence = call.inputs.get("sentence", "")
        if random.Random(sentence).random() < 0.3:
            return {"verdict": "confusion", "questions": ["Who?"], "error_types": ["entity omission"]}
        return {"verdict": "no confusion", "questions": [], "error_types": []}
    return {"label": "faithful", "reason": "Passage 1 says so.", "supporting_passages": [1], "refuting_passages": []}


def test_coherence_calibration_counts_agree_with_the_human_labels(shared_dir):
    from booklens.calibration import calibrate, coherence_sample
    from booklens.judges import load_judge

    human = shared_dir / "data" / "booookscore" / "human"
    program = load_judge("coherence", concurrency=1)
    lm = ScriptedLM(scripted_judge)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        entry = calibrate("coherence", program, lm, human_dir=human, books=1)
    items, info = coherence_sample(human, books=1)
    assert [r["book"] for r in entry["summaries"]] == [a.book for _, a in items] and len(items) == 2
    assert entry["data"]["split"] == "test" and len(info["books"]) == 1
    expected = [0, 0, 0, 0]
    for _, annotation in items:
        for sentence, human_label in zip(annotation.sentences, annotation.sentence_annotations()):
            said = random.Random(sentence).random() < 0.3
            expected[[said and human_label.confusing, said and not human_label.confusing,
                      not said and human_label.confusing, not said and not human_label.confusing].index(True)] += 1
    c = entry["counts"]
    assert [c["tp"], c["fp"], c["fn"], c["tn"]] == expected
    assert entry["n"]["sentences"] == sum(expected) == entry["figures"]["kappa"]["n"]
    assert entry["usage"]["calls"] == sum(expected) and entry["demos"] >= 20 and entry["program"] == "default"


def test_verification_calibration_scores_every_label_and_counts_unfaithful_found(shared_dir, tmp_path,
                                                                                  monkeypatch):
    import booklens.calibration as calibration
    from booklens.calibration import calibrate, verification_sample
    from booklens.judges import judge_info, load_judge, store_calibration, user_store_path

    fables = shared_dir / "data" / "fables" / "FABLES.json"
    summaries, info = verification_sample(fables, books=1)
    assert info["split"] == "test" and len(info["books"]) == 1 and len(summaries) == 5
    # two of the book's five summaries keep the test quick
    monkeypatch.setattr(calibration, "verification_sample", lambda *a, **k: (summaries[:2], info))
    program = load_judge("verification")
    lm = ScriptedLM(scripted_judge)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        entry = calibrate("verification", program, lm, fables_path=fables, books=1)
    counts = entry["counts"]
    assert counts["unfaithful_found"] == 0 and counts["unfaithful"] > 0
    assert counts["predicted"]["faithful"] == counts["claims"] == entry["n"]["claims"]
    assert set(entry["figures"]["f1"]) == {"faithful", "unfaithful", "partial support", "can't verify"}
    assert entry["figures"]["f1"]["unfaithful"]["value"] == 0.0
    faithful_share = entry["figures"]["f1"]["faithful"]["support"] / counts["claims"]
    assert entry["figures"]["accuracy"]["value"] == round(faithful_share, 4)

    store = user_store_path(tmp_path)
    store_calibration(entry, store)
    before = store.read_bytes()
    store_calibration(entry, store)
    assert store.read_bytes() == before  # same figures, same bytes
    from booklens.judges import load_store

    info = judge_info("verification", program, lm, store=load_store(tmp_path))
    assert info.calibration["key"] == entry["key"] and info.demos == 6
    assert info.warning.startswith(f"low agreement: this judge found 0 of {counts['unfaithful']} unfaithful claims")


def test_a_four_way_judge_is_held_to_the_reference_on_the_claims_the_reference_was_scored_on():
    """FABLES' 0.26 unfaithful F1 is over claims humans labelled faithful or unfaithful. A four-way
    judge that calls partly supported claims unfaithful has a lower F1 over all claims, but is
    compared on the same claims as the reference."""
    from booklens.judges import judge_warning
    from booklens.records import JudgeInfo

    def info(all_claims: float, two_labels, mode: str = "four-way") -> JudgeInfo:
        calibration = {"sample_name": "S", "counts": {"unfaithful": 2, "unfaithful_found": 2},
                       "figures": {"f1": {"unfaithful": {"value": all_claims}}},
                       "table5": {"n": 20, "f1_unfaithful": two_labels}}
        return JudgeInfo(task="verification", mode=mode, program="default", program_sha256="0" * 64, demos=6,
                         lm="openai/x", calibration=calibration)

    assert judge_warning(info(0.21, 1.0)) is None
    assert judge_warning(info(0.9, 0.1)) == (
        "low agreement: this judge found 2 of 2 unfaithful claims on S; unfaithful F1 0.10 on the 20 claims humans "
        "labelled faithful or unfaithful, where FABLES' GPT-4-Turbo rater reaches 0.26")
    assert judge_warning(info(0.9, None)).startswith("low agreement")  # no unfaithful claim: nothing measured
    # The binary rater is scored on those claims only: its own figure is the comparable one.
    assert judge_warning(info(1.0, 0.1, mode="binary")) is None

def test_a_judge_just_below_a_reference_is_warned_and_the_two_figures_read_apart():
    """The references are the measured figures (GPT-4's kappa 0.1346, FABLES' 0.259): a judge between
    them and their two-decimal roundings is below them, and the warning shows enough digits to tell."""
    from booklens.judges import COHERENCE_REFERENCE_KAPPA, judge_warning
    from booklens.records import JudgeInfo

    coherence = JudgeInfo(task="coherence", mode="per-sentence", program="default", program_sha256="0" * 64,
                          demos=4, lm="openai/x",
                          calibration={"sample_name": "S", "counts": {"tp": 3, "human_confusing": 9},
                                       "figures": {"kappa": {"value": 0.132}}})
    assert judge_warning(coherence) == (
        "low agreement: this judge found 3 of 9 sentences humans marked confusing on S; kappa 0.132, where "
        "GPT-4's released labels reach 0.135")
    coherence.calibration["figures"]["kappa"]["value"] = COHERENCE_REFERENCE_KAPPA
    assert judge_warning(coherence) is None
    coherence.calibration["figures"]["kappa"]["value"] = 0.04  # far below: two decimals say it
    assert judge_warning(coherence).endswith("kappa 0.04, where GPT-4's released labels reach 0.13")
    verifier = JudgeInfo(task="verification", mode="binary", program="default", program_sha256="0" * 64, demos=6,
                         lm="openai/x", calibration={"sample_name": "S", "counts": {"unfaithful": 2},
                                                     "figures": {"f1": {"unfaithful": {"value": 0.257}}}})
    assert judge_warning(verifier).endswith("unfaithful F1 0.257, where FABLES' GPT-4-Turbo rater reaches 0.259")


def prose(call):
    return "Sorry, I cannot help with that."


def test_a_coherence_judge_that_never_answers_is_not_calibrated(shared_dir):
    from booklens.calibration import JudgedNothing, calibrate

    human = shared_dir / "data" / "booookscore" / "human"
    program = load_judge_for_calibration("coherence")
    lm = ScriptedLM(prose)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(JudgedNothing) as caught:
        calibrate("coherence", program, lm, human_dir=human, books=1)
    message = str(caught.value)
    assert message.startswith("coherence calibration: the judge gave no valid verdict on any of the ")
    assert "(first: unparseable answer" in message and "\n" not in message


def test_a_verifier_that_never_answers_is_not_calibrated(shared_dir, monkeypatch):
    import booklens.calibration as calibration
    from booklens.calibration import JudgedNothing, calibrate, verification_sample

    fables = shared_dir / "data" / "fables" / "FABLES.json"
    summaries, info = verification_sample(fables, books=1)
    monkeypatch.setattr(calibration, "verification_sample", lambda *a, **k: (summaries[:1], info))
    lm = ScriptedLM(prose)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(JudgedNothing) as caught:
        calibrate("verification", load_judge_for_calibration("verification"), lm, fables_path=fables, books=1)
    claims = len(summaries[0].claims)
    assert str(caught.value).startswith(f"verification calibration: the judge gave no valid verdict on any of the "
                                        f"{claims} claims (first: ")


def test_a_sample_with_nothing_to_compare_is_refused_before_any_call(shared_dir, tmp_path):
    """One book's annotations fall in the training split: an entry of no figures would replace a measured one."""
    from booklens.calibration import calibrate

    coherence = json.loads((shared_dir / "data" / "booookscore" / "human" / "summary-gpt4-4096-inc.json").read_text())
    first = next(iter(coherence))
    one_summary = tmp_path / "one-book.json"
    one_summary.write_text(json.dumps({first: coherence[first]}))
    fables = json.loads((shared_dir / "data" / "fables" / "FABLES.json").read_text())
    first = next(iter(fables["FABLES"]))
    one_book = tmp_path / "fables-one.json"
    one_book.write_text(json.dumps({**fables, "FABLES": {first: fables["FABLES"][first]}}))
    lm = ScriptedLM(prose)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        with pytest.raises(BooklensError, match="coherence calibration: the sample drawn from .* holds no annotated "
                                                "sentence .*; nothing stored"):
            calibrate("coherence", load_judge_for_calibration("coherence"), lm, human_dir=one_summary)
        with pytest.raises(BooklensError, match="verification calibration: the sample drawn from .* holds no "
                                                "labelled claim"):
            calibrate("verification", load_judge_for_calibration("verification"), lm, fables_path=one_book)
    assert lm.backend.calls == []


def test_a_partly_failed_calibration_is_stored_and_counts_the_failures(shared_dir, monkeypatch):
    import booklens.calibration as calibration
    from booklens.calibration import calibrate, verification_sample
    from booklens.judges import judge_info, judge_line

    def some_prose(call):
        sentence = call.inputs.get("sentence") or call.inputs.get("claim") or ""
        return prose(call) if random.Random(sentence).random() < 0.25 else scripted_judge(call)

    human = shared_dir / "data" / "booookscore" / "human"
    lm = ScriptedLM(some_prose)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        entry = calibrate("coherence", load_judge_for_calibration("coherence"), lm, human_dir=human, books=1)
    n = entry["n"]
    assert 0 < n["failed"] < n["sentences"] and n["compared"] == n["sentences"] - n["failed"]
    assert entry["figures"]["kappa"]["n"] == n["compared"]
    line = judge_line(judge_info("coherence", load_judge_for_calibration("coherence"), lm, store={entry["key"]: entry}))
    assert f"({n['failed']} of {n['sentences']} sentences got no valid verdict: left out)" in line

    fables = shared_dir / "data" / "fables" / "FABLES.json"
    summaries, info = verification_sample(fables, books=1)
    monkeypatch.setattr(calibration, "verification_sample", lambda *a, **k: (summaries[:1], info))
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        entry = calibrate("verification", load_judge_for_calibration("verification"), lm, fables_path=fables,
                          books=1)
    assert 0 < entry["counts"]["failed"] < entry["counts"]["claims"]
    line = judge_line(judge_info("verification", load_judge_for_calibration("verification"), lm,
                                 store={entry["key"]: entry}))
    assert (f"({entry['counts']['failed']} of {entry['counts']['claims']} claims got no valid verdict: counted as "
            "wrong)") in line


def test_calibration_measures_an_artifact_on_the_test_split_it_was_compiled_with(shared_dir, tmp_path, monkeypatch):
    """An artifact compiled on the seed-3 split is measured on seed 3's test books, not seed 0's
    (which hold books it took demos from), whatever --seed draws the sample."""
    from booklens import calibration
    from booklens.calibration import calibrate
    from booklens.data.fables import load_fables, split_summaries, verification_demo
    from booklens.judges import load_judge, new_program
    from booklens.optimizers.artifacts import save_program

    fables = shared_dir / "data" / "fables" / "FABLES.json"
    splits = split_summaries(load_fables(fables), seed=3)
    learned = {s.book for name in ("train", "dev") for s in splits[name]}
    program = new_program("verification")
    program.verify.demos = [verification_demo(c) for s in splits["train"] for c in s.claims
                            if c.label in ("Yes", "No")][:2]
    path = tmp_path / "seed3.json"
    save_program(program, path, task="verification", program_config={"label_set": "four-way"}, seed=3,
                 split={"seed": 3, "by": "book"})
    drawn = calibration.verification_sample

    def first_claims(*args, **kwargs):  # the books are what is checked: a few claims of each will do
        summaries, info = drawn(*args, **kwargs)
        for summary in summaries:
            summary.claims = summary.claims[:3]
        return summaries, info

    monkeypatch.setattr(calibration, "verification_sample", first_claims)
    lm = ScriptedLM(scripted_judge)
    for seed in (0, 1):
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            entry = calibrate("verification", load_judge("verification", path), lm, fables_path=fables, seed=seed)
        assert entry["data"]["books"] and not set(entry["data"]["books"]) & learned, seed
        assert entry["data"]["split_seed"] == 3 and entry["data"]["seed"] == seed


def test_calibration_refuses_a_sample_that_holds_the_programs_own_demos(shared_dir):
    from booklens.calibration import DemosInSample, calibrate, coherence_sample, verification_sample
    from booklens.data.fables import verification_demo

    human = shared_dir / "data" / "booookscore" / "human"
    items, _ = coherence_sample(human, books=1)
    program = load_judge_for_calibration("coherence")
    source, annotation = items[0]
    program.detect.demos = [*program.detect.demos, dspy.Example(
        summary=annotation.summary, sentence=annotation.sentences[0], verdict="no confusion", questions=[],
        error_types=[])]
    lm = ScriptedLM(scripted_judge)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(DemosInSample) as caught:
        calibrate("coherence", program, lm, human_dir=human, books=1)
    assert str(caught.value).startswith("coherence calibration: 1 of the 2 summaries of the sample is a demo")

    fables = shared_dir / "data" / "fables" / "FABLES.json"
    summaries, _ = verification_sample(fables, books=1)
    program = load_judge_for_calibration("verification")
    program.verify.demos = [*program.verify.demos, verification_demo(summaries[0].claims[0])]
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(DemosInSample) as caught:
        calibrate("verification", program, lm, fables_path=fables, books=1)
    assert "1 of the " in str(caught.value) and "\n" not in str(caught.value)
    assert not lm.backend.calls  # refused before any LM call


def load_judge_for_calibration(judge):
    from booklens.judges import load_judge

    # one try: a re-ask of a scripted answer gets the same answer
    return load_judge(judge, concurrency=1, tries=1) if judge == "coherence" else load_judge(judge)


def test_the_hint_for_an_artifact_without_calibration_names_its_path(tmp_path):
    """The calibrate command the warning gives must find the artifact from where the user is."""
    import shutil

    from booklens.judges import default_path, judge_info, load_judge

    artifact = tmp_path / "artifacts" / "my coherence.json"
    artifact.parent.mkdir()
    shutil.copy(default_path("coherence"), artifact)
    info = judge_info("coherence", load_judge("coherence", program=artifact), "openai/some-model", store={})
    assert info.program == str(artifact)
    assert info.warning.endswith(f"(booklens calibrate --lm openai/some-model --program '{artifact}')")


def test_a_judge_without_calibration_says_so():
    from booklens.judges import judge_info, judge_line, load_judge

    info = judge_info("coherence", load_judge("coherence", zero_shot=True), "openai/some-model", store={})
    assert info.calibration is None and info.demos == 0 and info.program == "zero-shot"
    assert "never measured" in info.warning and "booklens calibrate --lm openai/some-model" in info.warning
    line = judge_line(info)
    assert line.startswith("judge: zero-shot coherence program (per-sentence, 0 demos") and "\nwarning: " in line


def test_the_shipped_calibration_of_the_embedded_model_matches_the_default_programs():
    from booklens.judges import DEFAULTS_DIR, judge_info, load_judge, read_store
    from booklens.lm import LOCAL_LM, LOCAL_MODEL_NAME

    store = read_store(DEFAULTS_DIR / "calibration.json")
    for judge in ("coherence", "verification"):
        info = judge_info(judge, load_judge(judge), f"{LOCAL_LM}/{LOCAL_MODEL_NAME}", store=store)
        assert info.calibration is not None, judge
        assert info.calibration["figures"] and info.calibration["n"]


def test_a_summary_too_long_for_the_window_is_judged_with_fewer_demos():
    from booklens.judges import load_judge

    scorer = load_judge("coherence", concurrency=1)
    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    long_summary = " ".join([sentence] * 150)  # about 2,700 tokens: no room for every demo in 8,192
    _, lm = run_with(clean, lambda: scorer(summary=long_summary, sentences=[sentence]))
    shown = lm.backend.calls[0].messages
    assert len(shown) == 1 + 2 * 16 + 1  # one demo summary's turns dropped, the other kept
    result, lm = run_with(clean, lambda: scorer(summary="Anna walks.", sentences=["Anna walks."]))
    assert len(lm.backend.calls[0].messages) == 1 + 2 * len(scorer.detect.demos) + 1
    assert result.demos_shown == len(scorer.detect.demos) and result.demos_dropped == 0


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_summary_too_long_for_the_window_even_without_demos_is_refused_before_any_call(batch_size):
    """With no demo left it still did not fit: `score` judged the summaries before it, then the first
    call of this one failed. The refusal comes first and names the summary and the window."""
    from booklens.steps import score_summaries

    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    summaries = {"short": "Anna walks. Zed waits.", "long": " ".join([sentence] * 500)}  # about 9,000 tokens
    lm = ScriptedLM(clean)
    with dspy.context(lm=lm):
        with pytest.raises(BooklensError) as excinfo:
            score_summaries(summaries, batch_size=batch_size, concurrency=1)
    assert lm.backend.calls == []
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("the summary 'long' (") and "8,192-token" in message, message
    assert "even with none of the judge's demos" in message
    # a summary that fits once demos are left out is still judged
    with dspy.context(lm=lm):
        score_summaries({"long": " ".join([sentence] * 150)}, batch_size=batch_size, concurrency=1)
    assert lm.backend.calls


def test_building_the_default_judges_into_a_file_is_a_one_line_error(tmp_path):
    from booklens.errors import BooklensError
    from booklens.judges import build_defaults

    target = tmp_path / "book.txt"
    target.write_text("mine", encoding="utf-8")
    with pytest.raises(BooklensError, match="book.txt is a file: the default judges are written to a folder"):
        build_defaults(tmp_path / "no-annotations", tmp_path / "no-fables.json", target)
    assert target.read_text(encoding="utf-8") == "mine"


def test_the_judge_object_names_its_server_without_user_or_password(tmp_path):
    # The judge object goes into every record and its warning is printed: a password in the
    # --api-base URL must reach neither, as it reaches no other record or error line.
    from booklens.judges import judge_info, judge_line, load_judge
    from booklens.lm import make_lm
    from booklens.lm.base import lm_server

    secret_url, public = "http://user:sekrit@127.0.0.1:9/v1", "http://127.0.0.1:9/v1"
    program = load_judge("coherence")
    lm = make_lm("openai/some-model", api_base=secret_url, cache_dir=tmp_path)
    for info in (judge_info("coherence", program, lm, store={}),
                 judge_info("coherence", program, "openai/some-model", server=secret_url, store={})):
        assert info.api_base == public
        assert "sekrit" not in info.model_dump_json() and "sekrit" not in judge_line(info)
    # calibrate keys and records its entry by the same public URL, so the lookup above finds it
    assert lm_server(lm) == public


def test_a_default_demo_of_a_repeated_sentence_shows_what_score_asks(tmp_path):
    """`judges build` labels sentences of whole human-annotated summaries as demos: a copy of a
    sentence the summary says twice is shown as `score` asks it, its occurrence named, not as the
    plain sentence both copies would share."""
    from booklens.judges import build_coherence_default
    from booklens.programs.coherence import build_scorer

    for kind in ("inc", "hier"):
        data = {}
        for b in range(10):
            opening = f"Mara bakes bread in the town of Dunmore {b} ({kind})."
            odd = [f"A stranger named Zed{b}{k} appears at the bakery." for k in range(4)]
            summary = " ".join([opening, odd[0], "Tom sells the bread.", odd[1], odd[2], "The town grows.",
                                odd[3], opening])
            data[f"book-{b}.epub"] = {"summary": summary, "relations": [],
                                      "singles": [{"span": s, "questions": "Who is this?",
                                                   "labels": ["entity omission"]} for s in odd]}
        (tmp_path / f"summary-gpt4-4096-{kind}.json").write_text(json.dumps(data))
    program, _ = build_coherence_default(tmp_path)
    demos = program.detect.demos
    assert sum("judge occurrence 2." in d["sentence"] for d in demos) == 2  # one copy in each demo summary
    for summary in {d["summary"] for d in demos}:
        _, lm = run_with(clean, lambda: build_scorer(batch_size=1, concurrency=1)(summary=summary))
        asked = [c.inputs["sentence"] for c in lm.backend.calls]
        assert [d["sentence"] for d in demos if d["summary"] == summary] == asked  # every sentence, in order


def test_a_smaller_calibration_does_not_hide_the_larger_one_booklens_ships(tmp_path):
    """The user's store wins over the shipped one at lookup: a quick calibration of the default judge
    stored in an empty user store hid the shipped larger one of the same judge, LM and program."""
    from booklens.judges import (CALIBRATION_FILE, DEFAULTS_DIR, load_store, read_store, store_calibration,
                                 user_store_path)

    shipped = read_store(DEFAULTS_DIR / CALIBRATION_FILE)
    key, large = next((k, e) for k, e in shipped.items() if e.get("judge") == "coherence")
    small = {**large, "n": {**large["n"], "sentences": 40, "compared": 40, "failed": 0}}
    store = user_store_path(tmp_path)
    kept = store_calibration(small, store)
    assert kept == (f"its 40 sentences are fewer than the {large['n']['sentences']} of the calibration booklens "
                    f"ships ({DEFAULTS_DIR / CALIBRATION_FILE}) for this judge and LM, which it would hide (give "
                    "replace=True to store it instead)")  # store_calibration's keyword; `calibrate` names --replace
    assert not store.exists() and load_store(tmp_path)[key] == large
    # declined for a store in a folder not made yet, it leaves no folder behind (it had left one with its lock file)
    assert store_calibration(small, tmp_path / "results" / "calibration.json") == kept
    assert not (tmp_path / "results").exists()
    # one the size of the shipped one or larger is stored, as --replace stores a smaller one
    assert store_calibration({**large, "usage": {"calls": 1}}, store) is None
    assert store_calibration(small, store, replace=True) is None
    assert load_store(tmp_path)[key] == small


def long_human_fixture(folder: Path) -> Path:
    """Five annotated summaries (split with seed 0: test = gamma, epsilon); gamma's is too long for an
    8,192-token window even with none of the judge's demos."""
    filler = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    data = {}
    for name in ("alpha", "beta", "gamma", "delta", "epsilon"):
        s = [f"Mara walks to the {name} shore.", f"Zed waves from the {name} boat."]
        s += [filler] * (500 if name == "gamma" else 1)
        data[name] = {"summary": " ".join(s), "relations": [], "singles": [
            {"id": "1", "span": s[1], "questions": "Who is Zed?", "labels": ["entity omission"]}]}
    folder.mkdir()
    (folder / "summary-gpt4-4096-inc.json").write_text(json.dumps(data))
    return folder


def test_calibration_refuses_a_summary_too_long_for_the_window_before_any_call(tmp_path):
    """`score` refuses a summary that fits the window with no demo at all before its first call;
    `calibrate` judged the sample's summaries before it, then failed at its first call."""
    from booklens.calibration import calibrate, check_sample
    from booklens.judges import load_judge

    human = long_human_fixture(tmp_path / "human")
    program = load_judge("coherence", concurrency=1)
    expected = "the summary 'gamma' of summary-gpt4-4096-inc.json ("
    lm = ScriptedLM(clean)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        with pytest.raises(BooklensError) as excinfo:
            calibrate("coherence", program, lm, human_dir=human)
    assert lm.backend.calls == []
    message = str(excinfo.value)
    assert message.startswith(expected) and "8,192-token context window even with none of the judge's demos" \
        in message and "\n" not in message, message
    # the check made before any LM is set up says the same where the window is known, nothing where it is not
    with pytest.raises(BooklensError) as excinfo:
        check_sample("coherence", program, human_dir=human, window=8192)
    assert str(excinfo.value) == message
    check_sample("coherence", program, human_dir=human)


@pytest.mark.parametrize("new_folder", [False, True])
def test_two_calibrations_stored_at_once_both_stay(tmp_path, monkeypatch, new_folder):
    """Two `calibrate` commands ending at once on one store: each read the store, added its entry and
    wrote the file, so the one that wrote second dropped the other's entry. The second now waits for
    the first to finish writing (here a thread whose store call starts while the first holds the
    store between reading and writing) and then adds its entry to what is there. A store in a folder
    not made yet (`calibrate -o results/calibrations.json`) was written without the lock."""
    import threading

    import booklens.judges as judges

    shipped = judges.read_store(judges.DEFAULTS_DIR / judges.CALIBRATION_FILE)
    base = next(e for e in shipped.values() if e.get("judge") == "coherence")
    first, second = ({**base, "key": f"coherence|{name}|fingerprint"} for name in ("lm-a", "lm-b"))
    store = tmp_path / "results" / judges.CALIBRATION_FILE if new_folder else judges.user_store_path(tmp_path)
    read = judges.read_store
    other = threading.Thread(target=judges.store_calibration, args=(second, store))

    def read_then_let_the_other_in(path):
        entries = read(path)
        if path == store and not other.is_alive() and other.ident is None:
            other.start()
            other.join(timeout=3)  # without the store's lock it reads, writes and ends meanwhile
        return entries

    monkeypatch.setattr(judges, "read_store", read_then_let_the_other_in)
    assert judges.store_calibration(first, store) is None
    other.join()
    assert sorted(read(store)) == [first["key"], second["key"]]


def test_a_judge_a_hair_below_a_reference_is_never_shown_at_the_reference():
    """An unfaithful F1 of 36/139 (0.25899...) is below FABLES' 0.259 but reads 0.2590 at four
    decimals: the warning showed "F1 0.2590, where FABLES' GPT-4-Turbo rater reaches 0.2590"."""
    from booklens.judges import judge_warning
    from booklens.records import JudgeInfo

    verifier = JudgeInfo(task="verification", mode="four-way", program="default", program_sha256="0" * 64, demos=6,
                         lm="openai/x", calibration={"sample_name": "S", "counts": {"unfaithful": 20},
                                                     "table5": {"n": 139, "f1_unfaithful": 36 / 139},
                                                     "figures": {}})
    assert judge_warning(verifier).endswith(
        "unfaithful F1 0.25899 on the 139 claims humans labelled faithful or unfaithful, where FABLES' "
        "GPT-4-Turbo rater reaches 0.25900")


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("length, window", [(1, 1024), (80, 2048)])
def test_a_summary_refused_for_the_window_is_told_the_window_that_judges_it(batch_size, length, window):
    """The refusal named no size, and told to shorten even a two-sentence summary that no summary
    could replace: the judge's instructions and answer alone fill a 1,024-token window. It names the
    smallest window that takes the summary with no demo, and that window judges it."""
    import re

    from booklens.steps import score_summaries

    sentence = "Anna walks along the quay of the old harbour town and counts the boats that came in."
    summary = " ".join(["Zed waits."] + [sentence] * length)
    with dspy.context(lm=ScriptedLM(clean, context_window=window)):
        with pytest.raises(BooklensError) as excinfo:
            score_summaries({"s": summary}, batch_size=batch_size, concurrency=1)
    message = str(excinfo.value)
    named = re.search(r"a window of ([\d,]+) tokens or more", message)
    assert named, message
    assert ("shorten it" in message) == (length > 1), message
    needed = int(named.group(1).replace(",", ""))
    with dspy.context(lm=ScriptedLM(clean, context_window=needed - 1)):
        with pytest.raises(BooklensError):
            score_summaries({"s": summary}, batch_size=batch_size, concurrency=1)
    lm = ScriptedLM(clean, context_window=needed)
    with dspy.context(lm=lm):
        score_summaries({"s": summary}, batch_size=batch_size, concurrency=1)
    if batch_size == 1:
        assert len(lm.backend.calls) == length + 1
    else:  # `clean` answers as for one sentence: each batch is asked again, and no answer is taken
        assert lm.backend.calls
