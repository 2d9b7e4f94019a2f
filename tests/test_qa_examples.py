"""The team's NovelQA-format question set: every evidence quote occurs verbatim (after
collapsing whitespace) in its book, and every book the set refers to is a shared book."""

from __future__ import annotations

from pathlib import Path

import pytest

from booklens.data.novelqa import load_questions

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "qa"
QUESTION_FILES = sorted(EXAMPLES.glob("*.json"))


def collapse(text: str) -> str:
    return " ".join(text.split())


def test_there_are_question_files():
    assert len(QUESTION_FILES) >= 3
    assert sum(len(load_questions(f)) for f in QUESTION_FILES) >= 40


@pytest.mark.parametrize("path", QUESTION_FILES, ids=lambda p: p.stem)
def test_evidence_quotes_occur_verbatim_in_the_book(path, books_dir):
    from booklens.text import read_book

    book_path = books_dir / f"{path.stem}.txt"
    if not book_path.exists():
        pytest.skip(f"{book_path.name} is not in {books_dir}")
    book = collapse(read_book(book_path))
    missing = []
    for q in load_questions(path):
        assert q.evidences, f"{q.qid} has no evidence"
        for quote in q.evidences:
            if collapse(quote) not in book:
                missing.append(f"{q.qid}: {quote[:60]!r}")
    assert not missing, "evidence not found verbatim:\n" + "\n".join(missing)
