"""What a booklens cache folder holds, and taking out what no booklens run reads any more.

The cache (`--cache-dir`, `BOOKLENS_CACHE_DIR`, else ~/.cache/booklens) holds the completed LM
calls (`calls.sqlite`: the record a rerun resumes from), the books' passage indexes
(`indexes/KEY`), the judges' calibrations (`calibration.json`) and, in the default cache, the
embedded model's converted weights (`models/`). Indexes grow with every book,
passage size and booklens version, and a version that changes how passages are cut keys its
indexes anew, so the old ones are never read again: `prune_cache` removes those, and only those.
Calls, calibrations and weights are never removed here: reruns and judge lines rely on the first
two, and the weights would only be converted again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from booklens.errors import BooklensError

# Where qa kept its indexes before every command shared `indexes/`: nothing reads it now.
OLD_QA_INDEXES = "index"


@dataclass
class IndexFolder:
    path: Path
    state: str  # `booklens.retrieval.index.index_folder_state`: current, stale or incomplete
    size: int  # bytes


@dataclass
class CacheContents:
    folder: Path
    calls: Optional[int]  # answers in calls.sqlite; None when there is no such file
    calls_size: int
    indexes: list[IndexFolder] = field(default_factory=list)
    calibrations: int = 0
    weights_size: int = 0  # the embedded model's converted weights (`models/`), 0 when none
    size: int = 0  # bytes of everything in the folder

    def of_state(self, state: str) -> list[IndexFolder]:
        return [index for index in self.indexes if index.state == state]


@dataclass
class Pruned:
    removed: list[IndexFolder]
    in_use: int  # stale folders another process was building in (left for a later prune)

    @property
    def size(self) -> int:
        return sum(index.size for index in self.removed)


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed; what cannot be read counts 0)."""
    if path.is_file():
        with contextlib.suppress(OSError):
            return path.stat().st_size
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def cache_contents(cache_dir: str | Path | None = None) -> CacheContents:
    """What the cache folder `cache_dir` (the default cache when None) holds. Reads only: a cache
    that does not exist yet is an empty one."""
    from booklens.judges import read_store, user_store_path
    from booklens.lm.cache import CACHE_FILE, cache_folder, stored_calls
    from booklens.lm.embedded import WEIGHTS_FOLDER
    from booklens.retrieval import index_dir
    from booklens.retrieval.index import index_folder_state

    folder = cache_folder(cache_dir)
    if folder.exists() and not folder.is_dir():
        raise BooklensError(f"cannot use {folder} as the cache directory: it is a file")
    calls_file = folder / CACHE_FILE
    calls = stored_calls(calls_file) if calls_file.exists() else None
    indexes = [IndexFolder(path, index_folder_state(path), folder_size(path))
               for path in _subfolders(index_dir(folder))]
    indexes += [IndexFolder(path, "stale", folder_size(path)) for path in _subfolders(folder / OLD_QA_INDEXES)]
    return CacheContents(folder=folder, calls=calls, calls_size=_with_journal_size(calls_file), indexes=indexes,
                         calibrations=len(read_store(user_store_path(folder))),
                         weights_size=folder_size(folder / WEIGHTS_FOLDER), size=folder_size(folder))


def prune_cache(cache_dir: str | Path | None = None) -> Pruned:
    """Remove the cache's stale index folders: those built by a booklens whose passages or tokenizer
    differ from this one's, and the folder qa kept indexes in before; no run reads them. A folder
    another process holds the lock of is left, as are current and incomplete ones (the next run on
    that book finishes an incomplete one). Calls and calibrations are never touched."""
    from booklens.retrieval.index import held_quietly

    contents = cache_contents(cache_dir)
    removed, in_use = [], 0
    for index in contents.of_state("stale"):
        with held_quietly(index.path) as held:
            if not held:
                in_use += 1
                continue
            try:
                shutil.rmtree(index.path)
            except OSError as exc:
                raise BooklensError(f"cannot remove the stale index {index.path}: {exc.strerror or exc}") from None
        removed.append(index)
    old = contents.folder / OLD_QA_INDEXES
    with contextlib.suppress(OSError):
        old.rmdir()  # only once empty: a file someone put there stays, and so does the folder
    return Pruned(removed=removed, in_use=in_use)


def describe_contents(contents: CacheContents) -> list[str]:
    """The lines `booklens cache` prints about a cache folder."""
    lines = [f"cache: {contents.folder} ({size_text(contents.size)})"]
    lines.append("calls: none" if contents.calls is None
                 else f"calls: {contents.calls:,} {'answer' if contents.calls == 1 else 'answers'} "
                      f"({size_text(contents.calls_size)})")
    current, stale, incomplete = (contents.of_state(state) for state in ("current", "stale", "incomplete"))
    parts = [f"{len(current)} current ({size_text(sum(i.size for i in current))})"]
    if incomplete:
        parts.append(f"{len(incomplete)} incomplete, where a build stopped (the next run on that book finishes it)")
    if stale:
        parts.append(f"{len(stale)} stale, built by an older booklens and read by none now "
                     f"({size_text(sum(i.size for i in stale))}; `booklens cache --prune` removes them)")
    lines.append(f"book indexes: {', '.join(parts)}")
    lines.append(f"judge calibrations: {contents.calibrations}")
    if contents.weights_size:
        lines.append(f"embedded model weights, converted once: {size_text(contents.weights_size)}")
    return lines


def describe_pruned(pruned: Pruned) -> str:
    line = (f"removed {len(pruned.removed)} stale index {'folder' if len(pruned.removed) == 1 else 'folders'} "
            f"({size_text(pruned.size)})")
    if pruned.in_use:
        line += f"; {pruned.in_use} in use by another process left (prune again once it is done)"
    return line


def size_text(size: int) -> str:
    """Bytes as people read them: 512 B, 3.4 KB, 12.0 MB, 1.2 GB (powers of 1000)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _subfolders(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir() and not child.is_symlink())
    except OSError:  # no such folder yet (or not one): no indexes there
        return []


def _with_journal_size(calls_file: Path) -> int:
    """The calls file with SQLite's write-ahead log and its index beside it."""
    return sum(folder_size(calls_file.with_name(calls_file.name + suffix)) for suffix in ("", "-wal", "-shm")
               if calls_file.with_name(calls_file.name + suffix).exists())
