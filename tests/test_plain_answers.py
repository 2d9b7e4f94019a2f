"""Plain-text answers (summaries) arrive without the scaffolding small models echo around them."""

from __future__ import annotations

import dspy
import pytest

from booklens.lm import BooklensAdapter
from booklens.lm.adapter import plain_answer
from booklens.programs.summarizer import IncrementalSummarizer
from booklens.testing import ScriptedLM

PROSE = "Fortunato follows Montresor into the vaults. Montresor walls him in."


@pytest.mark.parametrize("written", [
    PROSE,
    f"[[ ## summary ## ]]\n{PROSE}\n\n[[ ## completed ## ]]",
    f"[## summary ## ]\n{PROSE}",  # garbled header, as the embedded model wrote one
    f"## Summary\n\n{PROSE}\n",
    f"Summary:\n{PROSE}",
    f"[Summary]\n{PROSE}",
    f"130\n\nSummary:\n{PROSE}",  # the word limit echoed, then a label, as the embedded model wrote
    f"[## summary ## ]\n1\n{PROSE}",
    f"[[ ## summary ##]]\n{PROSE}\n[[ ## completed ## ]]\nMore text the model went on with.",
])
def test_headers_around_the_prose_are_dropped(written):
    assert plain_answer(written, "summary") == PROSE


def test_a_header_named_after_an_input_is_dropped_too():
    # Asked to condense the input `summary` into `condensed`, the model headed its answer "summary".
    assert plain_answer(f"[## summary ## ]\n{PROSE}", "condensed", ["summary", "word_limit"]) == PROSE
    assert plain_answer(f"[## summary ## ]\n{PROSE}", "condensed") == f"[## summary ## ]\n{PROSE}"


def test_an_answer_ends_where_the_model_starts_copying_an_input():
    written = f"{PROSE}\n\n[## excerpt ## ]\nI had completed the eighth, the ninth, and the tenth tier."
    assert plain_answer(written, "summary", ["running_summary", "excerpt", "word_limit"]) == PROSE
    # A markdown heading inside the answer is the answer's own structure.
    structured = f"{PROSE}\n\n## Context\nThe carnival season in Italy."
    assert plain_answer(structured, "summary", ["context", "summaries"]) == structured


def test_an_empty_list_item_at_the_end_is_dropped():
    written = "The tale, in steps:\n1. Montresor invites Fortunato.\n2. He walls him in.\n3."
    assert plain_answer(written, "summary") == written.rsplit("\n", 1)[0]
    assert plain_answer("Items:\n- one\n-", "summary") == "Items:\n- one"


def test_an_answer_without_prose_is_left_for_the_caller_to_judge():
    assert plain_answer("1064\n276", "condensed", ["summary"]) == "1064\n276"


def test_escaped_line_breaks_become_line_breaks():
    written = "Montresor leads the way.\\n\\nFortunato coughs in the damp.\\r\\nThe wall goes up."
    assert plain_answer(written, "summary") == (
        "Montresor leads the way.\n\nFortunato coughs in the damp.\nThe wall goes up.")


def test_prose_that_only_looks_like_a_header_is_kept():
    # Another field's header, a hashtag in the prose, headings that are part of the answer's content
    # (a lone heading before the prose is a title: `test_a_markdown_title_before_the_prose_is_dropped`).
    written = "## Chapter One\nMontresor invites Fortunato #carnival.\n## Chapter Two\nThe wall.\n[## claims ## ]"
    assert plain_answer(written, "summary") == written
    assert plain_answer(f"Summaries:\n{PROSE}", "summary") == f"Summaries:\n{PROSE}"


def test_an_incremental_summary_carries_the_cleaned_prose_forward():
    written = f"[## summary ## ]\n{PROSE}\\n\\nThe end."
    lm = ScriptedLM(lambda call: written)
    program = IncrementalSummarizer(chunk_size=64, context_window=2048, max_summary_tokens=200)
    book = " ".join(["Montresor planned his revenge through the long carnival night."] * 12)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    calls = lm.backend.calls
    assert len(calls) == result.levels >= 2
    cleaned = f"{PROSE}\n\nThe end."
    # Every update reads the previous answer as cleaned prose, and the result is cleaned prose.
    assert [c.inputs["running_summary"] for c in calls[1:]] == [cleaned] * (len(calls) - 1)
    assert result.summary == cleaned


