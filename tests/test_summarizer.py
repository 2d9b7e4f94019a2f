"""Summarizer program logic with a scripted LM: the hierarchical call tree and incremental compression."""

from __future__ import annotations

import dspy
import pytest

from booklens.errors import BooklensError, command_line
from booklens.lm import BooklensAdapter
from booklens.programs.summarizer import (
    HierarchicalSummarizer,
    IncrementalSummarizer,
    group_by_budget,
)
from booklens.testing import ScriptedLM
from booklens.text import chunk_text, count_tokens

FILLER = "Mara crossed the moor and found the lamp dark again. "


def synthetic_book(target_tokens: int) -> str:
    sentences = []
    i = 0
    total = 0
    while total < target_tokens:
        s = f"On day {i}, Mara walked to the harbour and spoke with keeper number {i % 97} about the storm. "
        sentences.append(s)
        total += 22
        i += 1
        if i % 40 == 0:
            sentences.append("\n\n")
    return "".join(sentences)


def summary_of(words: int) -> str:
    n = max(1, words // 10)
    return (FILLER * n).strip()


def responder_for(budget_words: int):
    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": summary_of(int(call.inputs["word_limit"]) // 2)}
        return {"summary": summary_of(int(budget_words * 0.8))}

    return respond


@pytest.fixture(scope="module")
def big_book() -> str:
    book = synthetic_book(170_000)
    assert 165_000 < count_tokens(book) < 180_000
    return book


def test_hierarchical_call_tree_for_a_170k_token_book(big_book):
    lm = ScriptedLM(responder_for(400))
    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=900,
                                     merge_context="lower-level", level_budgets=[900])
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        room_chunks, room_merge, room_context = program.check_budgets()
        result = program(book=big_book)
    chunks = result.chunks
    assert len(chunks) == len(chunk_text(big_book, 2048)) >= 83
    nodes = {n.id: n for n in result.nodes}

    # Level 1: consecutive chunks grouped greedily under W - G_1 - prompt.
    level1 = [n for n in result.nodes if n.level == 1]
    expected_groups = group_by_budget([c.tokens for c in chunks], room_chunks)
    assert [n.chunks for n in level1] == expected_groups
    assert all(sum(chunks[i].tokens for i in n.chunks) <= room_chunks for n in level1)
    assert len(expected_groups) < len(chunks)  # several chunks per call

    # Higher levels: consecutive children from the level below; later merges carry context.
    levels = sorted({n.level for n in result.nodes})
    assert levels[0] == 1 and len(levels) >= 3
    previous = level1
    for level in levels[1:]:
        merges = [n for n in result.nodes if n.level == level]
        assert merges, f"level {level} has no merge"
        order = [n.id for n in previous]
        for k, node in enumerate(merges):
            positions = [order.index(c) for c in node.children]
            assert positions == list(range(positions[0], positions[0] + len(positions)))
            assert len(node.children) >= 2
            assert sum(nodes[c].tokens for c in node.children) <= (room_context if node.used_context else room_merge)
            if k > 0:
                assert node.used_context, "merges after the first of a level use the preceding summary as context"
                assert node.context == order[positions[0] - 1]
        carried = [n for n in previous if not any(n.id in m.children for m in merges)]
        previous = merges + carried
        previous.sort(key=lambda n: n.chunks[0])
    root = result.nodes[-1]
    assert root.chunks == list(range(len(chunks)))
    assert result.summary == root.text

    # The prompts: every context merge received the summary just before its first input.
    context_calls = [c for c in lm.backend.calls if "context" in c.inputs]
    assert len(context_calls) == sum(1 for n in result.nodes if n.used_context) > 0
    assert len(lm.backend.calls) == len(result.nodes)


def test_regenerates_a_summary_over_budget_then_keeps_it_within_budget():
    book = synthetic_book(3_000)

    def respond(call):
        long = call.attempt < 100  # the first answer is far too long
        return {"summary": summary_of(2000 if long else 50)}

    lm = ScriptedLM(respond)
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    (node,) = result.nodes
    assert node.attempts == 2 and not node.over_budget
    assert count_tokens(result.summary) <= 200


def test_gives_up_after_bounded_regenerations_and_trims_to_budget():
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": summary_of(2000)})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=2)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    (node,) = result.nodes
    assert len(lm.backend.calls) == 3
    assert node.truncated and not node.over_budget
    assert count_tokens(node.text) <= 200


def test_incremental_updating_compresses_when_over_budget():
    book = synthetic_book(9_000)
    g = 300

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": summary_of(150)}
        if "running_summary" in call.inputs:
            return {"summary": summary_of(330)}  # over G_n = 300 tokens
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    chunks = result.chunks
    kinds = [n.kind for n in result.nodes]
    assert kinds[0] == "chunk"
    assert kinds.count("update") == len(chunks) - 1
    assert kinds.count("compress") == len(chunks) - 1
    compress_calls = [c for c in lm.backend.calls if "condensed" in c.output_fields]
    assert all(int(c.inputs["current_words"]) > int(c.inputs["word_limit"]) for c in compress_calls)
    # Each update reads the compressed summary of the step before.
    update_calls = [c for c in lm.backend.calls if "running_summary" in c.inputs]
    assert update_calls[1].inputs["running_summary"] == summary_of(150)
    assert count_tokens(result.summary) <= g


def test_incremental_keeps_summary_without_compression_when_within_budget():
    book = synthetic_book(6_000)
    lm = ScriptedLM(lambda call: {"summary": summary_of(100)})
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=300)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    assert "compress" not in [n.kind for n in result.nodes]


def test_chunk_size_the_window_cannot_hold_is_an_error():
    lm = ScriptedLM(lambda call: {"summary": "x"})
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        with pytest.raises(BooklensError, match="does not fit"):
            HierarchicalSummarizer(chunk_size=8192, context_window=8192).check_budgets()
        with pytest.raises(BooklensError, match="incremental updating needs"):
            IncrementalSummarizer(chunk_size=6000, context_window=8192).check_budgets()
    assert lm.backend.calls == []



