"""An answer the provider's content filter stopped (`finish_reason: content_filter`, as OpenAI and
Azure report it) is no finished answer: it is asked again, and a summary that every try lost to
the filter is a one-line error naming the filter (a compression or cleanup keeps its input and its
node says why), never a fragment passed off as the summary."""

from __future__ import annotations

from typing import Literal

import dspy
import pytest

import booklens  # noqa: F401 - offline settings before dspy imports litellm
from booklens.errors import BooklensError
from booklens.lm import BooklensAdapter, BooklensLM, LiteLLMBackend, predict_with_retries
from booklens.programs.base import Predict
from booklens.programs.summarizer import HierarchicalSummarizer, IncrementalSummarizer
from booklens.testing import FakeOpenAIServer, Reply

WHOLE = "The keeper gave away the fuel. The lamp went dark. Years later the truth came out."
FRAGMENT = "The keeper gave away the fuel. The lamp went da"
STORY = " ".join(["The keeper of the lighthouse gave the last of the lamp oil to a ship in need."] * 6)


def no_sleep(seconds: float) -> None:
    pass


def lm_for(server) -> BooklensLM:
    return BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url, sleep=no_sleep))


def filtered(body) -> Reply:
    return Reply(content=FRAGMENT, finish_reason="content_filter")


def test_a_filtered_summary_is_asked_again_and_the_finished_one_kept():
    answers = iter([filtered, lambda body: WHOLE])
    with FakeOpenAIServer(responder=lambda body: next(answers)(body)) as server:
        program = HierarchicalSummarizer(chunk_size=256, context_window=4096, max_summary_tokens=200)
        with dspy.context(lm=lm_for(server), adapter=BooklensAdapter()):
            result = program(book=STORY)
    assert result.summary == WHOLE
    assert [n.attempts for n in result.nodes] == [2] and len(server.received) == 2


def test_a_summary_the_filter_stopped_in_every_try_is_one_line_naming_the_filter():
    with FakeOpenAIServer(responder=filtered) as server:
        program = HierarchicalSummarizer(chunk_size=256, context_window=4096, max_summary_tokens=200)
        with dspy.context(lm=lm_for(server), adapter=BooklensAdapter()):
            with pytest.raises(BooklensError) as caught:
                program(book=STORY)
    message = str(caught.value)
    assert "\n" not in message and "content filter stopped every answer" in message, message
    assert FRAGMENT not in message and len(server.received) == 3


def test_an_empty_answer_the_filter_stopped_is_named_too():
    with FakeOpenAIServer(responder=lambda body: Reply(content="", finish_reason="content_filter")) as server:
        program = HierarchicalSummarizer(chunk_size=256, context_window=4096, max_summary_tokens=200)
        with dspy.context(lm=lm_for(server), adapter=BooklensAdapter()):
            with pytest.raises(BooklensError, match="content filter stopped every answer"):
                program(book=STORY)


def test_a_filtered_cleanup_keeps_the_summary_and_its_node_says_why():
    from booklens.reports import _node_summary

    def respond(body):
        last = str(body["messages"][-1]["content"])
        return filtered(body) if "[[ ## summary ## ]]" in last and "excerpt" not in last else WHOLE

    with FakeOpenAIServer(responder=respond) as server:
        program = HierarchicalSummarizer(chunk_size=256, context_window=4096, max_summary_tokens=200,
                                         remove_artifacts=True)
        with dspy.context(lm=lm_for(server), adapter=BooklensAdapter()):
            result = program(book=STORY)
    assert result.summary == WHOLE
    clean = result.nodes[-1]
    assert clean.kind == "clean" and clean.fallback and clean.filtered and clean.text == WHOLE
    assert "content filter" in _node_summary(clean)


class Classify(dspy.Signature):
    """Classify the text."""

    text: str = dspy.InputField()
    label: Literal["good", "bad"] = dspy.OutputField()


def test_a_structured_answer_the_filter_stopped_fails_naming_the_filter():
    reply = lambda body: Reply(content='{"label": "go', finish_reason="content_filter")  # noqa: E731
    with FakeOpenAIServer(responder=reply) as server:
        with dspy.context(lm=lm_for(server), adapter=BooklensAdapter()):
            result = predict_with_retries(Predict(Classify), config={"max_tokens": 16}, text="x")
    assert not result.ok and "stopped by the provider's content filter" in result.error
    # more room would bring the filter back: no larger budget
    assert [r.body["max_tokens"] for r in server.received] == [16, 16, 16]


