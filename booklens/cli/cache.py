"""`booklens cache`: what the cache folder holds, and `--prune` to remove the indexes no run reads."""

from __future__ import annotations

from typing import Annotated

import typer

from booklens.cli import app
from booklens.cli.common import CacheDirOption


@app.command("cache")
def cache_command(
    cache_dir: CacheDirOption = None,
    prune: Annotated[bool, typer.Option(
        "--prune", help="Remove the book indexes an older booklens built, which no run reads now. LM calls "
                        "and calibrations are kept: they are what reruns resume from.")] = False,
) -> None:
    """What the cache holds (LM calls, book indexes, judge calibrations) and how large it is;
    --prune removes the stale indexes."""
    from booklens.cache_contents import cache_contents, describe_contents, describe_pruned, prune_cache

    if prune:
        typer.echo(describe_pruned(prune_cache(cache_dir)))
    for line in describe_contents(cache_contents(cache_dir)):
        typer.echo(line)