@pytest.mark.parametrize("config, advice", [
    ({"chunk_size": 6000, "context_window": 8192}, "set chunk_size to 4498 or less"),
    # no chunk fits beside the default 900-token summary: the budget at which the smallest chunk fits
    # is bounded by the compression check, so the chunk beside it may be larger than the smallest
    ({"context_window": 2048}, "set max_summary_tokens to 375 or less and chunk_size to 588 or less"),
    ({"chunk_size": 2048, "context_window": 8192, "max_summary_tokens": 2000},
     "set max_summary_tokens to 1767 or less"),
    # a chunk_size of 525 would fit the update, but a 400-token summary's compression would not fit
    ({"chunk_size": 1000, "context_window": 2048, "max_summary_tokens": 400},
     "set max_summary_tokens to 210 or less"),
])
def test_incremental_updating_that_does_not_fit_names_settings_that_do(config, advice):
    """The line names values (not only which settings to lower), and with them both budget checks pass. A
    library call names the keywords; within a command the line names the options."""
    import re

    with dspy.context(adapter=BooklensAdapter()):
        with pytest.raises(BooklensError, match="incremental updating needs") as excinfo:
            IncrementalSummarizer(**config).check_budgets()
        assert str(excinfo.value).endswith(f"; {advice}, or raise context_window")
        advised = {key: int(value) for key, value in re.findall(r"([a-z_]+) to (\d+) or less", advice)}
        IncrementalSummarizer(**{**config, **advised}).check_budgets()
        within_command = command_line.set(True)
        try:
            with pytest.raises(BooklensError) as excinfo:
                IncrementalSummarizer(**config).check_budgets()
        finally:
            command_line.reset(within_command)
        options = re.sub(r"\b([a-z]+_[a-z_]+) to", lambda m: "--" + m.group(1).replace("_", "-") + " to", advice)
        assert str(excinfo.value).endswith(f"; {options}, or raise --context-window")


def test_a_compression_that_does_not_fit_names_a_budget_that_does():
    config = {"chunk_size": 512, "context_window": 2048, "max_summary_tokens": 400}
    with dspy.context(adapter=BooklensAdapter()):
        with pytest.raises(BooklensError) as excinfo:
            IncrementalSummarizer(**config).check_budgets()
        assert str(excinfo.value).startswith("compressing an update needs 1835 tokens per call")
        assert str(excinfo.value).endswith("; set max_summary_tokens to 375 or less, or raise context_window")
        IncrementalSummarizer(**{**config, "max_summary_tokens": 375}).check_budgets()
        with pytest.raises(BooklensError, match="compressing an update needs"):
            IncrementalSummarizer(**{**config, "max_summary_tokens": 376}).check_budgets()


def test_incremental_updating_that_no_settings_fit_says_to_raise_the_window():
    with dspy.context(adapter=BooklensAdapter()), pytest.raises(BooklensError) as excinfo:
        IncrementalSummarizer(context_window=512, generation_allowance=300).check_budgets()
    assert str(excinfo.value).endswith("the usable context window is 435; raise context_window")


def test_artifact_removal_pass_cleans_the_final_summary():
    book = synthetic_book(2_000)

    def respond(call):
        if "cleaned" in call.output_fields:
            return {"cleaned": call.inputs["summary"].replace("In this segment, ", "")}
        return {"summary": "In this segment, Mara finds the lamp dark."}

    lm = ScriptedLM(respond)
    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=200,
                                     remove_artifacts=True)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    assert result.summary == "Mara finds the lamp dark."
    assert result.nodes[-1].kind == "clean"
    assert result.nodes[-1].budget == result.nodes[-2].tokens and not result.nodes[-1].truncated


def summarize_with_cleanup(summary: str, clean) -> dspy.Prediction:
    """A short book summarized as `summary`; the cleanup pass answers `clean(the summary)`."""
    def respond(call):
        if "cleaned" in call.output_fields:
            return {"cleaned": clean(call.inputs["summary"])}
        return {"summary": summary}

    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=200,
                                     remove_artifacts=True, max_regenerations=0)
    with dspy.context(lm=ScriptedLM(respond), adapter=BooklensAdapter()):
        return program(book=synthetic_book(2_000))


def test_a_cleanup_longer_than_the_summary_is_dropped_and_the_summary_kept():
    """Removing phrases never lengthens a summary: a rewrite that runs longer wrote more than it
    removed, and cutting it to the summary's length would drop the summary's end. The summary
    stands as it was, and the clean node says why, with the dropped rewrite's length."""
    summary = "Mara finds the lamp dark. She lights it again."
    longer = " Then the keeper walked home along the shore in the rain."
    result = summarize_with_cleanup(summary, lambda text: text.replace("Mara", "Mara Vell") + longer)
    assert result.summary == summary
    clean = result.nodes[-1]
    assert clean.kind == "clean" and clean.budget == result.nodes[-2].tokens
    assert clean.fallback and clean.text == summary and not clean.truncated and not clean.over_budget
    assert clean.dropped_rewrite_tokens == count_tokens(summary.replace("Mara", "Mara Vell") + longer) > clean.budget
    # a rewrite no longer than the summary is taken
    shorter = summarize_with_cleanup("In this segment, " + summary, lambda text: text.replace("In this segment, ", ""))
    assert shorter.summary == summary and shorter.nodes[-1].dropped_rewrite_tokens is None
    assert not shorter.nodes[-1].fallback


@pytest.mark.parametrize("answer", [
    "The summary contains no artifacts, so nothing needs to change.",  # an answer about the summary
    "Mara finds the lamp dark.",  # the first sentence only: the rest of the story gone
])
def test_a_cleanup_that_drops_most_of_the_summary_is_dropped_and_the_summary_kept(answer):
    """Removing phrases leaves most of a summary's words in place: an answer that keeps under half of
    them replaced the summary instead of cleaning it, and would stand as the book's summary."""
    summary = ("In this segment, Mara finds the lamp dark. She rows to the island through the storm. "
               "The keeper admits he sold the oil. Mara lights the lamp and the ship turns away from the rocks.")
    result = summarize_with_cleanup(summary, lambda text: answer)
    clean = result.nodes[-1]
    assert result.summary == summary
    assert clean.kind == "clean" and clean.fallback and clean.text == summary and not clean.cut_off
    assert clean.dropped_rewrite_tokens == count_tokens(answer) < clean.budget
    # removing the phrase (and a sentence about the text) is a cleanup, and is taken
    kept = summarize_with_cleanup(summary + " The chapter ends the first part of the book.",
                                  lambda text: summary.replace("In this segment, ", ""))
    assert kept.summary == summary.replace("In this segment, ", "") and not kept.nodes[-1].fallback


