"""Book summarization steps (BooookScore, Appendix A): chunk summaries, merges,
incremental updates, compression, and removal of summarization artifacts."""

import dspy


class SummarizeChunk(dspy.Signature):
    """You are writing part of a summary of a long story that is processed piece by piece.
    Summarize the excerpt: the key events, the setting and background, and the characters
    with their goals and motives. Introduce each character, place or important object briefly
    the first time it appears. Tell events in the order they happen in the story even when the
    excerpt jumps around in time or between viewpoints. Write plain narrative prose, as if
    summarizing the story itself; do not mention excerpts, segments or chapters of a text.
    Stay within the word limit."""

    excerpt: str = dspy.InputField(desc="consecutive passage(s) of the story")
    word_limit: int = dspy.InputField(desc="maximum number of words of the summary")
    summary: str = dspy.OutputField(desc="the summary; one or more paragraphs")


class MergeSummaries(dspy.Signature):
    """You are building one summary of a long story by merging summaries of its consecutive parts.
    Merge the given summaries, which are in story order, into a single summary that reads as if
    it were written in one go: keep the key events, settings and characters with their goals and
    motives, drop repetition, introduce each character or place briefly at first mention, and keep
    the narrative consistent and chronological. Do not refer to parts, segments or summaries.
    Stay within the word limit."""

    summaries: list[str] = dspy.InputField(desc="summaries of consecutive parts of the story, in order")
    word_limit: int = dspy.InputField(desc="maximum number of words of the merged summary")
    summary: str = dspy.OutputField(desc="the merged summary; one or more paragraphs")


class MergeSummariesWithContext(dspy.Signature):
    """You are building one summary of a long story by merging summaries of its consecutive parts.
    The context summarizes what happened in the story just before these parts; use it only to
    understand who is who and why things happen, and do not retell it. Merge the given summaries,
    which are in story order, into a single summary that reads as if it were written in one go:
    keep the key events, settings and characters with their goals and motives, introduce new
    characters or places briefly, and keep the narrative consistent and chronological. Do not refer
    to parts, segments or summaries. Stay within the word limit."""

    context: str = dspy.InputField(desc="what happened earlier in the story")
    summaries: list[str] = dspy.InputField(desc="summaries of consecutive parts of the story, in order")
    word_limit: int = dspy.InputField(desc="maximum number of words of the merged summary")
    summary: str = dspy.OutputField(desc="the merged summary of the given parts; one or more paragraphs")


class UpdateSummary(dspy.Signature):
    """You are keeping one running summary of a long story while reading it piece by piece.
    Rewrite the running summary so that it also covers the new excerpt: add its key events,
    settings and characters with their goals and motives, introduce newcomers briefly, and keep
    the whole narrative consistent and chronological, as if written in one go. Do not mention
    excerpts, segments or the updating process. Stay within the word limit."""

    running_summary: str = dspy.InputField(desc="the summary of the story so far")
    excerpt: str = dspy.InputField(desc="the next passage of the story")
    word_limit: int = dspy.InputField(desc="maximum number of words of the updated summary")
    summary: str = dspy.OutputField(desc="the updated summary of the story so far")


class CompressSummary(dspy.Signature):
    """The summary of a story below has grown longer than allowed. Condense it to fit the word
    limit while keeping it clear and fluent: keep the key events, settings and characters with
    their goals and motives, but say them more briefly, and remove details that do not matter to
    the main storyline. Keep the narrative consistent and chronological and introduce each
    character or place briefly at first mention."""

    summary: str = dspy.InputField(desc="the summary that is too long")
    current_words: int = dspy.InputField(desc="how many words the summary has now")
    word_limit: int = dspy.InputField(desc="maximum number of words of the condensed summary")
    condensed: str = dspy.OutputField(desc="the condensed summary")


class RemoveArtifacts(dspy.Signature):
    """Clean up a book summary without changing its content. Remove phrases that talk about the
    summarization process or the text as a document instead of the story (for example "in this
    segment", "the excerpt describes", "the summary continues", "in chapter 3 of the text"), and
    remove sentences about non-narrative matter such as tables of contents, acknowledgments,
    copyright notices or information about the author. Keep every statement about the story."""

    summary: str = dspy.InputField(desc="the summary to clean")
    cleaned: str = dspy.OutputField(desc="the cleaned summary")
