"""The programs in a library user's own code, on a plain `dspy.LM` (README, "Use it from Python").

A plain DSPy LM sends every keyword it is given on to the server, so booklens's own call options
(`booklens_attempt`, `booklens_plain_output`) must never reach it; a re-ask must still be a fresh
sample (DSPy's `rollout_id`, which DSPy keeps out of the request)."""

from __future__ import annotations

import json

import booklens  # noqa: F401 - offline settings before dspy imports litellm
import dspy

from booklens.testing import FakeOpenAIServer, PipelineResponder, pipeline_step

SUMMARY = ("Mara finds the key under the stairs. Tom hides the letter from Mara. "
           "Mara reads the letter at dawn.")


def _plain_lm(server: FakeOpenAIServer) -> dspy.LM:
    return dspy.LM("openai/fake", api_base=server.url, api_key="not-a-key", cache=False, num_retries=0)


def _booklens_keys(bodies: list[dict]) -> list[str]:
    return sorted({key for body in bodies for key in body if key.startswith("booklens")})


class FirstCoherenceAnswerUnparseable(PipelineResponder):
    """The pipeline's plausible answers, except that the first confusion verdict is not one of the labels."""

    def __init__(self):
        super().__init__()
        self.spoiled = False

    def __call__(self, body):
        if pipeline_step(body) == "coherence" and not self.spoiled:
            self.spoiled = True
            return json.dumps({"verdict": "maybe", "questions": [], "error_types": []})
        return super().__call__(body)


def test_programs_on_a_plain_dspy_lm_send_no_booklens_keys_and_reask_with_a_fresh_sample():
    from booklens.judges import load_judge
    from booklens.programs.faithfulness import ClaimDecomposer
    from booklens.programs.summarizer import make_summarizer

    from booklens.lm import BooklensAdapter

    responder = FirstCoherenceAnswerUnparseable()
    with FakeOpenAIServer(responder=responder) as server:
        # As README shows: booklens's adapter (JSON answers under the output schema, prose as plain text).
        with dspy.context(lm=_plain_lm(server), adapter=BooklensAdapter()):
            scored = load_judge("coherence", concurrency=1)(summary=SUMMARY)  # the shipped few-shot judge
            claims = ClaimDecomposer()(summary=SUMMARY).claims
            book = " ".join(f"Mara walked to the mill on day {n} and met Tom there." for n in range(200))
            summary = make_summarizer("hier", chunk_size=256, context_window=2048, max_summary_tokens=128,
                                      max_regenerations=0, concurrency=1)(book=book)
        bodies = list(server.served)

    steps = [pipeline_step(b) for b in bodies]
    # Three sentences, the first asked twice: the unparseable verdict was re-asked and the re-ask
    # reached the server (a fresh sample, not DSPy's cached first answer).
    assert steps.count("coherence") == 4
    assert [b.get("temperature") for b in bodies if pipeline_step(b) == "coherence"].count(0.7) == 1
    assert len(scored.annotations) == 3 and all(a.status == "ok" for a in scored.annotations)
    assert sum(a.confusing for a in scored.annotations) == 1  # "Tom hides the letter" confuses the responder
    assert claims and steps.count("claims") == 1
    assert summary.summary and steps.count("summarize") >= 2
    assert _booklens_keys(bodies) == []
    assert not any("rollout_id" in body for body in bodies)


def test_a_program_given_its_own_plain_lm_gets_dspys_fresh_sample_not_booklens_keys():
    """With the LM set on the program (`set_lm`) and none configured, a re-ask was marked for a
    booklens LM (`booklens_attempt`, which a plain LM sends on to the server, and OpenAI refuses):
    the mark follows the LM that answers."""
    from typing import Literal

    from booklens.lm import BooklensAdapter, predict_with_retries

    class Classify(dspy.Signature):
        """Label the text."""

        text: str = dspy.InputField()
        label: Literal["good", "bad"] = dspy.OutputField()

    answers = iter(['{"label": "excellent"}', '{"label": "good"}'])
    with FakeOpenAIServer(responder=lambda body: next(answers)) as server:
        predictor = dspy.Predict(Classify)
        predictor.set_lm(_plain_lm(server))
        with dspy.context(adapter=BooklensAdapter()):
            got = predict_with_retries(predictor, text="a fine day")
        bodies = [r.body for r in server.received]
    assert got.ok and got.attempts == 2 and len(bodies) == 2
    assert _booklens_keys(bodies) == [] and bodies[1].get("temperature") == 0.7