def test_a_cleanup_of_a_summary_in_chinese_is_taken():
    """Words are counted in any script: a Chinese summary is one unbroken run of characters, so
    counting runs of word characters called any edit of it a loss of all its words."""
    summary = "本章中玛拉发现灯塔的灯熄灭了。本章中她冒着暴风雨划船到岛上。本章中看守人承认他卖掉了灯油。"
    cleaned = summary.replace("本章中", "")  # a phrase inside every run of characters
    result = summarize_with_cleanup(summary, lambda text: cleaned)
    assert result.summary == cleaned and not result.nodes[-1].fallback


def test_an_unfinished_cleanup_is_dropped_even_when_shorter_than_the_summary():
    """A rewrite the cap (or the embedded model's repetition guard) stopped has not reached the
    summary's end: the summary is kept whole."""
    summary = "Mara finds the lamp dark. She lights it again. The ship sees the light."

    def respond(call):
        lm.backend.finish_reason = "length" if "cleaned" in call.output_fields else "stop"
        return {"cleaned": "Mara finds the lamp dark."} if "cleaned" in call.output_fields else {"summary": summary}

    lm = ScriptedLM(respond)
    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=200,
                                     remove_artifacts=True, max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=synthetic_book(2_000))
    clean = result.nodes[-1]
    assert result.summary == summary and clean.fallback and clean.cut_off
    assert clean.dropped_rewrite_tokens == count_tokens("Mara finds the lamp dark.") < clean.budget


def test_an_answer_without_words_is_regenerated():
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": "130" if call.attempt < 100 else "Mara finds the lamp dark."})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=2)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    assert len(lm.backend.calls) == 2
    assert result.summary == "Mara finds the lamp dark."


@pytest.mark.parametrize("config, message", [
    ({"context_window": 0}, "context_window must be at least 512 tokens (got 0)"),
    ({"level_budgets": [0]}, "each of level_budgets must be at least 16 tokens (got 0)"),
    ({"level_budgets": [300, -100]}, "each of level_budgets must be at least 16 tokens (got -100)"),
    ({"chunk_size": 16}, "chunk_size must be at least 64 tokens (got 16)"),
    ({"max_summary_tokens": 8}, "max_summary_tokens must be at least 16 tokens (got 8)"),
])
def test_settings_below_the_commands_least_are_errors(config, message):
    with pytest.raises(BooklensError) as excinfo:
        HierarchicalSummarizer(**config)
    assert str(excinfo.value) == message


def test_the_library_entry_refuses_a_zero_window_instead_of_taking_the_default():
    from booklens.steps import book_summarizer

    with pytest.raises(BooklensError, match="context"):
        book_summarizer(context_window=0)
    assert book_summarizer(context_window=None).context_window == 8192


def test_a_summary_budget_too_big_for_the_window_names_the_option_that_set_it():
    with dspy.context(adapter=BooklensAdapter()):
        for config, option in (({"level_budgets": [5000]}, "each of level_budgets"),
                               ({"max_summary_tokens": 5000}, "max_summary_tokens")):
            with pytest.raises(BooklensError) as excinfo:
                HierarchicalSummarizer(chunk_size=2048, context_window=8192, **config).check_budgets()
            assert str(excinfo.value).endswith(f"with a 5000-token summary and the prompt; set {option} to 2240 or "
                                               "less, or raise context_window")
        with pytest.raises(BooklensError, match="cannot merge two 3000-token summaries; set each of level_budgets to "
                                                "2240 or less, or raise"):
            HierarchicalSummarizer(chunk_size=512, context_window=8192, level_budgets=[300, 3000]).check_budgets()
        within_command = command_line.set(True)  # as `summarize --level-budget 300 --level-budget 3000` says it
        try:
            with pytest.raises(BooklensError, match="cannot merge two 3000-token summaries; set every --level-budget "
                                                    "to 2240 or less, or raise --context-window$"):
                HierarchicalSummarizer(chunk_size=512, context_window=8192, level_budgets=[300, 3000]).check_budgets()
        finally:
            command_line.reset(within_command)


def test_the_final_merge_gets_the_last_level_budget_however_shallow_the_tree():
    """--level-budget 100 200 300 400 on a book whose tree has two levels: the merge that writes the
    book's summary gets 400 (G_n, as the budget check and README say), not level 2's 200; and the
    record's G_n is that budget."""
    from booklens.steps import book_summarizer

    lm = ScriptedLM(responder_for(60))
    program = book_summarizer(method="hier", chunk_size=512, context_window=2048, level_budgets=[100, 200, 300, 400],
                              remove_artifacts=False)
    assert program.max_summary_tokens == 400
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=synthetic_book(4_000))
    root = max(result.nodes, key=lambda n: n.level)
    assert root.level == 2 and root.budget == 400
    assert all(n.budget == 100 for n in result.nodes if n.level == 1)


def test_answers_without_words_and_no_fallback_are_an_error_not_the_summary():
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": "1234"})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(BooklensError) as excinfo:
        program(book=book)
    message = str(excinfo.value)
    # Past --max-regenerations, a summary with no word yet gets tries up to WORDLESS_TRIES.
    assert "no usable summary for level 1 summary 0 in 3 tries" in message and "'1234'" in message
    assert "raise max_regenerations above 2" in message  # the keyword: `summarize` names --max-regenerations
    assert len(lm.backend.calls) == 3


