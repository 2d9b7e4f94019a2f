"""`booklens summarize BOOK`: hierarchical merging or incremental updating."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    BookArgument,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    OutputOption,
    RpmOption,
    StructuredOption,
    TpmOption,
    choices,
    echo_artifact_note,
    program_path,
    retry_count,
    setup_lm,
    write_output,
)
from booklens.errors import BooklensError
from booklens.vocabulary import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_MAX_REGENERATIONS,
    DEFAULT_SUMMARY_TOKENS,
    DEFAULT_WORDS_PER_TOKEN,
    MAX_WORDS_PER_TOKEN,
    MERGE_CONTEXTS,
    MIN_CHUNK_SIZE,
    MIN_CONTEXT_WINDOW,
    MIN_SUMMARY_TOKENS,
    MIN_WORDS_PER_TOKEN,
    SUMMARY_METHODS,
    check_words_per_token,
    retry_range,
)


Method = choices("Method", SUMMARY_METHODS)
MergeContext = choices("MergeContext", MERGE_CONTEXTS)

# The summarizer's options, shared by `summarize` and `run`.
MethodOption = Annotated[Method, typer.Option("--method",
                                              help="hier: hierarchical merging; inc: incremental updating.")]
ChunkSizeOption = Annotated[int, typer.Option("--chunk-size", min=MIN_CHUNK_SIZE,
                                              help="Maximum tokens per chunk (cl100k_base).")]
ContextWindowOption = Annotated[Optional[int], typer.Option(
    "--context-window", min=MIN_CONTEXT_WINDOW,
    help=f"W: tokens the model reads at once (default {DEFAULT_CONTEXT_WINDOW}).")]
MaxSummaryTokensOption = Annotated[int, typer.Option("--max-summary-tokens", min=MIN_SUMMARY_TOKENS,
                                                     help="G_n: tokens of a summary.")]
LevelBudgetOption = Annotated[Optional[list[int]], typer.Option(
    "--level-budget", min=MIN_SUMMARY_TOKENS,
    help="G_l per level for hier, repeat the option per level (default: the published "
         "code's G_n * 0.65^(L-l) for a tree of L levels).")]
MergeContextOption = Annotated[Optional[MergeContext], typer.Option(
    "--merge-context", help="hier: what a merge after the first of its level sees as context: same-level, "
                            "the previous merged summary of its level (the paper's, the default); lower-level, "
                            "the summary just before its inputs (merges of a level run at once); none.")]
def words_per_token(text: str) -> float:
    """The parser of --words-per-token: a number, then the summarizers' own rule
    (`check_words_per_token`: typer's range check named the bound when `nan` broke none)."""
    try:
        number = float(text)
    except ValueError:
        raise BooklensError(f"--words-per-token must be a number (got {text!r})") from None
    check_words_per_token(number)
    return number


WordsPerTokenOption = Annotated[float, typer.Option(
    "--words-per-token", parser=words_per_token,
    help=f"Words a prompt asks for per token of budget, {MIN_WORDS_PER_TOKEN} to {MAX_WORDS_PER_TOKEN} "
         f"(the published code's {DEFAULT_WORDS_PER_TOKEN}).")]
MaxRegenerationsOption = Annotated[Optional[int], typer.Option(
    "--max-regenerations", parser=retry_count("--max-regenerations"),
    help=f"Retries for a summary over budget or cut off, {retry_range('--max-regenerations')} (default "
         f"{DEFAULT_MAX_REGENERATIONS}; 0 on the embedded model, whose answers the cap cuts are trimmed to whole "
         "sentences instead).")]
RemoveArtifactsOption = Annotated[bool, typer.Option(
    "--remove-artifacts/--keep-artifacts",
    help="A last pass removing 'in this segment'-style phrases (the paper's post-processing).")]
DropMatterOption = Annotated[bool, typer.Option("--drop-matter/--keep-matter",
                                                help="Drop front and back matter (contents, acknowledgments).")]


@app.command()
def summarize(
    book: BookArgument,
    method: MethodOption = Method.hier,
    chunk_size: ChunkSizeOption = DEFAULT_CHUNK_SIZE,
    context_window: ContextWindowOption = None,
    max_summary_tokens: MaxSummaryTokensOption = DEFAULT_SUMMARY_TOKENS,
    level_budget: LevelBudgetOption = None,
    merge_context: MergeContextOption = None,
    words_per_token: WordsPerTokenOption = DEFAULT_WORDS_PER_TOKEN,
    max_regenerations: MaxRegenerationsOption = None,
    remove_artifacts: RemoveArtifactsOption = True,
    drop_matter: DropMatterOption = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    structured: StructuredOption = None,
    rpm: RpmOption = None,
    tpm: TpmOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    program: Annotated[Optional[Path], typer.Option(
        "--program", parser=program_path, metavar="<path>", help="Compiled summarizer artifact (JSON).")] = None,
    output: OutputOption = None,
) -> None:
    """Summarize a book by hierarchical merging or incremental updating."""
    from booklens.steps import check_method_options, summarize_book
    from booklens.text import read_book

    merge_context = merge_context.value if merge_context is not None else None
    check_method_options(method.value, level_budget, merge_context, max_summary_tokens=max_summary_tokens)
    text = read_book(book, drop_matter=drop_matter)  # bad input fails before any model loads
    setup_lm(lm, api_base, cache_dir, structured=structured, rpm=rpm, tpm=tpm)
    record = summarize_book(book, method=method.value, chunk_size=chunk_size, context_window=context_window,
                            max_summary_tokens=max_summary_tokens, level_budgets=level_budget,
                            max_regenerations=max_regenerations, remove_artifacts=remove_artifacts,
                            drop_matter=drop_matter, concurrency=concurrency, program_path=program, text=text,
                            merge_context=merge_context, words_per_token=words_per_token)
    echo_artifact_note(program, record.lm)  # once the artifact has loaded (a wrong one is the only line)
    write_output(output, record)
    if output is not None:
        from booklens.lm.usage import describe_calls
        from booklens.text import count_words

        words = count_words(record.summary, record.config.words_per_token)  # the record summarize_book just made
        typer.echo(f"{words} words; {describe_calls(record.usage)}", err=True)