def test_a_list_of_claims_the_filter_stopped_is_not_taken_for_the_whole_list():
    """A list of claims the filter stopped lacks the claims after where it stopped: verified as if whole,
    the summary's unverified part would go uncounted."""
    from booklens.programs.faithfulness import ClaimDecomposer
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: {"claims": ["The keeper gave away the fuel."]})
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = ClaimDecomposer()(summary=WHOLE)
    assert result.claims == [] and "the list of claims was stopped by the provider's content filter" in result.error
    lm.backend.finish_reason = "stop"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        assert ClaimDecomposer()(summary=WHOLE).claims == ["The keeper gave away the fuel."]


def test_a_verdict_the_filter_stopped_is_asked_again_then_fails_naming_the_filter():
    """A verdict the filter stopped may have lost its reason and passage lists (or had its label
    withheld): it is no finished verdict, so it is not kept, as a list of claims is not."""
    from booklens.programs.faithfulness import build_verifier
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: {"label": "faithful", "supporting_passages": [1], "refuting_passages": [],
                                  "reason": "The first passage says so."})
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        pred = build_verifier()(claim="The keeper gave away the fuel.", passages=["He gave it away."])
    assert pred.label is None and "stopped by the provider's content filter" in pred.error
    assert pred.attempts == 3 and len(lm.backend.calls) == 3
    lm.backend.finish_reason = "stop"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        pred = build_verifier()(claim="The keeper gave away the fuel.", passages=["He gave it away."])
    assert pred.label == "faithful" and not pred.truncated and pred.supporting == [1]


def test_a_diverse_summary_the_filter_stopped_is_asked_again_then_fails_naming_the_filter():
    """DiverseSumm keeps a summary the token cap cut (flagged cut_off); one the filter stopped may
    lack most of what it would have said, so it is re-asked, then recorded as failed."""
    from booklens.programs.diverse import DiverseSummarizer
    from booklens.testing import ScriptedLM

    articles = ["[a1] First\nThe storm closed the port on Monday.", "[a2] Second\nThe port stayed open."]
    lm = ScriptedLM(lambda call: {"summary": "Sources disagree on whether"})
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        pred = DiverseSummarizer("direct")(articles=articles)
    assert pred.summary is None and not pred.cut_off
    assert "stopped by the provider's content filter" in pred.error and len(lm.backend.calls) == 3


def test_generated_questions_the_filter_stopped_are_asked_again_then_fail_naming_the_filter():
    """A list of questions the filter stopped may have lost its last questions, as a list of claims may."""
    from booklens.programs.diverse import ReferenceBuilder
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: {"questions": ["Was the port closed?"]})
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        ref = ReferenceBuilder(num_questions=3)(articles=[("a1", "The port closed."), ("a2", "The port stayed open.")])
    assert ref.questions == [] and "stopped by the provider's content filter" in ref.error
    assert len(lm.backend.calls) == 3


ZED = {"verdict": "confusion", "questions": ["Who is Zed?"], "error_types": ["entity omission"]}
ARTICLE = "[a1] Port\n" + " ".join(f"Ship {n} left the port on Monday." for n in range(1, 7))


def _coherence(batch_size):
    from booklens.programs.coherence import build_scorer

    def run():
        result = build_scorer(batch_size=batch_size)(summary="Zed came.", sentences=["Zed came."])
        return result.annotations[0].confusing, result.annotations[0].error
    return run


def _qa_letter():
    from booklens.programs.qa import BookQA

    pred = BookQA("mc", "none")(book="", question="Who sailed?", options="A. Anna\nB. Ben")
    return pred.answer, pred.error


def _qa_verdict():
    from booklens.programs.qa import AnswerJudge

    pred = AnswerJudge()(question="How many?", correct_answer="3", student_answer="three")
    return pred.correct, pred.error


def _diverse_picks():
    from booklens.programs.diverse import DiverseSummarizer

    picked, error, _ = DiverseSummarizer("extract", num_sentences=2).pick_sentences(ARTICLE)
    return picked or None, error