def test_an_answer_without_words_is_asked_again_even_with_no_regenerations():
    """The embedded model trims instead of regenerating (max_regenerations 0); an answer of bare
    numbers still gets a new sample, and an answer with words but cut off does not."""
    book = synthetic_book(3_000)
    answers = iter(["19\n248", summary_of(400)])  # the second runs over the 200-token budget
    lm = ScriptedLM(lambda call: {"summary": next(answers)})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    assert len(lm.backend.calls) == 2, "one new sample for the wordless answer, none for the long one"
    (node,) = result.nodes  # one chunk: its summary is the book's
    assert node.attempts == 2 and node.truncated and node.tokens <= 200


def test_a_compression_without_words_keeps_the_update_as_far_as_the_next_call_has_room():
    """The update stands in for a compression without words: whole, or, where the next update's prompt
    could not hold it, cut to whole sentences within that room (at least G_n); at the last chunk, within
    the room of the artifact-removal prompt."""
    book = synthetic_book(2_000)
    g = 300
    update = summary_of(580)  # over G_n, so it is compressed; longer than the next update has room for

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": "1064\n276"}  # what the embedded model once answered
        if "running_summary" in call.inputs:
            return {"summary": update}
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=512, context_window=2048, max_summary_tokens=g, max_regenerations=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
        room, final_room = program.running_room(), program.final_room()
    assert g < room < count_tokens(update) < final_room
    compressions = [n for n in result.nodes if n.kind == "compress"]
    assert len(compressions) == len(result.chunks) - 1 >= 2
    condensed_calls = [c for c in lm.backend.calls if "condensed" in c.output_fields]
    assert len(condensed_calls) == 2 * len(compressions)  # both tries answered without words
    for node in compressions[:-1]:
        assert node.fallback and node.truncated and node.over_budget
        assert update.startswith(node.text) and g < node.tokens <= room
    last = compressions[-1]
    assert last.fallback and not last.truncated and last.over_budget and last.text == update
    # The next update reads the kept update, not the numbers.
    updates = [c for c in lm.backend.calls if "running_summary" in c.inputs]
    assert updates[-1].inputs["running_summary"] == compressions[-2].text
    assert result.summary == update


def test_artifact_removal_without_words_keeps_the_summary():
    result = summarize_with_cleanup("In this segment, Mara finds the lamp dark.",
                                    lambda summary: "[## summary ## ]\n130")
    assert result.summary == "In this segment, Mara finds the lamp dark."
    clean = result.nodes[-1]
    assert clean.kind == "clean" and clean.fallback and not clean.truncated


def test_an_answer_the_cap_cut_loses_its_unfinished_sentence_instead_of_being_regenerated():
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": "Mara finds the lamp dark. She rows to the island. She climbs the"})
    lm.backend.finish_reason = "length"
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=0, generation_slack=1.0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    (node,) = result.nodes
    assert len(lm.backend.calls) == 1
    assert lm.backend.calls[0].request["max_tokens"] == 200 + 64  # the budget and room for the JSON around it
    assert node.text == "Mara finds the lamp dark. She rows to the island."
    assert node.cut_off and node.truncated and not node.over_budget


def test_the_token_cap_adds_the_generation_allowance():
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": "Mara finds the lamp dark. She rows to the island."})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=0, generation_slack=1.06, generation_allowance=8)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        program(book=book)
    assert [c.request["max_tokens"] for c in lm.backend.calls] == [int(200 * 1.06) + 8]


def test_a_finished_answer_and_a_lone_fragment_are_kept_whole():
    from booklens.programs.summarizer import without_unfinished_sentence

    assert without_unfinished_sentence("She rows. She climbs the hill.") == "She rows. She climbs the hill."
    assert without_unfinished_sentence('She rows. "Stop!"') == 'She rows. "Stop!"'
    assert without_unfinished_sentence("She climbs the") == "She climbs the"


@pytest.mark.parametrize("last", ["\u2018Go home.\u2019", "She waits\u2026", "It is *over.*", "(She rows.)",
                                  "\u201cStop!\u201d"])
def test_a_last_sentence_closed_by_any_quote_or_mark_counts_as_finished(last):
    """Books and models close sentences with curly single quotes, ellipses and markdown emphasis too:
    a finished last sentence the cap happened to stop after must stay."""
    from booklens.programs.summarizer import without_unfinished_sentence

    text = "Mara finds the lamp dark. " + last
    assert without_unfinished_sentence(text) == text


def test_the_embedded_model_asks_for_a_tight_cap_and_no_regenerations():
    from booklens.lm import BooklensLM, LocalBackend
    from booklens.vocabulary import DEFAULT_GENERATION_ALLOWANCE, DEFAULT_GENERATION_SLACK, DEFAULT_MAX_REGENERATIONS
    from booklens.steps import book_summarizer, summary_settings

    with dspy.context(lm=BooklensLM(LocalBackend(), cache=None)):  # the model file is not loaded
        assert summary_settings() == {"max_regenerations": 0, "generation_slack": 1.06, "generation_allowance": 8}
        assert summary_settings(3)["max_regenerations"] == 3
        program = book_summarizer(method="hier")
        assert (program.max_regenerations, program.generation_slack, program.generation_allowance) == (0, 1.06, 8)
        # The budget in SmolLM2's tokens: a 380-token level-1 summary of Pride and Prejudice may
        # write 410 of them, not the 444 of G + 64.
        assert program.token_cap(380) == 410
    with dspy.context(lm=ScriptedLM(lambda call: {"summary": "x"})):
        assert summary_settings() == {"max_regenerations": DEFAULT_MAX_REGENERATIONS,
                                      "generation_slack": DEFAULT_GENERATION_SLACK,
                                      "generation_allowance": DEFAULT_GENERATION_ALLOWANCE}
        assert book_summarizer(method="hier").token_cap(380) == 570 + 64


def _answer_to_the_cap(call):
    """An answer that runs to whatever cap the call sets, as a model ignoring its word limit does."""
    from booklens.text import truncate_to_tokens

    key = call.output_fields[0]
    return {key: truncate_to_tokens(FILLER * 2000, int(call.request["max_tokens"]) - 8)}