@pytest.mark.parametrize("written", [
    f'{{"summary": "{PROSE}"}}',
    f'```json\n{{"summary": "{PROSE}"}}\n```',
    f'{{"Summary": "{PROSE}", }}',  # the key capitalized, a trailing comma
    f'{{"summary": ["{PROSE.split(". ")[0]}.", "{PROSE.split(". ")[1]}"]}}',  # paragraphs as a list
    f'{{"text": "{PROSE}"}}',  # the one value, under another name
])
def test_an_answer_written_as_a_json_object_is_read_as_its_prose(written):
    """Asked for plain text, a model used to JSON answers may still wrap its prose in an object; the
    summary is the prose, not the object's JSON."""
    assert plain_answer(written, "summary").replace("\n\n", " ") == PROSE


def test_json_that_is_not_an_object_of_prose_is_left_as_it_is():
    for written in ('{"summary": 3}', '{"a": "one", "b": "two"}', "{not json at all} and more"):
        assert plain_answer(written, "summary") == written


@pytest.mark.parametrize("written", [f"**Summary:**\n{PROSE}", f"**Summary**\n\n{PROSE}", f"__Summary:__\n{PROSE}",
                                     f"### **Summary**\n{PROSE}"])
def test_a_bold_markdown_header_is_dropped(written):
    assert plain_answer(written, "summary") == PROSE


@pytest.mark.parametrize("lead", ["Sure! Here is a summary of the excerpt:", "Here's the updated summary:",
                                  "Certainly. Below is the condensed summary (120 words):", "Here is the merged summary:"])
def test_a_chatty_lead_in_before_the_prose_is_dropped(lead):
    assert plain_answer(f"{lead}\n\n{PROSE}", "summary") == PROSE
    # A line that only looks like one inside the prose stays.
    inside = f"{PROSE}\nHere is what Montresor said:\nRest in peace."
    assert plain_answer(inside, "summary") == inside


@pytest.mark.parametrize("sign_off", ["I hope this helps!", "Let me know if you would like any changes.",
                                      "Would you like me to make it shorter?", "Feel free to ask for more detail."])
def test_a_chatty_sign_off_after_the_prose_is_dropped(sign_off):
    assert plain_answer(f"{PROSE}\n\n{sign_off}", "summary") == PROSE
    # Inside the prose's last paragraph it is the story's.
    said = f'{PROSE} "Let me know if you hear the bells," he says.'
    assert plain_answer(said, "summary") == said


@pytest.mark.parametrize("title", ["# Chapter summary", "## The story so far", "### Summary of chapters 1-3",
                                   "## The Cask of Amontillado ##", "# **Summary of the excerpt**"])
def test_a_markdown_title_before_the_prose_is_dropped(title):
    """A title is no sentence of the summary: kept, the coherence judge read it as one and the claim
    splitter made a claim of it."""
    assert plain_answer(f"{title}\n\n{PROSE}", "summary") == PROSE
    assert plain_answer(f"Here is the summary:\n{title}\n{PROSE}", "summary") == PROSE


@pytest.mark.parametrize("written", [
    "# Montresor walls Fortunato in.\nNo one hears him.",  # a sentence after '#' ends like one
    "#carnival season: Montresor meets Fortunato.\nHe walls him in.",  # a hashtag, not a heading
    "# Chapter summary",  # nothing after it: left for the caller to judge
    # Headings that divide the answer into sections are its structure, the first one too.
    f"## Chapter One\n{PROSE}\n\n## Chapter Two\nThe wall stands for half a century.",
])
def test_a_line_starting_with_a_hash_that_is_no_title_is_kept(written):
    assert plain_answer(written, "summary") == written


def test_a_summary_headed_by_a_title_is_the_prose_alone():
    lm = ScriptedLM(lambda call: f"## The story so far\n\n{PROSE}")
    program = IncrementalSummarizer(chunk_size=64, context_window=2048, max_summary_tokens=200)
    book = " ".join(["Montresor planned his revenge through the long carnival night."] * 12)
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        result = program(book=book)
    assert result.summary == PROSE
    assert all(node.text == PROSE for node in result.nodes)