def _diverse_rating():
    from booklens.programs.diverse import RatingJudge
    from booklens.signatures.diverse import JudgeCoverageOfAllQAs

    r = RatingJudge(JudgeCoverageOfAllQAs, "likert")(summary="s", questions_and_answers="q")
    return r.rating, r.error


def _qa_evidence_scores():
    from booklens.programs.qa import EvidenceJudge

    r = EvidenceJudge()(question="Who?", correct_answer="Ben", correct_evidence=["Ben sailed."], student_answer="Ben",
                        student_evidence=["Ben sailed home."])
    return r.mean, r.error


def _diverse_pairwise():
    from booklens.programs.diverse import PairwiseJudge

    verdict, _, error = PairwiseJudge("coverage").one_order("the article", "first", "second")
    return verdict, error


def _reference_answers():
    from booklens.programs.diverse import ReferenceBuilder

    failed: dict = {}
    found = ReferenceBuilder().extract_all([("a1", "The port closed.")], ["Was the port closed?"], failed)
    return found["Was the port closed?"] or None, (failed.get("Was the port closed?") or [None])[0]


def _reference_groups():
    from booklens.programs.diverse import ReferenceBuilder

    got = ReferenceBuilder().cluster("Was the port closed?", [("a1", "yes"), ("a2", "no")])
    return (None if got["error"] else got["groups"]), got["error"]


def _reference_screen():
    from booklens.programs.diverse import ReferenceBuilder

    got = ReferenceBuilder().screen(["The port closed."], "Was the port closed?", [("a1", "yes"), ("a2", "no")])
    return (None if got["error"] else got["diverse"]), got["error"]


@pytest.mark.parametrize("answer, run, finished", [
    (ZED, _coherence(1), True),
    ({"answers": [{"number": 1, **ZED}]}, _coherence(3), True),
    ({"answer": "B"}, _qa_letter, "B"),
    ({"reason": "Three is 3.", "verdict": "correct"}, _qa_verdict, True),
    ({"picks": [1, 2]}, _diverse_picks, ["Ship 1 left the port on Monday.", "Ship 2 left the port on Monday."]),
    ({"explanation": "Most answers are there.", "rating": 7}, _diverse_rating, 7),
    ({"correctness": 90, "relevance": 80, "sufficiency": 70}, _qa_evidence_scores, 80.0),
    ({"explanation": "A covers more.", "verdict": "A"}, _diverse_pairwise, "A"),
    ({"answers": ["yes"]}, _reference_answers, [("a1", "yes")]),
    ({"groups": [[1], [2]]}, _reference_groups, [[0], [1]]),
    ({"invalid": [], "diverse": [1, 2]}, _reference_screen, [0, 1]),
], ids=["coherence", "coherence-batched", "qa-letter", "qa-gen-verdict", "diverse-picks", "diverse-rating",
        "qa-evidence-scores", "diverse-pairwise", "reference-answers", "reference-groups", "reference-screen"])
def test_a_judgment_the_filter_stopped_is_asked_again_then_fails_naming_the_filter(answer, run, finished):
    """A verdict, letter, pick or rating that parses though the filter stopped it may have lost its
    reason, questions or further items, or been withheld: no finished judgment, as a claim's verdict is not."""
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: answer)
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        value, error = run()
    assert value is None and "stopped by the provider's content filter" in error and len(lm.backend.calls) == 3
    lm.backend.finish_reason = "stop"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        assert run() == (finished, None)


def test_a_batched_reply_the_filter_left_unparseable_names_the_filter():
    """Per-sentence answers say so through the retries; a batch's unparseable reply said only 'unparseable'."""
    from booklens.programs.coherence import build_scorer
    from booklens.testing import ScriptedLM

    lm = ScriptedLM(lambda call: "I can")
    lm.backend.finish_reason = "content_filter"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = build_scorer(batch_size=3)(summary="Zed came.", sentences=["Zed came."])
    failed = result.annotations[0]
    assert failed.confusing is None and len(lm.backend.calls) == 3
    assert failed.error.startswith("the answer was stopped by the provider's content filter: unparseable answer")