@pytest.mark.parametrize("program", [
    # A window the checks accept, whose merges asked for the token cap (1.5 G + 64) on top of a
    # prompt that had left room only for G: 7 tokens over the 512-token window.
    lambda: HierarchicalSummarizer(chunk_size=64, context_window=512, max_summary_tokens=58,
                                   level_budgets=[58, 58], max_regenerations=0),
    # An update's prompt (chunk, running summary) plus its cap (1.5 x 1.5 G + 64).
    lambda: IncrementalSummarizer(chunk_size=2400, context_window=8192, max_summary_tokens=1700,
                                  max_regenerations=0),
], ids=["hier", "inc"])
def test_no_call_asks_for_more_tokens_than_the_window_has_left_after_its_prompt(program):
    """A server refuses a request whose prompt and max_tokens together exceed its window (OpenAI,
    vLLM: 'maximum context length'), so a run the budget checks accepted failed partway."""
    program = program()
    book = synthetic_book(12_000)
    lm = ScriptedLM(_answer_to_the_cap)
    lm.backend.finish_reason = "length"
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        program(book=book)
    sizes = [sum(count_tokens(m["content"]) + 4 for m in c.messages) + c.request["max_tokens"]
             for c in lm.backend.calls]
    assert len(sizes) > 3 and max(sizes) <= program.context_window, max(sizes)
    # Only the cap above the budget is given back: every call may still write its whole budget.
    assert all(c.request["max_tokens"] >= 58 for c in lm.backend.calls)


def test_a_call_with_room_in_the_window_keeps_the_whole_token_cap():
    lm = ScriptedLM(_answer_to_the_cap)
    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        program(book=synthetic_book(3_000))
    assert [c.request["max_tokens"] for c in lm.backend.calls] == [program.token_cap(200)]


@pytest.mark.parametrize("method", ["hier", "inc"])
def test_a_long_blank_in_the_book_costs_no_call(method):
    """A run of whitespace longer than a chunk is cut into pieces with nothing to summarize: no
    call reads one (each would ask the model to summarize nothing)."""
    blank = "\n\n  \t" * 5000  # about one token per character: several chunks' worth
    book = synthetic_book(3_000) + blank + synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": summary_of(100)})
    cls = HierarchicalSummarizer if method == "hier" else IncrementalSummarizer
    # Level-1 groups of one chunk each, so the hierarchy too would read every chunk in a call.
    program = cls(chunk_size=2048, context_window=4096, max_summary_tokens=300)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    excerpts = [c.inputs["excerpt"] for c in lm.backend.calls if "excerpt" in c.inputs]
    assert excerpts and all(any(ch.isalnum() for ch in e) for e in excerpts)
    assert all(any(ch.isalnum() for ch in c.text) for c in result.chunks)


def test_answers_that_cannot_be_read_are_not_called_empty():
    """With an adapter that finds no summary field in the answers (a library user's dspy.ChatAdapter
    here), every try failed to parse, and the error said the model gave "only empty answers": the
    model wrote plenty. The error now says the answers could not be read, and why."""
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: "Here is a long answer about the book, but no summary field in it.")
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=1)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()), pytest.raises(BooklensError) as excinfo:
        program(book=book)
    message = str(excinfo.value)
    assert ("no usable summary for level 1 summary 0 in 3 tries (no answer could be read (unparseable answer: "
            in message)
    assert "empty" not in message


def test_empty_answers_are_still_called_empty():
    lm = ScriptedLM(lambda call: "")
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(BooklensError,
                                                                        match=r"in 3 tries \(only empty answers, "):
        program(book=synthetic_book(3_000))


def test_a_summary_trimmed_to_its_budget_is_not_recorded_over_budget():
    """`over_budget` says the kept text is longer than its budget; trimmed text never is (`truncated`
    says it was cut), as a fallback or a cut-off answer trimmed within the budget already records."""
    book = synthetic_book(3_000)
    lm = ScriptedLM(lambda call: {"summary": summary_of(2000)})
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=1)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    (node,) = result.nodes
    assert node.truncated and node.tokens <= node.budget == 200
    assert not node.over_budget


def newest_event(excerpt: str) -> str:
    """A sentence naming the first day a chunk of `synthetic_book` tells: the chunk's newest event."""
    import re

    day = re.search(r"On day (\d+)", excerpt).group(1)
    return f"Then came the news of day {day}."


def test_a_compression_that_stays_over_budget_keeps_the_newest_chunk():
    """The paper condenses the running summary; it never cuts it. A compression still over G_n after its
    tries is kept whole while the next update has room for it: its end tells the newest chunk, which
    cutting it to its leading sentences dropped (the book's ending, at the last chunk)."""
    book = synthetic_book(9_000)
    g = 300

    def respond(call):
        if "condensed" in call.output_fields:  # condensed in story order, a little over G_n on every try
            return {"condensed": summary_of(300) + " " + call.inputs["summary"].rsplit(". ", 1)[-1]}
        if "running_summary" in call.inputs:  # over G_n, so compressed; the newest chunk comes last
            return {"summary": summary_of(330) + " " + newest_event(call.inputs["excerpt"])}
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    compressions = [n for n in result.nodes if n.kind == "compress"]
    assert len(compressions) == len(result.chunks) - 1 >= 3
    for node, chunk in zip(compressions, result.chunks[1:]):
        assert node.text.endswith(newest_event(chunk.text))
        assert node.over_budget and not node.truncated and node.tokens > g
    updates = [c for c in lm.backend.calls if "running_summary" in c.inputs]
    assert updates[1].inputs["running_summary"] == compressions[0].text
    assert result.summary.endswith(newest_event(result.chunks[-1].text))


def test_a_compression_without_words_keeps_the_whole_update_with_its_newest_chunk():
    book = synthetic_book(6_000)
    g = 300

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": "1064\n276"}
        if "running_summary" in call.inputs:
            return {"summary": summary_of(400) + " " + newest_event(call.inputs["excerpt"])}
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g, max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    compressions = [n for n in result.nodes if n.kind == "compress"]
    assert len(compressions) == len(result.chunks) - 1 >= 2
    for node, chunk in zip(compressions, result.chunks[1:]):
        assert node.fallback and node.over_budget and not node.truncated
        assert node.text.endswith(newest_event(chunk.text))
    assert result.summary.endswith(newest_event(result.chunks[-1].text))


