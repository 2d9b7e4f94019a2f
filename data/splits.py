"""Train/dev/test splits by book.

Every loader splits its items by book, so that no book's summaries, claims or
questions appear in more than one split; the split depends only on the set of
book names, the seed and the fractions (never on the order of the items).
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar, overload

T = TypeVar("T")

DEFAULT_FRACTIONS: dict[str, float] = {"train": 0.4, "dev": 0.2, "test": 0.4}
SPLITS: tuple[str, ...] = tuple(DEFAULT_FRACTIONS)
DEFAULT_SEED = 0
# Seeds reach numpy's global RNG (DSPy's optimizers, the bootstrap), which takes only these.
SEED_RANGE: tuple[int, int] = (0, 2**32 - 1)


def _allocate(n: int, fractions: Sequence[float]) -> list[int]:
    """Split `n` books into counts proportional to `fractions` (largest remainder, ties to the earlier split)."""
    raw = [f * n for f in fractions]
    counts = [math.floor(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def _key_fn(key: str | Callable[[Any], Hashable]) -> Callable[[Any], Hashable]:
    if callable(key):
        return key

    def get(item: Any) -> Hashable:
        if isinstance(item, Mapping):
            return item[key]
        return getattr(item, key)

    return get


@overload
def split_by_book(items: Sequence[T], key: str | Callable[[T], Hashable], seed: int = ...,
                  fractions: Mapping[str, float] = ...) -> dict[str, list[T]]: ...


@overload
def split_by_book(items: Sequence[T], key: str | Callable[[T], Hashable], seed: int = ...,
                  fractions: Sequence[float] = ...) -> list[list[T]]: ...


def split_by_book(items, key, seed=DEFAULT_SEED, fractions=None):
    """Split `items` so that all items of one book land in the same split.

    `key` names the book of an item: an attribute or mapping key (`"book"`), or a
    function. `fractions` are the shares of *books* per split, either a mapping
    (`{"train": .4, "dev": .2, "test": .4}`, the default; returns a dict with the
    same names) or a sequence (returns a list of lists in that order); they must
    sum to 1. The books are sorted, shuffled with `random.Random(seed)` and cut
    into consecutive groups, so the result is reproducible; items keep their
    input order within a split.
    """
    if fractions is None:
        fractions = DEFAULT_FRACTIONS
    names = list(fractions) if isinstance(fractions, Mapping) else None
    shares = [float(fractions[n]) for n in names] if names is not None else [float(f) for f in fractions]
    if not shares or any(f < 0 for f in shares) or abs(sum(shares) - 1.0) > 1e-6:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {shares}")
    get = _key_fn(key)
    items = list(items)
    books = sorted({get(item) for item in items}, key=lambda b: (str(type(b)), str(b)))
    random.Random(seed).shuffle(books)
    assignment: dict[Hashable, int] = {}
    start = 0
    for split_index, count in enumerate(_allocate(len(books), shares)):
        for book in books[start : start + count]:
            assignment[book] = split_index
        start += count
    groups: list[list] = [[] for _ in shares]
    for item in items:
        groups[assignment[get(item)]].append(item)
    if names is not None:
        return dict(zip(names, groups))
    return groups


def books_in_split(books: Sequence[Hashable], split: str, seed: int = DEFAULT_SEED,
                   fractions: Mapping[str, float] | None = None) -> list[Hashable]:
    """The books of `books` that `split_by_book` puts in the split named `split`."""
    fractions = dict(fractions or DEFAULT_FRACTIONS)
    if split not in fractions:
        raise ValueError(f"unknown split {split!r}: choose one of {', '.join(fractions)}")
    return split_by_book(list(books), key=lambda b: b, seed=seed, fractions=fractions)[split]


def select_books(names: Sequence[str], split: str | None = None, limit: int | None = None) -> list[str]:
    """The names of the books in `split` of `names` (as `books_in_split` draws it), then the first
    `limit` of them; sorted when either is given, so that a subset is the same whatever the order
    the books came in."""
    names = list(names)
    if split is not None:
        chosen = set(books_in_split(names, split))
        names = [n for n in names if n in chosen]
    names = sorted(names) if (split is not None or limit is not None) else names
    if limit is not None:
        names = names[:limit]
    return names
