"""`booklens summarize BOOK`: hierarchical merging or incremental updating."""

from __future__ import annotations

import hashlib
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from booklens.cli import app
from booklens.cli.common import (
    ApiBaseOption,
    CacheDirOption,
    ConcurrencyOption,
    LMOption,
    OutputOption,
    setup_lm,
    write_output,
)
from booklens.errors import BooklensError
from booklens.lm import usage_delta


class Method(str, Enum):
    hier = "hier"
    inc = "inc"


def build_summary(book_path: Path, *, method: str = "hier", chunk_size: int = 2048, context_window: int | None = None,
                  max_summary_tokens: int = 900, level_budgets: list[int] | None = None, max_regenerations: int = 2,
                  remove_artifacts: bool = False, drop_matter: bool = False, concurrency: int = 4,
                  program_path: Path | None = None):
    """Read, chunk and summarize a book with the configured LM; returns a `Summary` record."""
    import dspy

    from booklens.lm import current_lm, usage_step
    from booklens.programs.summarizer import make_summarizer
    from booklens.records import Summary, SummaryConfig
    from booklens.text import count_tokens, read_book

    started = time.perf_counter()
    text = read_book(book_path, drop_matter=drop_matter)
    read_seconds = time.perf_counter() - started
    lm = current_lm()
    window = context_window or 8192
    backend_window = getattr(lm, "context_window", None)
    if backend_window and window > backend_window:
        raise BooklensError(f"--context-window {window} is larger than the model's context window ({backend_window})")
    config = SummaryConfig(method=method, chunk_size=chunk_size, context_window=window,
                           max_summary_tokens=max_summary_tokens, level_budgets=level_budgets or [],
                           max_regenerations=max_regenerations, remove_artifacts=remove_artifacts,
                           drop_matter=drop_matter, concurrency=concurrency,
                           program=str(program_path) if program_path else None)
    program = make_summarizer(method, chunk_size=chunk_size, context_window=window,
                              max_summary_tokens=max_summary_tokens, level_budgets=level_budgets,
                              max_regenerations=max_regenerations, concurrency=concurrency,
                              remove_artifacts=remove_artifacts)
    if program_path is not None:
        from booklens.optimizers.artifacts import load_program

        load_program(program, program_path, task="summarize")
    before = lm.usage.snapshot()
    t0 = time.perf_counter()
    with usage_step("summarize"):
        result = program(book=text)
    summarize_seconds = time.perf_counter() - t0
    after = lm.usage.snapshot()
    return Summary(
        book=str(book_path),
        book_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        book_tokens=count_tokens(text),
        summary=result.summary,
        method=method,
        config=config,
        chunks=[{"index": c.index, "start": c.start, "end": c.end, "tokens": c.tokens,
                 "split_sentence": c.split_sentence} for c in result.chunks],
        nodes=result.nodes,
        lm=getattr(lm, "label", getattr(lm, "model", str(lm))),
        usage=usage_delta(before, after),
        timings={"read_seconds": round(read_seconds, 3), "summarize_seconds": round(summarize_seconds, 3),
                 "total_seconds": round(time.perf_counter() - started, 3)},
    )


@app.command()
def summarize(
    book: Annotated[Path, typer.Argument(help="The book: .txt (UTF-8) or .epub.")],
    method: Annotated[Method, typer.Option("--method", help="hier: hierarchical merging; inc: incremental updating.")]
    = Method.hier,
    chunk_size: Annotated[int, typer.Option("--chunk-size", help="Maximum tokens per chunk (cl100k_base).")] = 2048,
    context_window: Annotated[Optional[int], typer.Option("--context-window",
                                                          help="W: tokens the model reads at once (default 8192).")]
    = None,
    max_summary_tokens: Annotated[int, typer.Option("--max-summary-tokens", help="G_n: tokens of a summary.")] = 900,
    level_budget: Annotated[Optional[list[int]], typer.Option(
        "--level-budget", help="G_l per level for hier, repeat the option per level (default: G_n everywhere).")]
    = None,
    max_regenerations: Annotated[int, typer.Option("--max-regenerations", min=0,
                                                   help="Retries for a summary over budget or cut off.")] = 2,
    remove_artifacts: Annotated[bool, typer.Option("--remove-artifacts/--keep-artifacts",
                                                   help="A last pass removing 'in this segment'-style phrases.")]
    = False,
    drop_matter: Annotated[bool, typer.Option("--drop-matter/--keep-matter",
                                              help="Drop front and back matter (contents, acknowledgments).")] = False,
    lm: LMOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = 4,
    cache_dir: CacheDirOption = None,
    program: Annotated[Optional[Path], typer.Option("--program", help="Compiled summarizer artifact (JSON).")] = None,
    output: OutputOption = None,
) -> None:
    """Summarize a book by hierarchical merging or incremental updating."""
    from booklens.text import read_book

    read_book(book, drop_matter=drop_matter)  # bad input fails before any model loads
    setup_lm(lm, api_base, cache_dir)
    record = build_summary(book, method=method.value, chunk_size=chunk_size, context_window=context_window,
                           max_summary_tokens=max_summary_tokens, level_budgets=level_budget,
                           max_regenerations=max_regenerations, remove_artifacts=remove_artifacts,
                           drop_matter=drop_matter, concurrency=concurrency, program_path=program)
    write_output(output, record)
    if output is not None:
        u = record.usage
        typer.echo(f"{len(record.summary.split())} words; {u['calls']} LM calls "
                   f"({u['cached_calls']} from cache), {u['prompt_tokens']} prompt + "
                   f"{u['completion_tokens']} completion tokens", err=True)