REFUSAL = "I'm sorry, but I can't help with summarizing this text."


def test_a_refused_update_is_asked_again_instead_of_replacing_the_running_summary():
    """A refusal has words but is no summary: taken as the update, it became the story so far and
    every later update built on it."""
    book = synthetic_book(6_000)
    refused = set()

    def respond(call):
        if "running_summary" in call.inputs:
            key = call.inputs["excerpt"][:40]
            if key not in refused:  # each update is refused once, then written
                refused.add(key)
                return {"summary": REFUSAL}
            return {"summary": call.inputs["running_summary"] + " " + newest_event(call.inputs["excerpt"])}
        return {"summary": summary_of(100)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=600)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    updates = [n for n in result.nodes if n.kind == "update"]
    assert len(updates) == len(result.chunks) - 1 >= 2
    assert all(n.attempts == 2 and "sorry" not in n.text for n in updates)
    assert result.summary.startswith(summary_of(100))
    assert all(newest_event(c.text) in result.summary for c in result.chunks[1:])


def test_a_summary_refused_in_every_try_is_a_one_line_error_that_says_so():
    lm = ScriptedLM(lambda call: {"summary": REFUSAL})
    program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=200)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        with pytest.raises(BooklensError, match=r"no usable summary for level 1 summary 0 in 3 tries \(refusals, "
                                                r"such as \"I'm sorry, but I can't help"):
            program(book=synthetic_book(1_000))
    assert len(lm.backend.calls) == 3


@pytest.mark.parametrize("answer", [
    REFUSAL, "I cannot condense this summary further.", "As an AI language model, I cannot summarize copyrighted text.",
    "Unfortunately, I am unable to provide a summary of this excerpt.", "I\u2019m sorry, I can\u2019t assist with that.",
    "I'm sorry, but I won't be able to help with that request.", "Sorry, I can't comply with this request.",
])
def test_refusals(answer):
    from booklens.programs.summarizer import looks_like_refusal

    assert looks_like_refusal(answer)


def test_a_refused_compression_keeps_the_update():
    book = synthetic_book(6_000)
    g = 300
    update = summary_of(330)

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": "I cannot condense this summary further."}
        if "running_summary" in call.inputs:
            return {"summary": update}
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g, max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    compressions = [n for n in result.nodes if n.kind == "compress"]
    assert compressions and all(n.fallback and n.text == update for n in compressions)


@pytest.mark.parametrize("summary", [
    "I'm sorry, Ahab says to the crew, and then he sails on. The whale returns at dawn.",  # dialogue, not a refusal
    "Sorry Hollow is a village where Mara keeps the lamp.",
    "I cannot help thinking of the lamp, Mara writes in her diary. " + "The storm grows. " * 60,  # a long answer
    # a first-person story told in its narrator's voice, as short as a small level-1 budget asks
    "I cannot continue north until the storm passes, so I wait at the harbour with the keeper.",
    "I can't do anything but watch as the lamp goes dark and the ship runs aground.",
    "I cannot write to my sister again; the keeper burns my letters.",
])
def test_a_summary_that_only_starts_like_a_refusal_is_kept(summary):
    """What counts as a refusal says the model will not do the task; a narrator who cannot do
    something is not one."""
    from booklens.programs.summarizer import looks_like_refusal

    assert not looks_like_refusal(summary)


def test_an_update_the_cap_cut_stands_in_for_a_compression_without_its_unfinished_sentence():
    book = synthetic_book(6_000)
    g = 300

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": "1064"}
        if "running_summary" in call.inputs:
            return {"summary": summary_of(400) + " " + newest_event(call.inputs["excerpt"]) + " Then Mara rowed"}
        return {"summary": summary_of(150)}

    lm = ScriptedLM(respond)
    lm.backend.finish_reason = "length"  # every answer stopped at the token cap
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=g, max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    compressions = [n for n in result.nodes if n.kind == "compress"]
    assert compressions and all(n.fallback and n.truncated for n in compressions)
    for node, chunk in zip(compressions, result.chunks[1:]):
        assert node.text.endswith(newest_event(chunk.text))


def test_an_update_the_cap_cut_within_budget_loses_its_unfinished_sentence():
    """An update within G_n is not compressed: it goes on as the running summary (the book's summary
    at the last chunk), so a half sentence the cap (or the repetition guard) left must go, as it
    does from every other summary the cap cut."""
    book = synthetic_book(6_000)

    def respond(call):
        if "running_summary" in call.inputs:
            return {"summary": summary_of(60) + " " + newest_event(call.inputs["excerpt"]) + " Then Mara rowed"}
        return {"summary": summary_of(60)}

    lm = ScriptedLM(respond)
    lm.backend.finish_reason = "length"
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=300, max_regenerations=0)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    updates = [n for n in result.nodes if n.kind == "update"]
    assert len(updates) == len(result.chunks) - 1 >= 2 and "compress" not in [n.kind for n in result.nodes]
    for node, chunk in zip(updates, result.chunks[1:]):
        assert node.cut_off and node.truncated and node.text.endswith(newest_event(chunk.text))
        assert node.tokens == count_tokens(node.text)
    calls = [c for c in lm.backend.calls if "running_summary" in c.inputs]
    assert calls[1].inputs["running_summary"] == updates[0].text
    assert result.summary.endswith(newest_event(result.chunks[-1].text))


