"""The programs in a library user's own code, on a plain `dspy.LM` (README, "Use it from Python").

A plain DSPy LM sends every keyword it is given on to the server, so booklens's own call options
(`booklens_attempt`, `booklens_plain_output`) must never reach it; a re-ask must still be a fresh
sample (DSPy's `rollout_id`, which DSPy keeps out of the request)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import booklens  # noqa: F401 - offline settings before dspy imports litellm
import dspy

from booklens.testing import FakeOpenAIServer, PipelineResponder, pipeline_step

README = Path(__file__).resolve().parents[1] / "README.md"

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



def _steps_on_a_plain_lm(tmp_path, **adapter) -> list[str]:
    """The steps (`booklens.steps`) on a plain `dspy.LM`, under `adapter` when given, else under none
    configured: the step of each request the server was sent."""
    from booklens.steps import decompose_summary, score_summaries, summarize_book, verify_claims

    tmp_path.mkdir()
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"Mara walked to the mill on day {n} and met Tom there." for n in range(200)))
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        with dspy.context(lm=_plain_lm(server), adapter=adapter.get("adapter")):  # None: as if none were set
            summary = summarize_book(book, chunk_size=256, context_window=2048, max_summary_tokens=128,
                                     max_regenerations=0, concurrency=1)
            claims = decompose_summary(SUMMARY)
            scored = score_summaries({"story": SUMMARY}, concurrency=1)
            report = verify_claims(claims=claims.claims, book_text=None, mode="none", concurrency=1)
        bodies = list(server.served)
    assert summary.summary and len(claims.claims) == 3
    assert all(s.status == "ok" for s in scored["story"].sentences) and len(report.claims) == 3
    return [pipeline_step(b) for b in bodies]


def test_the_steps_ask_in_booklens_format_when_no_adapter_is_configured(tmp_path):
    """Under DSPy's default adapter a model answering in JSON had each call made twice (the chat
    format's parse fails, then DSPy asks again for JSON). With no adapter configured the steps use
    booklens's for their calls, one per item, as the commands make them; an adapter the caller
    configured is theirs to keep, and the global settings are left as they were."""
    from booklens.lm import BooklensAdapter

    configured = dspy.settings.adapter
    steps = _steps_on_a_plain_lm(tmp_path / "none")
    assert dspy.settings.adapter is configured
    assert steps.count("claims") == 1 and steps.count("coherence") == 3 and steps.count("verify") == 3
    # the same calls as under booklens's adapter set by hand, the summary's included
    assert steps == _steps_on_a_plain_lm(tmp_path / "booklens", adapter=BooklensAdapter())
    # a configured adapter is used as it is: DSPy's chat format, its JSON fallback making each call twice
    chat = _steps_on_a_plain_lm(tmp_path / "chat", adapter=dspy.ChatAdapter())
    assert chat.count("claims") == 2 and chat.count("coherence") == 6


def _readme_python_example() -> str:
    """The code block of README's "Use it from Python"."""
    section = README.read_text(encoding="utf-8").split("\n## Use it from Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "README's Python section holds one code block"
    return blocks[0]


class RefusesOneBook(PipelineResponder):
    """The pipeline's plausible answers, except that every summary request of one book is refused
    (HTTP 400): that book's sweep cells fail at their summary step, the others complete."""

    def __call__(self, body):
        if pipeline_step(body) == "summarize" and "Zebedee" in str(body["messages"][-1]["content"]):
            return 400, "this book is refused"
        return super().__call__(body)


def test_readmes_python_example_runs_as_written_against_a_loopback_server(tmp_path, monkeypatch, capsys):
    """README's Python example, run as it stands but for two things: the model answers from a
    loopback server (its URL given to the `dspy.LM`, which keeps nothing in DSPy's disk cache, and
    to booklens's LMs as `BOOKLENS_API_BASE`), and the run's evidence is bm25 (hybrid loads a
    sentence-embedding model, seconds of work, for the same code path). Every name it imports and
    every attribute it reads must exist, every call reaches the server, and the sweep has a failed
    cell, so that the line printing `done.failed` reads its cells' fields too."""
    from booklens.testing import run_command

    code = _readme_python_example()
    adapted = code.replace('dspy.LM("openai/gpt-4o-mini")',
                           'dspy.LM("openai/gpt-4o-mini", api_base=API_BASE, cache=False)')
    adapted = adapted.replace('evidence="hybrid"', 'evidence="bm25"')
    assert adapted.count("api_base=API_BASE") == 1 and adapted.count('evidence="bm25"') == 1

    monkeypatch.chdir(tmp_path)
    (tmp_path / "summary.txt").write_text(SUMMARY)
    (tmp_path / "book.txt").write_text((README.parent / "examples" / "sample_story.txt").read_text(encoding="utf-8"))
    (tmp_path / "other.txt").write_text("Zebedee Quill rows across the bay at night. " * 20)
    (tmp_path / "corpus.yaml").write_text(
        "books: [book.txt, other.txt]\n"
        "systems:\n"
        "  - {name: hier-512, method: hier, chunk_size: 512, context_window: 2048, max_summary_tokens: 200}\n"
        "  - {name: inc-512, method: inc, chunk_size: 512, context_window: 2048, max_summary_tokens: 200}\n"
        "judge: {steps: [coherence, faithfulness], evidence: bm25, max_claims: 8}\n")
    monkeypatch.setenv("OPENAI_API_KEY", "not-a-key")
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))
    saved = {"lm": dspy.settings.lm, "adapter": dspy.settings.adapter}
    with FakeOpenAIServer(responder=RefusesOneBook()) as server:
        monkeypatch.setenv("BOOKLENS_API_BASE", server.url)
        names = {"API_BASE": server.url}
        try:
            exec(compile(adapted, "README.md (Use it from Python)", "exec"), names)
            steps = [pipeline_step(body) for body in server.served]
            refused = [r for r in server.received if r.body not in server.served]
            printed = capsys.readouterr().out
            # run again, the run directory and the sweep resume: only the plain dspy.LM's four calls
            # (it keeps no cache here) and the failed cells' summary requests are made again
            exec(compile(adapted, "README.md (Use it from Python)", "exec"), {"API_BASE": server.url})
        finally:
            dspy.configure(**saved)
        again = [pipeline_step(body) for body in server.served[len(steps):]]
        refused_again = [r for r in server.received if r.body not in server.served][len(refused):]
    capsys.readouterr()
    lines = printed.splitlines()

    # "Tom hides the letter" is the one sentence the responder finds confusing, and the one claim it
    # calls unfaithful
    assert names["scored"].score == 2 / 3
    assert [a.sentence for a in names["scored"].annotations if a.confusing] == ["Tom hides the letter from Mara."]
    assert lines[1] == repr(["Mara finds the key under the stairs.", "Tom hides the letter from Mara.",
                             "Mara reads the letter at dawn."])
    assert names["run"].failures == {}
    assert sorted(p.name for p in (tmp_path / "runs" / "book").iterdir()) == [
        "claims.json", "coherence.json", "faithfulness.json", "report.html", "run.json", "summary.json",
        "timings.json"]
    # the sweep: 2 systems x 2 books, the other book's two cells failed at their summary
    sweep = tmp_path / "sweeps" / "big"
    assert {"results.json", "cells.jsonl", "report.html"} <= {p.name for p in sweep.iterdir()}
    assert len((sweep / "cells.jsonl").read_text().splitlines()) == 4
    assert len(names["done"].results["pairs"]) == 1
    reason = f"summary: 'openai/gpt-4o-mini' at {server.url} rejected the request: this book is refused"
    failed = [("hier-512", "other", reason), ("inc-512", "other", reason)]
    assert [line for line in lines if line.endswith(repr(failed))] == [
        f"{names['done'].results['pairs']!r} {failed!r}"]
    assert len(refused) >= 1 and all(pipeline_step(r.body) == "summarize" for r in refused)
    # the example's own decomposer, the run's and the sweep's two complete cells'; 3 + 3 sentences for
    # the judge called directly and the run's, 3 for each complete cell, and a claim for each sentence
    # but the example's own; the rest are the summaries of the run and the two complete cells
    assert steps.count("claims") == 1 + 1 + 2 and steps.count("coherence") == 3 + 3 + 2 * 3
    assert steps.count("verify") == 3 + 2 * 3 and steps.count("summarize") == 19 and len(steps) == 44
    # the last print is what `booklens report sweeps/big --table latex` prints, to the byte
    table = run_command(["report", "sweeps/big", "--table", "latex"])
    assert table.returncode == 0 and table.stdout.count("\\begin{tabular}") == 2  # the systems and the pair
    assert printed.endswith("\n" + table.stdout)
    assert sorted(again) == ["claims", "coherence", "coherence", "coherence"]
    assert refused_again and all(pipeline_step(r.body) == "summarize" for r in refused_again)
