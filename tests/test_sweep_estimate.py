"""`booklens sweep --dry-run`'s estimate (`booklens.sweep.estimate`) on hand-made manifests: no LM
is called and no model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from booklens.sweep.estimate import estimate_sweep
from booklens.sweep.manifest import load_manifest

NOVEL = "pride_and_prejudice"
SUMMARY = "Elizabeth Bennet meets Mr Darcy at a ball. She refuses his first proposal and marries him later."


def book_evidence(context_window: int, judge) -> int:
    """Evidence tokens the verifier reads per claim in the 'book' mode on an LM of this window: what
    the running judge computes (`FaithfulnessChecker.resolved_budget`)."""
    import dspy

    from booklens.pipeline import load_judge_programs
    from booklens.programs.faithfulness import FaithfulnessChecker
    from booklens.testing import ScriptedLM

    programs = load_judge_programs(judge)
    checker = FaithfulnessChecker(programs["decomposition"], programs["verification"], evidence_mode="book")
    with dspy.context(lm=ScriptedLM(lambda call: {}, context_window=context_window)):
        return checker.resolved_budget()


def test_book_evidence_is_sized_by_the_judges_lm_not_the_summarizers(books_dir: Path, tmp_path: Path):
    """The verifier reads as much of the book as the judge LM's window holds (gpt-4o-mini: 128K);
    the estimate sized it from the summarizer's window (8K), about 15x under for Pride and Prejudice."""
    import litellm

    from booklens.text import count_tokens, read_book

    (tmp_path / "given.json").write_text(json.dumps({NOVEL: SUMMARY}), encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(
        f"lm: openai/fake-model\nbooks: [{books_dir / (NOVEL + '.txt')}]\n"
        "systems:\n"
        "  - {name: hier, method: hier, chunk_size: 2048, context_window: 8192}\n"
        "  - {name: given, summaries: given.json}\n"
        "judge: {steps: [faithfulness], evidence: book, max_claims: 2, lm: openai/gpt-4o-mini}\n",
        encoding="utf-8")
    sweep = load_manifest(manifest)
    window = litellm.get_model_info("openai/gpt-4o-mini")["max_input_tokens"]
    evidence = book_evidence(window, sweep.judge_config())
    book_tokens = count_tokens(read_book(books_dir / f"{NOVEL}.txt"))
    assert window == 128_000 and 100_000 < evidence < book_tokens  # the novel does not fit whole
    estimates = {e.name: e for e in estimate_sweep(sweep)}
    for name, e in estimates.items():
        assert e.judge_lm == "openai/gpt-4o-mini"
        claims = e.judge.calls - 1  # one decomposition call, then one verification per claim (max_claims: 2)
        assert claims == 2, name
        # Every verification prompt holds the evidence, plus its instructions, demos and claim.
        assert claims * evidence <= e.judge.prompt_tokens <= claims * evidence + 10_000, (name, e.judge)


def test_book_evidence_is_no_more_than_the_book(books_dir: Path, tmp_path: Path):
    """A short story fits a large window whole: the verifier reads the story, not the window's budget."""
    from booklens.text import count_tokens, read_book

    story = "the_cask_of_amontillado"
    (tmp_path / "given.json").write_text(json.dumps({story: "Montresor walls Fortunato up in the vaults."}),
                                         encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(
        f"books: [{books_dir / (story + '.txt')}]\nsystems: [{{name: given, summaries: given.json}}]\n"
        "judge: {steps: [faithfulness], evidence: book, max_claims: 1, lm: openai/gpt-4o-mini}\n", encoding="utf-8")
    sweep = load_manifest(manifest)
    book_tokens = count_tokens(read_book(books_dir / f"{story}.txt"))
    assert book_tokens < 5_000 < book_evidence(128_000, sweep.judge_config())
    (e,) = estimate_sweep(sweep)
    assert e.judge.calls == 2
    # (the verifier's instructions and demos are about 1,900 tokens; a default window's budget, 5,548, is more
    # than the story holds)
    assert book_tokens <= e.judge.prompt_tokens <= book_tokens + 2_500, e.judge


# Four sentences of about 25 tokens (100 in all): shorter than one chunk of `hier`, two chunks of
# `inc`, and shorter than either summary budget.
SHORT_BOOK = ("On the first morning Mara climbed the old stone tower, trimmed the lamp wick, and wrote the weather "
              "in her small blue log. On the second morning Mara climbed the old stone tower, cleaned the salt from "
              "the glass, and fed the two gray cats. On the third morning a storm came in from the west, and Mara "
              "kept the light burning through the whole long night. On the fourth morning a fishing boat came "
              "safely into the harbor, and its captain thanked Mara with a basket of bread.")


class EchoingSummaries:
    """A scripted model whose summaries are their whole input (a summary is never longer than what it
    summarizes); the judge's answers are `PipelineResponder`'s."""

    def __init__(self):
        from booklens.testing import PipelineResponder

        self.judge = PipelineResponder()

    def __call__(self, body):
        from booklens.testing import parse_fields, pipeline_step

        last = str(body["messages"][-1]["content"])
        fields = parse_fields(last)
        if pipeline_step(body) == "summarize":
            return " ".join(fields[k] for k in ("running_summary", "summaries", "summary", "excerpt") if k in fields)
        return self.judge(body)


def test_the_estimate_of_a_short_book_is_the_calls_its_run_makes(tmp_path: Path):
    """A book shorter than a chunk, or than the summary budget: the estimate took every summary at its
    full budget (so 12 sentences, each a coherence call and a claim to verify, instead of the book's
    4) and a compression after every update of `inc` (the run compresses only a summary over its
    budget). Now a summary is no longer than what it summarizes, and the estimate is the run's calls."""
    from booklens.sweep.run import run_sweep
    from booklens.testing import FakeOpenAIServer

    (tmp_path / "short.txt").write_text(SHORT_BOOK, encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(
        "books: [short.txt]\n"
        "systems:\n"
        "  - {name: hier, method: hier, chunk_size: 512, max_summary_tokens: 300}\n"
        "  - {name: inc, method: inc, chunk_size: 64, max_summary_tokens: 300}\n"
        "judge: {steps: [coherence, faithfulness], evidence: bm25, k: 2}\n", encoding="utf-8")
    estimates = {e.name: e for e in estimate_sweep(load_manifest(manifest, lm="openai/fake-model"))}
    with FakeOpenAIServer(responder=EchoingSummaries()) as server:
        outcome = run_sweep(manifest, tmp_path / "out", lm="openai/fake-model", api_base=server.url,
                            cache_dir=tmp_path / "cache", progress_interval=60)
    assert [o.status for o in outcome.outcomes] == ["complete", "complete"], [o.error for o in outcome.outcomes]
    for name in ("hier", "inc"):
        cell = json.loads((tmp_path / "out" / "cells" / name / "short" / "run.json").read_text())
        assert cell["scores"]["sentences"] == 4 and cell["scores"]["claims"] == 4
        assert estimates[name].calls == cell["totals"]["calls"], (name, estimates[name])


def budget_filling(call) -> dict:
    """A scripted model that writes what the estimate assumes: every summary exactly as many tokens as
    its word limit states (the words-per-token ratio is 1 below), or as the excerpt it summarizes when
    that is shorter. One sentence of one-token words, so a same-level context cut to its cap keeps
    exactly the cap."""
    from booklens.text import count_tokens

    tokens = int(call.inputs["word_limit"])
    if "excerpt" in call.inputs:
        tokens = min(tokens, count_tokens(call.inputs["excerpt"]))
    return {"summary": "The" + " the" * (tokens - 1)}


# Windows small beside Poirot Investigates (74K tokens) for trees of three and four levels, with the
# default level budgets and given ones, and a short story of one merge.
HIER_PLANS = [
    ("poirot_investigates", dict(chunk_size=64, context_window=1024, max_summary_tokens=150)),
    ("poirot_investigates", dict(chunk_size=100, context_window=1024, max_summary_tokens=120)),
    ("poirot_investigates", dict(chunk_size=64, context_window=1200, level_budgets=[60, 100, 170])),
    ("poirot_investigates", dict(chunk_size=128, context_window=1500, level_budgets=[90, 200])),
    ("the_cask_of_amontillado", dict(chunk_size=256, context_window=1024, max_summary_tokens=80)),
]


@pytest.mark.parametrize("merge_context", ["same-level", "lower-level", "none"])
@pytest.mark.parametrize("book, config", HIER_PLANS)
def test_the_hierarchical_estimate_plans_the_calls_a_run_makes(books_dir: Path, book, config, merge_context):
    """With every summary as long as the estimate assumes, the estimate's calls are the run's: as many
    at each level, each merging the same summaries with the same context at the same budget, writing
    as many tokens, and the book's summary as long."""
    from collections import Counter

    import dspy

    from booklens.lm import BooklensAdapter
    from booklens.programs.summarizer import HierarchicalSummarizer
    from booklens.sweep.estimate import _Overheads, summary_work
    from booklens.testing import ScriptedLM
    from booklens.text import chunk_text, count_tokens, read_book

    def shape(node):
        return node.id, node.level, node.kind, node.children, node.context, node.budget, node.tokens

    text = read_book(books_dir / f"{book}.txt")
    program = HierarchicalSummarizer(merge_context=merge_context, words_per_token=1.0, **config)
    lm = ScriptedLM(budget_filling)
    chunks = chunk_text(text, program.chunk_size)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        work, final = summary_work(program, chunks, _Overheads())
        planned, root = program.plan(chunks)
        result = program(book=text)
    assert all(n.attempts == 1 and not n.over_budget for n in result.nodes)  # no regeneration: the plan held
    assert work.calls == len(planned) == len(lm.backend.calls) == len(result.nodes)
    assert Counter(c.summary.level for c in planned) == Counter(n.level for n in result.nodes)
    assert sorted(shape(c.summary) for c in planned) == sorted(shape(n) for n in result.nodes)
    assert work.completion_tokens == sum(n.tokens for n in result.nodes)
    assert final == root.tokens == result.nodes[-1].tokens
    # In the order of the run's calls (one at a time), each call as the run's prompt has it: its word
    # limit, the summaries it merges (each begins with the one capital "The") and its context.
    for plan, call in zip(planned, lm.backend.calls):
        assert int(call.inputs["word_limit"]) == plan.summary.budget
        if plan.summary.kind == "chunk":
            assert "excerpt" in call.inputs
            continue
        assert call.inputs["summaries"].count("The") == len(plan.summary.children)
        assert plan.context_tokens == (count_tokens(call.inputs["context"]) if "context" in call.inputs else None)


def test_a_dry_run_reads_each_book_once_besides_the_estimate(tmp_path: Path, monkeypatch):
    """The manifest reads every book to refuse one under two keys; what it found (the text's digest,
    or why it cannot be read) serves the dry run's warnings and the check of the steps on disk, which
    read each book again. Only the estimate, which counts the text's tokens, reads it once more."""
    from collections import Counter

    import booklens.text
    from booklens.sweep.run import dry_run

    (tmp_path / "alpha.txt").write_text("Alpha went to sea. He came back.\n", encoding="utf-8")
    (tmp_path / "beta.txt").write_text("Beta stayed home. She read.\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"alpha": "A sails.", "beta": "B reads.", "empty": "E."}),
                                         encoding="utf-8")
    (tmp_path / "m.yaml").write_text("books: ['*.txt']\nsystems:\n  - {name: hier, chunk_size: 512}\n"
                                     "  - {name: given, summaries: given.json}\n", encoding="utf-8")
    # a cell with a run record on disk: its steps are checked for reuse against the book's digest
    (tmp_path / "out" / "cells" / "given" / "alpha").mkdir(parents=True)
    (tmp_path / "out" / "cells" / "given" / "alpha" / "run.json").write_text("{}", encoding="utf-8")
    (tmp_path / "out" / "sweep.json").write_text("{}", encoding="utf-8")
    reads: Counter = Counter()
    read_book = booklens.text.read_book

    def counting(path, *args, **kwargs):
        reads[Path(path).stem] += 1
        return read_book(path, *args, **kwargs)

    monkeypatch.setattr(booklens.text, "read_book", counting)
    text = dry_run(tmp_path / "m.yaml", tmp_path / "out", lm="openai/gpt-4o-mini")
    assert "warning: book 'empty' cannot be read" in text and "its 2 cells will fail" in text
    # the empty book: read by the manifest only (the estimate skips a book the manifest could not read)
    assert reads == {"alpha": 2, "beta": 2, "empty": 1}, reads


def test_a_listed_model_at_a_server_of_ones_own_is_estimated_at_no_list_price(books_dir: Path, tmp_path: Path):
    """A run prices `openai/gpt-4o-mini` served at an --api-base (vLLM under that name) as unknown;
    the dry run's estimate priced the same calls at OpenAI's list price."""
    story = "the_cask_of_amontillado"
    (tmp_path / "given.json").write_text(json.dumps({story: "Montresor walls Fortunato up in the vaults."}),
                                         encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    judge = "judge: {steps: [faithfulness], evidence: bm25, max_claims: 1, lm: openai/gpt-4o-mini%s}\n"
    body = f"books: [{books_dir / (story + '.txt')}]\nsystems: [{{name: given, summaries: given.json}}]\n"
    manifest.write_text(body + judge % "", encoding="utf-8")
    listed = estimate_sweep(load_manifest(manifest))[0]
    assert listed.judge.calls == 2 and listed.cost_usd is not None and listed.cost_usd > 0
    manifest.write_text(body + judge % ", api_base: 'http://127.0.0.1:8000/v1'", encoding="utf-8")
    served = estimate_sweep(load_manifest(manifest))[0]
    assert served.judge.calls == 2 and served.cost_usd is None
    # the command's --api-base is the default server of every step too
    manifest.write_text(body + judge % "", encoding="utf-8")
    assert estimate_sweep(load_manifest(manifest, api_base="http://127.0.0.1:8000/v1"))[0].cost_usd is None


def test_book_evidence_is_sized_by_the_window_the_judges_server_states(tmp_path: Path):
    """llama.cpp started with `-c 2048` says so in /props: the verifier's evidence is what 2048 tokens
    hold, as if the manifest set the judge's window, not what the 8192 of an unknown window hold."""
    from booklens.testing import FakeOpenAIServer, free_port

    (tmp_path / "long.txt").write_text("The long voyage went on. " * 2000, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"long": "It goes on."}), encoding="utf-8")
    text = ("books: [long.txt]\nsystems: [{name: given, summaries: given.json}]\n"
            "judge: {steps: [faithfulness], evidence: book, max_claims: 1%s}\n")
    (tmp_path / "server.yaml").write_text(text % "", encoding="utf-8")
    (tmp_path / "set.yaml").write_text(text % ", context_window: 2048", encoding="utf-8")
    down = f"http://127.0.0.1:{free_port()}/v1"

    def prompt_tokens(manifest: str, server: str) -> int:
        (e,) = estimate_sweep(load_manifest(tmp_path / manifest, lm="openai/fake", api_base=server))
        return e.judge.prompt_tokens

    with FakeOpenAIServer(pages={"/props": {"default_generation_settings": {"n_ctx": 2048}}}) as server:
        stated = prompt_tokens("server.yaml", server.url)
    assert server.received == [] and server.fetched == ["/v1/models", "/props"]
    assert stated == prompt_tokens("set.yaml", down)
    unknown = prompt_tokens("server.yaml", down)  # no server up: the window is unknown
    judge = load_manifest(tmp_path / "server.yaml").judge_config()
    assert unknown - stated == book_evidence(8192, judge) - book_evidence(2048, judge) > 0


def test_the_estimate_shows_the_verifier_the_demos_its_window_holds_beside_each_books_evidence(books_dir: Path):
    """At 2048 tokens beside two 256-token passages the verifier is shown 4 of its 6 demos, as the
    cell's run decides; the estimate counted all 6 in every verification prompt."""
    import dspy

    from booklens.lm import BooklensAdapter
    from booklens.pipeline import JudgeConfig, load_judge_programs
    from booklens.programs.base import prompt_tokens
    from booklens.programs.faithfulness import fit_demos_to_evidence
    from booklens.sweep.estimate import _Overheads, judge_work
    from booklens.text import read_book

    judge = JudgeConfig(steps=["faithfulness"], evidence="bm25", k=2, passage_tokens=256, max_claims=3)
    novel = read_book(books_dir / f"{NOVEL}.txt")
    with dspy.context(adapter=BooklensAdapter()):
        programs = load_judge_programs(judge)
        fit = fit_demos_to_evidence(programs["verification"], 2048, mode="bm25", k=2, passage_tokens=256,
                                    book_text=novel)
        assert fit.shown == 4 and len(programs["verification"].verify.demos) == 6
        every = prompt_tokens(programs["verification"].verify, evidence="", claim="")
        shown = prompt_tokens(fit.verifier.verify, evidence="", claim="")
        args = (judge, 60, 3, 170_000, 2048, _Overheads(), programs)
        all_demos, fitted = judge_work(*args), judge_work(*args, book_text=novel)
        # a book shorter than the passages asked for leaves room for every demo
        story = "Mara kept the light through the storm. The ship came in at dawn."
        short = (judge, 60, 3, 15, 2048, _Overheads(), programs)
        assert fit_demos_to_evidence(programs["verification"], 2048, mode="bm25", k=2, passage_tokens=256,
                                     book_text=story).shown is None
        assert judge_work(*short, book_text=story) == judge_work(*short)
    assert fitted.calls == all_demos.calls == 4  # one decomposition, three claims
    assert all_demos.prompt_tokens - fitted.prompt_tokens == 3 * (every - shown) > 0