def tight_inc_run(second_answer):
    """An incremental run in a window whose running-summary room is little over G_n, where every
    compression of an update runs past that room and ends with the newest chunk; a compression of
    such a compression answers `second_answer(summary)`."""
    book = synthetic_book(3_000)
    g = 200
    long_compressions = set()

    def respond(call):
        if "condensed" in call.output_fields:
            summary = call.inputs["summary"]
            if summary in long_compressions:
                return {"condensed": second_answer(summary)}
            newest = summary.rsplit(". ", 1)[-1]
            answer = summary_of(700) + " " + newest  # far past the room, the newest chunk at its end
            long_compressions.add(answer)
            return {"condensed": answer}
        if "running_summary" in call.inputs:
            return {"summary": summary_of(250) + " " + newest_event(call.inputs["excerpt"])}
        return {"summary": summary_of(100)}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=512, context_window=2048, max_summary_tokens=g, max_regenerations=0,
                                    remove_artifacts=False)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
        rooms = program.running_room(), program.final_room()
    assert all(count_tokens(a) > max(rooms) for a in long_compressions)
    return result, lm, rooms


def test_a_compression_longer_than_the_room_is_compressed_again_before_anything_is_cut():
    """Cutting a compression to its leading sentences drops its end, the newest chunk's events (at the
    last chunk, the book's ending): a compression of the shortest answer comes first, and only what
    that still leaves over the room is cut."""
    result, lm, rooms = tight_inc_run(lambda summary: summary_of(100) + " " + summary.rsplit(". ", 1)[-1])
    updates = [n for n in result.nodes if n.kind == "update"]
    assert len(updates) == len(result.chunks) - 1 >= 3
    for update, chunk in zip(updates, result.chunks[1:]):
        first, again = [n for n in result.nodes if n.kind == "compress" and n.chunks == update.chunks]
        assert first.children == [update.id] and again.children == [first.id]
        assert first.over_budget and not first.truncated and first.tokens > max(rooms)
        assert again.text.endswith(newest_event(chunk.text))
        assert not again.truncated and not again.over_budget and not again.fallback
    calls = [c for c in lm.backend.calls if "running_summary" in c.inputs]
    compressed_again = [n for n in result.nodes if n.id.endswith("again")]
    assert [c.inputs["running_summary"] for c in calls[1:]] == [n.text for n in compressed_again[:-1]]
    assert result.summary.endswith(newest_event(result.chunks[-1].text))


@pytest.mark.parametrize("second", ["long", "wordless"])
def test_a_compression_still_too_long_after_compressing_it_again_is_cut_within_the_room(second):
    answers = {"long": lambda summary: summary, "wordless": lambda summary: "1064"}
    result, lm, (running_room, final_room) = tight_inc_run(answers[second])
    again = [n for n in result.nodes if n.id.endswith("again")]
    assert len(again) == len(result.chunks) - 1
    for node in again:
        room = final_room if node is again[-1] else running_room
        assert node.truncated and node.tokens <= room and node.fallback == (second == "wordless")
    assert result.summary == again[-1].text


@pytest.mark.parametrize("day", range(6))
def test_the_pipeline_responder_gives_the_summary_back_unchanged_when_asked_to_clean_it(day):
    """The scripted answers whole-pipeline tests use: the artifact-removal pass gives the summary back
    as it was, in one call. It took the cleaning prompt (which asks for plain text, as a summary's
    does) for a request to summarize, and wrote a fresh summary: the book's summary was another
    one than the last merge's, and one longer than it was refused, re-asked and then dropped."""
    from booklens.testing import PipelineResponder, pipeline_step

    responder = PipelineResponder()
    steps = []

    def respond(call):
        steps.append(pipeline_step({"messages": call.messages}))
        return responder({"messages": call.messages})

    lm = ScriptedLM(respond)
    book = " ".join(f"Mara walked to the mill on day {n + day} and met Tom there." for n in range(200))
    program = HierarchicalSummarizer(chunk_size=256, context_window=2048, max_summary_tokens=128,
                                     remove_artifacts=True, max_regenerations=2)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    clean, final = result.nodes[-1], result.nodes[-2]
    assert clean.kind == "clean" and final.kind == "merge"
    assert result.summary == clean.text == final.text
    assert clean.attempts == 1 and not clean.fallback
    # the cleaning call is one more call of the summary step, as run.json counts it
    assert steps == ["summarize"] * len(lm.backend.calls)
    assert len(lm.backend.calls) == 1 + sum(1 for n in result.nodes if n.kind in ("chunk", "merge"))


def reasoning_lm(thinking: int, cache_dir=None):
    """A model that reasons `thinking` tokens before it writes (OpenAI's gpt-5 and o-series): under a
    smaller max_tokens it returns no text, stopped at the cap."""
    def respond(call):
        room = int(call.request["max_tokens"]) > thinking
        lm.backend.finish_reason = "stop" if room else "length"
        return {call.output_fields[0]: "Mara finds the lamp dark." if room else ""}

    lm = ScriptedLM(respond, cache_dir=cache_dir)
    return lm


def test_an_empty_answer_the_cap_cut_off_is_asked_again_with_twice_the_cap():
    """A model that reasons before it answers may spend the whole max_tokens on reasoning and return
    no text, stopped at the cap. Asked again under the same cap it did the same, and the run ended in
    'only empty answers' however many regenerations it had."""
    lm = reasoning_lm(500)
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=2)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=synthetic_book(3_000))
    cap = program.token_cap(200)
    assert [c.request["max_tokens"] for c in lm.backend.calls] == [cap, 2 * cap]
    assert result.summary == "Mara finds the lamp dark."


def test_empty_answers_the_cap_cut_off_grow_only_as_far_as_the_window_and_say_so(tmp_path):
    lm = ScriptedLM(lambda call: "", cache_dir=tmp_path)
    lm.backend.finish_reason = "length"
    program = HierarchicalSummarizer(chunk_size=2048, context_window=4096, max_summary_tokens=200,
                                     max_regenerations=3)
    with dspy.context(lm=lm, adapter=BooklensAdapter()), pytest.raises(BooklensError) as excinfo:
        program(book=synthetic_book(1_800))
    caps = [c.request["max_tokens"] for c in lm.backend.calls]
    cap = program.token_cap(200)
    assert caps[:3] == [cap, 2 * cap, 4 * cap] and cap * 4 < caps[3] < cap * 8, caps
    sizes = [sum(count_tokens(m["content"]) + 4 for m in c.messages) + c.request["max_tokens"]
             for c in lm.backend.calls]
    assert max(sizes) <= program.context_window, sizes
    assert (f"in 4 tries (only empty answers, each cut off at its token cap (the last at {caps[3]} tokens): "
            "a model that reasons before it answers may spend the whole cap on reasoning, not kept"
            in str(excinfo.value)), str(excinfo.value)
    assert len(lm.call_cache) == 0  # as the error says: a rerun asks again


