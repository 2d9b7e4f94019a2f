"""Hierarchical merging with a scripted LM: the pipelined merge tree (merges start before their
level ends, same output as level by level), the merge contexts, and the word-per-token ratio;
incremental updating keeps the newest chunk when an update runs long."""

from __future__ import annotations

import threading
import zlib

import dspy
import pytest

from booklens.lm import BooklensAdapter
from booklens.programs.summarizer import HierarchicalSummarizer, IncrementalSummarizer
from booklens.testing import ScriptedLM
from booklens.text import count_tokens

SENTENCE = "Mara crossed the moor and found the lamp dark again. "


def synthetic_book(target_tokens: int) -> str:
    sentences = []
    for i in range(target_tokens // 22 + 1):
        sentences.append(f"On day {i}, Mara walked to the harbour and spoke with keeper number {i % 97} "
                         "about the storm. ")
        if i % 40 == 39:
            sentences.append("\n\n")
    return "".join(sentences)


def answer_for(call) -> dict:
    """A summary whose length depends only on the prompt's inputs, so groups are uneven but the
    same whatever order the calls run in."""
    material = "".join(str(call.inputs.get(k, "")) for k in ("excerpt", "summaries", "context"))
    digest = zlib.crc32(material.encode())
    words = int(call.inputs["word_limit"]) * (40 + digest % 50) // 100  # 40-90% of the limit
    return {"summary": f"Summary {digest}. " + (SENTENCE * max(1, words // 10)).strip()}


def is_merge(call) -> bool:
    return "summaries" in call.inputs


BOOK = synthetic_book(60_000)


def summarize(responder, **config):
    lm = ScriptedLM(responder)
    program = HierarchicalSummarizer(chunk_size=1024, context_window=4096, max_summary_tokens=500, **config)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=BOOK)
    return result, lm


def shape(result) -> list[tuple]:
    return [(n.id, n.level, n.kind, n.text, tuple(n.children), n.context) for n in result.nodes]


@pytest.mark.parametrize("merge_context", ["same-level", "lower-level"])
def test_a_merge_starts_before_its_level_ends_and_the_output_is_the_level_by_level_one(merge_context):
    level_by_level, barrier_lm = summarize(answer_for, merge_context=merge_context, pipelined=False, concurrency=4,
                                           level_budgets=[500])
    level1 = [n for n in level_by_level.nodes if n.level == 1]
    assert len(level1) >= 12 and max(n.level for n in level_by_level.nodes) >= 3
    last_excerpt_start = BOOK[level_by_level.chunks[level1[-1].chunks[0]].start:][:60].strip()

    # Level by level: every merge call comes after the last level-1 call.
    kinds = ["merge" if is_merge(c) else "chunk" for c in barrier_lm.backend.calls]
    assert kinds.index("merge") == len(level1)

    # Pipelined: the last level-1 call waits until a merge call has arrived. The merge can only
    # arrive if merges start while their level is unfinished.
    merge_arrived = threading.Event()
    waited_for_merge: list[bool] = []

    def responder(call):
        if is_merge(call):
            merge_arrived.set()
        elif call.inputs["excerpt"].startswith(last_excerpt_start):
            waited_for_merge.append(merge_arrived.wait(timeout=120))
        return answer_for(call)

    pipelined, pipelined_lm = summarize(responder, merge_context=merge_context, concurrency=4, level_budgets=[500])
    assert waited_for_merge == [True]
    assert shape(pipelined) == shape(level_by_level)
    assert pipelined.summary == level_by_level.summary
    assert len(pipelined_lm.backend.calls) == len(barrier_lm.backend.calls) == len(level_by_level.nodes)


def test_one_call_at_a_time_runs_a_merge_as_soon_as_its_group_is_decided():
    result, lm = summarize(answer_for, merge_context="lower-level", concurrency=1, level_budgets=[500])
    nodes = {n.id: n for n in result.nodes}
    first_merge = next(n for n in result.nodes if n.level == 2)
    level1 = [n for n in result.nodes if n.level == 1]
    decided_by = int(first_merge.children[-1].split(".")[1]) + 1  # the summary that did not fit
    kinds = ["merge" if is_merge(c) else "chunk" for c in lm.backend.calls]
    # The calls run L1.0 .. L1.<decided_by>, then the merge, then the rest of level 1.
    assert kinds[: decided_by + 2] == ["chunk"] * (decided_by + 1) + ["merge"]
    assert kinds.count("chunk") == len(level1)
    assert lm.backend.calls[decided_by + 1].inputs["summaries"].count("Summary ") == len(first_merge.children)
    assert nodes[first_merge.id].children == [n.id for n in level1[: len(first_merge.children)]]


def test_same_level_context_is_the_previous_merge_of_the_level():
    result, lm = summarize(answer_for, level_budgets=[500])  # the default is the paper's context
    by_id = {n.id: n for n in result.nodes}
    context_calls = [c for c in lm.backend.calls if "context" in c.inputs]
    assert context_calls
    for level in sorted({n.level for n in result.nodes if n.level > 1}):
        level_nodes = [n for n in result.nodes if n.level == level]
        for k, node in enumerate(level_nodes):
            if k == 0:
                assert node.context is None and not node.used_context
            else:
                assert node.context == level_nodes[k - 1].id
    # The prompt carried that summary's text.
    for node in result.nodes:
        if node.context:
            call = next(c for c in context_calls if c.inputs["summaries"].count("Summary ") == len(node.children)
                        and by_id[node.children[0]].text.split(".")[0] in c.inputs["summaries"])
            assert call.inputs["context"] == by_id[node.context].text


def test_no_merge_context():
    result, lm = summarize(answer_for, merge_context="none", concurrency=3)
    assert not any("context" in c.inputs for c in lm.backend.calls)
    assert not any(n.used_context for n in result.nodes)


def test_word_limit_follows_the_word_per_token_ratio():
    result, lm = summarize(answer_for, level_budgets=[400, 500])
    assert int(lm.backend.calls[0].inputs["word_limit"]) == int(400 * 0.65)  # the published code's ratio
    merge = next(c for c in lm.backend.calls if is_merge(c))
    assert int(merge.inputs["word_limit"]) == int(500 * 0.65)
    result, lm = summarize(answer_for, level_budgets=[400, 500], words_per_token=0.75)
    assert int(lm.backend.calls[0].inputs["word_limit"]) == int(400 * 0.75)


def test_level_budgets_shrink_below_the_top_as_in_the_published_code():
    result, lm = summarize(answer_for)
    budgets = result.level_budgets
    depth = len(budgets)
    assert depth >= 3 and budgets == [int(500 * 0.65 ** (depth - level)) for level in range(1, depth + 1)]
    # The estimate assumes summaries as long as their budgets; shorter ones may need fewer levels,
    # and the merge that writes the book's summary gets G_n wherever it is.
    assert 2 <= max(n.level for n in result.nodes) <= depth
    for node in result.nodes:
        assert node.budget == (500 if node is result.nodes[-1] else budgets[node.level - 1])
        assert node.tokens <= node.budget
    # Level 1 holds as many chunks as fit beside a G_1 summary: more than beside G_n.
    program = HierarchicalSummarizer(chunk_size=1024, context_window=4096, max_summary_tokens=500)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        assert program.room_for_chunks(budgets[0]) > program.room_for_chunks(500)
        level1 = [n for n in result.nodes if n.level == 1]
        assert all(sum(result.chunks[i].tokens for i in n.chunks) <= program.room_for_chunks(budgets[0])
                   for n in level1)
        fixed, _ = summarize(answer_for, level_budgets=[500])
    assert len([n for n in fixed.nodes if n.level == 1]) > len(level1)


def test_a_long_update_is_compressed_whole_so_the_newest_chunk_survives():
    book = synthetic_book(6_000)
    g = 300

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": (SENTENCE * 10).strip() + " " + call.inputs["summary"].split(" ")[-1]}
        if "running_summary" in call.inputs:
            # Far over 1.5 G_n on every try; the newest chunk's events come last.
            return {"summary": (SENTENCE * 80).strip() + " Then the NEWEST-EVENT happened."}
        return {"summary": (SENTENCE * 10).strip()}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    updates = [n for n in result.nodes if n.kind == "update"]
    assert updates and all(n.over_budget and not n.truncated for n in updates)
    assert all(n.text.endswith("NEWEST-EVENT happened.") for n in updates)
    compress_calls = [c for c in lm.backend.calls if "condensed" in c.output_fields]
    assert len(compress_calls) == len(updates)
    assert all("NEWEST-EVENT" in c.inputs["summary"] for c in compress_calls)
    assert count_tokens(result.summary) <= g and result.summary.endswith("happened.")


@pytest.mark.parametrize("book_tokens, calls", [(1_500, 1), (2_800, 3)])
def test_a_book_that_fits_one_level_1_call_gets_the_last_level_budget_for_its_summary(book_tokens, calls):
    """With given level budgets, the call that writes the book's summary gets the last one (as the record's
    max_summary_tokens says), however few levels the book needs: a book that fits one level-1 call beside
    G_1 got G_1. One that fits beside G_1 but not beside G_n is summarized in two level-1 calls at G_1 and
    merged at G_n."""
    from booklens.text import chunk_text

    book = synthetic_book(book_tokens)
    lm = ScriptedLM(answer_for)
    program = HierarchicalSummarizer(chunk_size=1024, context_window=4096, level_budgets=[100, 800],
                                     max_summary_tokens=800)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        tokens = sum(c.tokens for c in chunk_text(book, 1024))
        assert tokens <= program.room_for_chunks(100)  # one level-1 call beside G_1 ...
        assert (tokens <= program.room_for_chunks(800)) == (calls == 1)  # ... and beside G_n, or not
        result = program(book=book)
    assert len(lm.backend.calls) == calls
    assert result.nodes[-1].budget == 800 and int(lm.backend.calls[-1].inputs["word_limit"]) == int(800 * 0.65)
    assert all(n.budget == 100 for n in result.nodes if n.level == 1 and n is not result.nodes[-1])


def test_the_sweep_estimate_gives_the_books_summary_the_last_level_budget_as_the_summarizer_does():
    from booklens.sweep.estimate import _Overheads, summary_work
    from booklens.text import chunk_text

    lm = ScriptedLM(answer_for)
    program = HierarchicalSummarizer(chunk_size=1024, context_window=4096, level_budgets=[100, 200, 600],
                                     max_summary_tokens=600)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        _, final = summary_work(program, chunk_text(synthetic_book(6_000), 1024), _Overheads())
        result = program(book=synthetic_book(6_000))
    assert max(n.level for n in result.nodes) == 2 and result.nodes[-1].budget == 600
    assert final == 600


def test_a_book_that_fits_one_level_1_call_beside_g1_but_not_g_n_gets_g_n_with_the_default_budgets():
    """With the published code's level budgets too, the book's summary gets G_n: a book that fit one
    level-1 call beside G_1 = 0.65 G_n (and not beside G_n) was summarized in that one call at G_1,
    while a shorter book got G_n and so did a longer one. It is now summarized in level-1 calls that a
    merge at G_n joins."""
    from booklens.text import chunk_text

    book = synthetic_book(2_500)
    lm = ScriptedLM(answer_for)
    program = HierarchicalSummarizer(chunk_size=1024, context_window=4096, max_summary_tokens=900)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        tokens = sum(c.tokens for c in chunk_text(book, 1024))
        assert program.room_for_chunks(900) < tokens <= program.room_for_chunks(int(900 * 0.65))
        result = program(book=book)
    root = result.nodes[-1]
    assert root.budget == 900 and root.kind == "merge" and int(lm.backend.calls[-1].inputs["word_limit"]) == 585
    level1 = [n for n in result.nodes if n.level == 1]
    assert len(level1) == 2 and all(n.budget == 585 for n in level1)
    assert all(sum(result.chunks[i].tokens for i in n.chunks) <= program.room_for_chunks(585) for n in level1)


def test_a_book_of_one_chunk_too_long_to_sit_beside_g_n_gets_all_the_room_the_window_leaves():
    """With given level budgets, a book of one chunk that fits beside G_1 but not beside G_n cannot
    be split for a merge to write its summary at G_n: it is summarized in one call, which got G_1
    (100 tokens where G_n is 800). It gets the most of G_n the window leaves beside the chunk."""
    from booklens.text import chunk_text

    book = synthetic_book(2_700)
    lm = ScriptedLM(answer_for)
    program = HierarchicalSummarizer(chunk_size=3000, context_window=4096, level_budgets=[100, 800],
                                     max_summary_tokens=800)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        (chunk,) = chunk_text(book, 3000)
        assert program.room_for_chunks(800) < chunk.tokens <= program.room_for_chunks(100)
        room = program.room_for_chunks(0) - chunk.tokens  # the largest budget beside the chunk
        result = program(book=book)
    assert 100 < room < 800
    (node,) = result.nodes
    assert len(lm.backend.calls) == 1 and node.budget == room
    assert int(lm.backend.calls[0].inputs["word_limit"]) == int(room * 0.65)
    assert sum(count_tokens(m["content"]) + 4 for m in lm.backend.calls[0].messages) + room <= program.usable_window