def test_a_rerun_makes_no_call_when_the_cap_stopped_first_answers_empty(tmp_path):
    """An empty answer is not kept, as a provider's glitch; one the cap stopped is no glitch, and
    unkept, every rerun of a reasoning model's summary asked each first try again, to the same end."""
    book = synthetic_book(3_000)
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     remove_artifacts=True)
    first = reasoning_lm(500, tmp_path)
    with dspy.context(lm=first, adapter=BooklensAdapter()):
        summary = program(book=book).summary
    # The summary's answer empty under its cap (364 tokens), then written under twice that; the cleanup's
    # empty under each of its three caps (74, 148 and 296 tokens), so the summary stands as it was.
    assert [c.request["max_tokens"] for c in first.backend.calls] == [364, 728, 74, 148, 296]
    again = ScriptedLM(lambda call: pytest.fail("a finished call was made again"), cache_dir=tmp_path)
    with dspy.context(lm=again, adapter=BooklensAdapter()):
        assert program(book=book).summary == summary == "Mara finds the lamp dark."


def test_the_last_regeneration_the_option_allows_still_asks_for_a_summary():
    """Each regeneration asks for 10% fewer words than the first try, so the tenth, the most
    --max-regenerations allows, asked for a summary of 1 word (130 * 0, floored at 1). It asks as
    the ninth did, for a tenth of the first limit."""
    lm = ScriptedLM(lambda call: {"summary": summary_of(2000)})  # far over budget, every time
    program = HierarchicalSummarizer(chunk_size=4096, context_window=8192, max_summary_tokens=200,
                                     max_regenerations=10)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        program(book=synthetic_book(3_000))
    limits = [int(c.inputs["word_limit"]) for c in lm.backend.calls]
    assert len(limits) == 11 and limits[0] == 130
    assert limits[1:4] == [117, 104, 91]  # as before: 10% of the first fewer each time
    assert limits == sorted(limits, reverse=True) and limits[-1] == limits[-2] == 12, limits


def test_a_chinese_summary_is_trimmed_and_cut_at_its_full_stops():
    """Budget trimming keeps whole sentences, and a cut answer loses its unfinished last one: in
    Chinese too, where sentences end at 。 rather than at . ? !"""
    from booklens.programs.summarizer import trim_to_budget, without_unfinished_sentence

    summary = "玛拉看守灯塔。泽德出现在门口。灯一直亮着，直到天亮。"
    budget = count_tokens("玛拉看守灯塔。泽德出现在门口。") + 2
    assert trim_to_budget(summary, budget) == "玛拉看守灯塔。泽德出现在门口。"
    assert without_unfinished_sentence("玛拉看守灯塔。泽德出现在门口。灯一直亮") == "玛拉看守灯塔。泽德出现在门口。"
    assert without_unfinished_sentence(summary) == summary


def test_a_cleanup_longer_than_a_short_summary_is_dropped_too():
    """A summary under 16 tokens: its cleanup's budget is its own length, not the least a summary
    budget may be, so a rewrite that adds words is dropped here as it is after a longer summary."""
    summary = "Mara finds the lamp dark. She lights it."
    longer = "Mara Vell finds the old lamp dark. She lights it."
    assert count_tokens(summary) < count_tokens(longer) <= 16
    result = summarize_with_cleanup(summary, lambda text: longer)
    clean = result.nodes[-1]
    assert result.summary == summary
    assert clean.budget == count_tokens(summary) and clean.fallback
    assert clean.dropped_rewrite_tokens == count_tokens(longer)


def test_incremental_counts_the_words_of_a_summary_in_a_script_without_spaces():
    """A Chinese summary has no spaces: the compression prompt said it had 1 word and asked for it
    to be cut to a few hundred. Unsegmented text counts as its tokens times words-per-token, the
    rate the word limit comes from, so the prompt asks to cut it by the share it is over."""
    from booklens.text import count_tokens, count_words

    sentence = "玛拉走到磨坊，在那里遇见了汤姆，他们一起谈论了灯塔的故事。"
    book = "\n\n".join(sentence * 8 for _ in range(120))
    long_summary = sentence * 30  # over G_n = 300 tokens

    def respond(call):
        if "condensed" in call.output_fields:
            return {"condensed": sentence * 3}
        return {"summary": long_summary if "running_summary" in call.inputs else sentence * 3}

    lm = ScriptedLM(respond)
    program = IncrementalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=300)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        program(book=book)
    compress_calls = [c for c in lm.backend.calls if "condensed" in c.output_fields]
    assert compress_calls
    expected = int(count_tokens(long_summary) * program.words_per_token)
    assert {int(c.inputs["current_words"]) for c in compress_calls} == {expected}
    assert expected > int(compress_calls[0].inputs["word_limit"])
    # text with spaces is counted by them, as the paper's prompts count words
    assert count_words("Mara walks to the mill.", 0.75) == 5


def test_a_first_sentence_over_the_budget_is_cut_at_a_whole_word():
    """With no whole sentence within the budget, the cut fell at a token boundary, often inside a
    word ('commend|ations'): it ends at the last whole word."""
    from booklens.programs.summarizer import trim_to_budget

    sentence = ("Wickham's expostulations about Hertfordshire drew commendations from Lydia, and the perpetual "
                "commendations of Miss Bingley unsettled Elizabeth entirely, " * 8) + "and then she left."
    split = 0
    for budget in range(20, 90):
        cut = trim_to_budget(sentence, budget)
        assert sentence.startswith(cut) and count_tokens(cut) <= budget
        split += cut[-1].isalnum() and sentence[len(cut)].isalnum()
    assert split == 0
