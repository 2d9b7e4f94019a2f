"""booklens.retrieval: passages, BM25 / dense / hybrid ranking, whole-book context, the disk
cache of indexes, and locating quotes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

import booklens.retrieval.index as retrieval
from booklens.errors import BooklensError
from booklens.retrieval import BookIndex, Passage, QuoteLocator, locate_quote, make_passages
from booklens.testing import run_as_nobody

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
PP_CLAIMS = REPO / "benchmarks" / "data" / "pride_and_prejudice_claims.json"
CASK_CLAIMS = REPO / "benchmarks" / "data" / "cask_of_amontillado_claims.json"


def story_text() -> str:
    from booklens.text import read_book

    return read_book(STORY)


def fake_embed(texts):
    """Deterministic bag-of-words vectors: texts sharing words point the same way."""
    vectors = np.zeros((len(texts), 64), dtype="float32")
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z]+", text.lower()):
            vectors[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


# ---------------------------------------------------------------------------
# Passages


def test_passages_are_exact_spans_within_the_token_limit():
    from booklens.text import count_tokens

    text = story_text()
    passages = make_passages(text, max_tokens=64)
    assert len(passages) > 5
    for i, p in enumerate(passages):
        assert isinstance(p, Passage) and p.index == i
        assert text[p.start:p.end] == p.text and p.text == p.text.strip() and p.text
        assert count_tokens(p.text) <= 64 and p.tokens <= 64
    # in order, no overlap, and nothing but whitespace between them
    for a, b in zip(passages, passages[1:]):
        assert a.end <= b.start and not text[a.end:b.start].strip()
    assert not text[:passages[0].start].strip() and not text[passages[-1].end:].strip()


def test_a_passage_trimmed_of_its_indent_keeps_to_the_limit_and_counts_its_own_tokens():
    """Long sentences over indented lines (as Project Gutenberg prints them) are cut at whitespace; a
    piece that starts with the indent loses it when trimmed, and a word without the space before it
    can take more tokens (' acquaintance' is one, 'acquaintance' four). The passage shown is the
    trimmed text: its count, and the limit, are of that text."""
    import random

    from booklens.text import count_tokens

    vocab = ("the keeper acquaintance lamp interruption rocks flattering she said of his relationship to young "
             "ladies who introduced").split()
    over, miscounted = 0, 0
    for seed in range(40):
        pick = random.Random(seed)
        lines = [" ".join(pick.choice(vocab) for _ in range(pick.randint(6, 11))) for _ in range(12)]
        text = "\n      ".join(lines) + "."
        for p in make_passages(text, max_tokens=32):
            assert text[p.start:p.end] == p.text == p.text.strip()
            over += count_tokens(p.text) > 32
            miscounted += p.tokens != count_tokens(p.text)
    assert (over, miscounted) == (0, 0)


def test_no_passage_is_without_words():
    """A stretch with no word longer than a passage (blank lines, a row of asterisks) gives no
    passage: BM25 and the embeddings would index nothing, and evidence would show nothing."""
    blank, stars = "\n\n  \t" * 400, "* " * 1500
    text = "Maren lit the lamp. " * 5 + blank + "Jonah hid the letter. " * 5 + stars + "The boat struck the rocks."
    passages = make_passages(text, max_tokens=64)
    assert passages and all(any(ch.isalnum() for ch in p.text) for p in passages)
    assert [p.index for p in passages] == list(range(len(passages)))
    assert all(text[p.start:p.end] == p.text for p in passages)
    assert re.findall(r"\w+", " ".join(p.text for p in passages)) == re.findall(r"\w+", text)


def test_passages_end_on_sentence_boundaries():
    text = "Anna left the house at dawn. " * 3 + "Ben stayed behind and waited for the rain to stop. " * 30
    for p in make_passages(text, max_tokens=40):
        assert p.text.endswith(".")


# ---------------------------------------------------------------------------
# Ranking


def test_bm25_finds_the_passage_with_the_rare_words():
    text = " ".join(f"Sentence number {i} talks about ordinary weather and grey skies." for i in range(200))
    text += " The lighthouse keeper hid the brass telescope under the floorboards. "
    text += " ".join(f"More filler {i} about ordinary weather." for i in range(100))
    index = BookIndex.build(text, passage_tokens=64)
    hits = index.search("Where did the keeper hide the telescope?", mode="bm25", k=3)
    assert "telescope" in hits[0][0].text
    assert len(hits) == 1  # only passages that share a term with the query are returned
    assert hits[0][1] > 0
    assert index.search("the of and", mode="bm25") == []  # only stopwords: nothing to match


def test_bm25_finds_words_of_any_script():
    """Words with accents, and books in Cyrillic or Chinese, are matched like English ones."""
    from booklens.retrieval import bm25_tokens

    assert bm25_tokens("L'élève étudiait la théorie") == ["l", "élève", "étudiait", "la", "théorie"]
    russian = ("Иван жил в маленькой деревне у реки и ловил рыбу. " * 3
               + "Мария играла на скрипке в городском оркестре. " * 3
               + "Буря потопила три лодки у берега. " * 3)
    index = BookIndex.build(russian, passage_tokens=40)
    assert len(index.passages) >= 3
    hits = index.search("Мария играла на скрипке", mode="bm25", k=1)
    assert hits and "скрипке" in hits[0][0].text
    # Chinese has no spaces between words: each character is a term
    chinese = "小明住在河边的村子里。他每天早上钓鱼。" * 4 + "玛丽在城市乐团拉小提琴。" * 4 + "暴风雨打沉了三条船。" * 4
    index = BookIndex.build(chinese, passage_tokens=32)
    assert len(index.passages) >= 3
    hits = index.search("谁拉小提琴？", mode="bm25", k=1)
    assert hits and "小提琴" in hits[0][0].text


@pytest.mark.parametrize("book_form, query_form", [("NFD", "NFC"), ("NFC", "NFD")])
def test_bm25_matches_accents_however_composed(book_form, query_form):
    """A book may write 'é' as 'e' and a combining accent (an EPUB made on macOS) while a claim
    writes it as one character: the same word. Split at the accent, a decomposed book matched no
    accented word of the claim, and BM25 gave no passage at all."""
    import unicodedata

    from booklens.retrieval import bm25_tokens, words

    book = ("Le marché était plein de monde ce matin-là. " * 3 + "\n\n"
            + "Marie acheta une crème brûlée pour son élève préféré. " * 2
            + "Il pleuvait sur la ville grise. " * 3)
    index = BookIndex.build(unicodedata.normalize(book_form, book), passage_tokens=32)
    assert len(index.passages) >= 3
    hits = index.search(unicodedata.normalize(query_form, "crème brûlée élève"), mode="bm25", k=1)
    assert hits and "acheta" in hits[0][0].text
    assert words(unicodedata.normalize("NFD", "L'élève préféré")) == ["l", "élève", "préféré"]
    # compatibility forms are the same word too: a ligature from a scanned book, full-width letters
    assert bm25_tokens("the \ufb01nal Ｆｉｎｄｉｎｇ") == bm25_tokens("the final finding")
    # lowercased after that form is taken: some compatibility letters become capitals ('\u210c' is H)
    assert words("\u210cello, chapter \u2168") == ["hello", "chapter", "ix"]


TINY_STORY = ("Maren kept the lighthouse on Carrick Point for twenty years. One winter night the lamp went dark, "
              "because her brother Jonah had given away the fuel. A fishing boat struck the rocks and its skipper "
              "drowned. Jonah hid the letter that explained everything in the cellar, and Maren found it only "
              "after his death.")


def test_bm25_gives_every_passage_of_a_book_no_larger_than_k():
    """BM25's IDF cannot score a book of one or two passages above 0 (a term in every passage, or in
    one of two); such a book still gives evidence: all its passages, by score then book order."""
    one = BookIndex.build(TINY_STORY)
    assert len(one.passages) == 1
    hits = one.search("Jonah hid a letter in the cellar.", mode="bm25", k=5)
    assert [p.index for p, _ in hits] == [0]
    assert one.search("the of and", mode="bm25", k=1) == [(one.passages[0], 0.0)]

    two = BookIndex.build(TINY_STORY, passage_tokens=40)
    assert len(two.passages) == 2 and "cellar" in two.passages[1].text and "cellar" not in two.passages[0].text
    hits = two.search("Jonah hid a letter in the cellar.", mode="bm25", k=2)
    assert sorted(p.index for p, _ in hits) == [0, 1]
    assert hits == sorted(hits, key=lambda h: (-h[1], h[0].index))
    # asked for fewer passages than the book has: the one that matches best
    best = two.search("Jonah hid a letter in the cellar.", mode="bm25", k=1)
    assert [p.index for p, _ in best] == [1] and best[0][1] > 0
    assert two.search("the of and", mode="bm25", k=1) == []


def test_bm25_finds_the_one_passage_of_two_that_shares_the_query_words():
    """rank-bm25's Okapi IDF is 0 for a term in one of two passages (and below 0 for one in both),
    so on a two-passage book no passage scored above 0 and `--k 1` found nothing."""
    two = BookIndex.build(TINY_STORY, passage_tokens=40)
    assert len(two.passages) == 2
    for query, expected in (("the cellar letter", 1), ("lighthouse on Carrick Point", 0), ("the fuel of the lamp", 0), ("fishing boat", 1)):
        hits = two.search(query, mode="bm25", k=1)
        assert [p.index for p, _ in hits] == [expected], query
        assert hits[0][1] > 0
    assert two.search("an unrelated zebra", mode="bm25", k=1) == []


def okapi_ranking(index: BookIndex, query: str) -> list[tuple[int, float]]:
    """What rank-bm25's BM25Okapi itself ranks: passages scoring above 0, best first, then book order."""
    from rank_bm25 import BM25Okapi

    from booklens.retrieval import bm25_tokens

    scores = BM25Okapi([bm25_tokens(p.text) or ["\x00"] for p in index.passages]).get_scores(bm25_tokens(query))
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [(i, float(scores[i])) for i in order if scores[i] > 0]


@pytest.mark.parametrize("passage_tokens", [64, 256])
def test_bm25_ranks_an_ordinary_book_as_okapi_does(tmp_path, passage_tokens):
    """The scoring that finds something in a tiny book leaves books of many passages ranked,
    scored and cached exactly as rank-bm25's Okapi ranks them."""
    text = story_text()
    for index in (BookIndex.build(text, passage_tokens=passage_tokens),
                  BookIndex.build(text, cache_dir=tmp_path, passage_tokens=passage_tokens),
                  BookIndex.build(text, cache_dir=tmp_path, passage_tokens=passage_tokens)):
        assert len(index.passages) > 3
        for query in ("the keeper and the lamp", "Where did Jonah hide the letter?", "storm boat rocks", "zebra"):
            assert index.rank(query, "bm25") == okapi_ranking(index, query), query
            assert index.rank(query, "bm25", 3) == okapi_ranking(index, query)[:3], query
    assert index.loaded_from_cache


def test_dense_and_hybrid_with_a_fake_embedder(monkeypatch):
    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    index = BookIndex.build(text, passage_tokens=64)
    target = index.passages[7]
    query = " ".join(target.text.split()[:25])
    dense = index.search(query, mode="dense", k=3)
    assert dense[0][0].index == target.index
    assert all(-1.0001 <= s <= 1.0001 for _, s in dense)
    hybrid = index.search(query, mode="hybrid", k=3)
    assert hybrid[0][0].index == target.index and len(hybrid) == 3


def test_dense_windows_lie_inside_their_passages():
    from booklens.text import count_tokens

    index = BookIndex.build(story_text(), passage_tokens=128)
    texts, owners = index.dense_windows()
    assert len(texts) == len(owners) > len(index.passages)
    assert sorted(set(owners.tolist())) == [p.index for p in index.passages]
    for text, owner in zip(texts, owners):
        assert text in index.passages[owner].text and count_tokens(text) <= retrieval.DENSE_WINDOW_TOKENS


def test_hybrid_is_reciprocal_rank_fusion():
    index = BookIndex.build(story_text(), passage_tokens=64)
    index._rank_bm25 = lambda q, depth: [(3, 9.0), (1, 5.0), (2, 1.0)]
    index._rank_dense = lambda q, depth: [(1, 0.9), (4, 0.8), (3, 0.1)]
    fused = index.rank("anything", "hybrid", 4)
    k = retrieval.RRF_K
    expected = {3: 1 / (k + 1) + 1 / (k + 3), 1: 1 / (k + 2) + 1 / (k + 1), 4: 1 / (k + 2), 2: 1 / (k + 3)}
    assert [i for i, _ in fused] == sorted(expected, key=lambda i: -expected[i])
    for i, score in fused:
        assert score == pytest.approx(expected[i])


def test_unknown_search_mode_is_an_error():
    index = BookIndex.build(story_text())
    with pytest.raises(BooklensError, match="unknown search mode"):
        index.search("x", mode="tfidf")


QA_OPTIONS = dict(book_takes_k=True, given_cuts_passages=False)


@pytest.mark.parametrize("mode, options", [
    ("none", dict(k=5)), ("given", dict(k=5)), ("none", dict(passage_tokens=256)),
    ("given", dict(passage_tokens=256, has_book=False)), ("bm25", dict(rank_mode="bm25", **QA_OPTIONS)),
])
def test_a_setting_given_is_refused_for_a_mode_that_never_uses_it_even_at_its_default(mode, options):
    """None is what says a setting was not given: the default value given out loud is refused like any
    other, as the record would show it null all the same."""
    from booklens.retrieval import check_evidence_options

    with pytest.raises(BooklensError):
        check_evidence_options(mode, **options)


@pytest.mark.parametrize("mode, options, message", [
    ("none", dict(k=3), "k is how many passages bm25/dense/hybrid retrieve; evidence none retrieves none"),
    ("book", dict(k=3), "k is how many passages bm25/dense/hybrid retrieve; evidence book retrieves none"),
    ("bm25", dict(budget_tokens=500), "budget_tokens bounds the evidence of the book and given modes; "
                                      "evidence bm25 would not apply it"),
    ("none", dict(passage_tokens=64), "passage_tokens sizes the passages cut from the book; evidence none "
                                      "cuts none"),
    ("none", dict(k=3, as_keys=False), "--k is how many passages"),
    ("none", dict(k=3, as_keys="judge"), "judge.k is how many passages"),
    ("none", dict(k=3, **QA_OPTIONS),
     "k is how many passages bm25/dense/hybrid/book start from; evidence none retrieves none"),
    ("given", dict(passage_tokens=64, **QA_OPTIONS),
     "passage_tokens sizes the passages cut from the book; evidence given cuts none"),
    ("none", dict(rank_mode="dense", **QA_OPTIONS),
     "rank_mode ranks the passages evidence book grows its windows around; evidence none ranks none"),
    ("bm25", dict(rank_mode="dense", **QA_OPTIONS),
     "rank_mode ranks the passages evidence book grows its windows around; evidence bm25 ranks by its own name"),
    ("bm25", dict(rank_mode="dense", as_keys=False, **QA_OPTIONS),
     "--rank-mode ranks the passages --evidence book grows its windows around; evidence bm25 ranks by its own "
     "name"),
])
def test_one_checker_refuses_settings_the_evidence_mode_never_uses(mode, options, message):
    from booklens.retrieval import check_evidence_options

    with pytest.raises(BooklensError) as caught:
        check_evidence_options(mode, **options)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("mode, options", [
    ("bm25", dict(k=3)),
    ("given", dict(passage_tokens=64)),
    ("book", dict(budget_tokens=500, passage_tokens=64)),
    ("book", dict(k=3, rank_mode="dense", **QA_OPTIONS)),
    ("hybrid", dict(k=3, passage_tokens=64, **QA_OPTIONS)),
    ("given", dict(**QA_OPTIONS)),
])
def test_one_checker_takes_the_settings_the_evidence_mode_uses(mode, options):
    from booklens.retrieval import check_evidence_options

    check_evidence_options(mode, **options)


def test_book_context_fits_the_budget_in_book_order_around_the_best_passage():
    text = story_text()
    index = BookIndex.build(text, passage_tokens=64)
    total = sum(p.tokens for p in index.passages)
    assert index.book_context("anything", total) == index.passages  # the whole book when it fits
    seed = 10
    index.rank = lambda q, mode, depth: [(seed, 1.0)]
    ctx = index.book_context("anything", 300)
    assert sum(p.tokens for p in ctx) <= 300
    ids = [p.index for p in ctx]
    assert ids == sorted(ids) and seed in ids
    # one seed: a contiguous window centred on it
    assert ids == list(range(ids[0], ids[-1] + 1))
    assert abs((seed - ids[0]) - (ids[-1] - seed)) <= 1
    assert index.book_context("anything", 0) == []


def test_book_context_grows_windows_around_several_seeds():
    index = BookIndex.build(story_text(), passage_tokens=64)
    index.rank = lambda q, mode, depth: [(2, 1.0), (20, 0.5)]
    ids = [p.index for p in index.book_context("anything", 400)]
    assert 2 in ids and 20 in ids
    assert all(min(abs(i - 2), abs(i - 20)) <= 3 for i in ids)


def test_book_context_cuts_a_passage_larger_than_the_budget():
    from booklens.text import count_tokens

    text = story_text()
    index = BookIndex.build(text, passage_tokens=256)
    seed = index.passages[5]
    assert seed.tokens > 150
    index.rank = lambda q, mode, depth: [(seed.index, 1.0)]
    (piece,) = index.book_context("anything", 100)
    assert piece.index == seed.index and text[piece.start:piece.end] == piece.text
    assert seed.text.startswith(piece.text) and piece.start == seed.start
    assert 90 <= piece.tokens <= 100 and count_tokens(piece.text) == piece.tokens


def test_book_context_cuts_a_left_neighbour_at_its_end_and_skips_scraps():
    text = story_text()
    index = BookIndex.build(text, passage_tokens=64)
    seed = index.passages[10]
    index.rank = lambda q, mode, depth: [(seed.index, 1.0)]
    ctx = index.book_context("anything", seed.tokens + 40)
    assert [p.index for p in ctx] == [9, 10] and ctx[1] == seed
    left = ctx[0]
    # the part of passage 9 next to the window, not its start
    assert left.end == index.passages[9].end and index.passages[9].text.endswith(left.text)
    assert text[left.start:left.end] == left.text and 30 <= left.tokens <= 40
    # fewer than MIN_PIECE_TOKENS left: no scrap of a passage, only whole ones
    assert index.book_context("anything", seed.tokens + 10) == [seed]


def test_a_passage_cut_to_the_budget_ends_between_words():
    """A cut at a token boundary can fall inside a word of several tokens ('Wick|ham'): the judge
    would read 'Wick'. The piece stops at the last whole word instead (starts at the first, for the
    end of a passage), still within the budget."""
    from booklens.retrieval.index import cut_passage
    from booklens.text import count_tokens

    text = ("Wickham's expostulations about Hertfordshire drew commendations from Lydia, "
            "and the perpetual commendations of Miss Bingley unsettled Elizabeth entirely.")
    passage = Passage(index=0, start=0, end=len(text), tokens=count_tokens(text), text=text)
    split_words = 0
    for tokens in range(3, passage.tokens):
        for keep_end in (False, True):
            piece = cut_passage(passage, tokens, keep_end=keep_end)
            assert piece is not None and text[piece.start:piece.end] == piece.text
            assert count_tokens(piece.text) == piece.tokens <= tokens
            before = text[piece.start - 1] if piece.start > 0 else " "
            after = text[piece.end] if piece.end < len(text) else " "
            split_words += before.isalnum() and piece.text[0].isalnum()
            split_words += after.isalnum() and piece.text[-1].isalnum()
    assert split_words == 0


def test_an_empty_book_cannot_be_indexed():
    with pytest.raises(BooklensError, match="no text"):
        BookIndex.build("   \n\n  ")


# ---------------------------------------------------------------------------
# The disk cache


def test_index_is_cached_on_disk_and_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    first = BookIndex.build(text, cache_dir=tmp_path, passage_tokens=128)
    assert not first.loaded_from_cache
    first.ensure_dense()
    folders = list(tmp_path.iterdir())
    assert len(folders) == 1
    names = {p.name for p in folders[0].iterdir()}
    assert {"meta.json", "passages.json", "bm25.json", "dense.faiss", "dense_owners.npy", "dense.json"} <= names
    assert not any(n.endswith((".pkl", ".pickle")) for n in names)
    assert json.loads((folders[0] / "meta.json").read_text())["text_sha256"] == \
        hashlib.sha256(text.encode()).hexdigest()

    # second build: nothing is recomputed
    def fail(*a, **k):
        raise AssertionError("rebuilt instead of loading the cache")

    monkeypatch.setattr(retrieval, "make_passages", fail)
    monkeypatch.setattr(retrieval, "_new_bm25", fail)
    calls = []
    monkeypatch.setattr(retrieval, "embed", lambda texts: calls.append(len(texts)) or fake_embed(texts))
    second = BookIndex.build(text, cache_dir=tmp_path, passage_tokens=128)
    assert second.loaded_from_cache
    assert second.passages == first.passages
    q = "the keeper and the lamp"
    assert second.search(q, "bm25") == first.search(q, "bm25")
    assert [p.index for p, _ in second.search(q, "dense")] == [p.index for p, _ in first.search(q, "dense")]
    assert calls == [1, 1]  # only the query was embedded, passages came from dense.faiss


def test_cache_key_depends_on_text_and_settings(tmp_path):
    text = story_text()
    BookIndex.build(text, cache_dir=tmp_path, passage_tokens=128)
    BookIndex.build(text, cache_dir=tmp_path, passage_tokens=64)
    BookIndex.build(text + "\nA new last line.", cache_dir=tmp_path, passage_tokens=128)
    assert len(list(tmp_path.iterdir())) == 3
    assert BookIndex.build(text, cache_dir=tmp_path, passage_tokens=64).loaded_from_cache


def test_a_damaged_cache_is_rebuilt(tmp_path):
    text = story_text()
    BookIndex.build(text, cache_dir=tmp_path)
    folder = next(tmp_path.iterdir())
    (folder / "bm25.json").write_text("{not json")
    again = BookIndex.build(text, cache_dir=tmp_path)
    assert not again.loaded_from_cache and again.search("lamp", "bm25")
    assert BookIndex.build(text, cache_dir=tmp_path).loaded_from_cache


@pytest.mark.parametrize("name, content", [("meta.json", "null"), ("meta.json", "[]"), ("bm25.json", "[]"),
                                           ("passages.json", '{"a": 1}'), ("dense.json", "[1]"),
                                           ("dense.faiss", "not faiss"), ("dense_owners.npy", "")])
def test_an_index_file_of_the_wrong_shape_is_rebuilt(tmp_path, monkeypatch, name, content):
    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    first = BookIndex.build(text, cache_dir=tmp_path)
    first.ensure_dense()
    expected = [p.index for p, _ in first.search("the keeper and the lamp", "hybrid")]
    (next(tmp_path.iterdir()) / name).write_text(content)
    again = BookIndex.build(text, cache_dir=tmp_path)
    assert [p.index for p, _ in again.search("the keeper and the lamp", "hybrid")] == expected


def _shift_second_passage(folder):
    rows = json.loads((folder / "passages.json").read_text())
    rows[1]["start"] += 5
    (folder / "passages.json").write_text(json.dumps(rows))


def _drop_a_document_length(folder):
    state = json.loads((folder / "bm25.json").read_text())
    state["doc_len"].pop()
    (folder / "bm25.json").write_text(json.dumps(state))


def _point_a_window_at_no_passage(folder):
    owners = np.load(folder / "dense_owners.npy")
    owners[0] = -1
    np.save(folder / "dense_owners.npy", owners)


def _embeddings_of_another_size(folder):
    import faiss

    other = faiss.IndexFlatIP(8)
    other.add(np.ones((len(np.load(folder / "dense_owners.npy")), 8), dtype="float32"))
    faiss.write_index(other, str(folder / "dense.faiss"))


@pytest.mark.parametrize("edit", [_shift_second_passage, _drop_a_document_length, _point_a_window_at_no_passage,
                                  _embeddings_of_another_size])
def test_an_index_file_edited_since_it_was_saved_is_rebuilt(tmp_path, monkeypatch, edit):
    """Files that parse but are not what was saved (edited by hand, copied from elsewhere) are
    rebuilt, not read as the index: passages with wrong offsets, a BM25 state whose lists
    disagree, a window of no passage or vectors of another size."""
    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    first = BookIndex.build(text, cache_dir=tmp_path, passage_tokens=64)
    first.ensure_dense()
    query = "the keeper and the lamp"
    expected = [(p, round(s, 9)) for p, s in first.search(query, "hybrid")]
    edit(next(tmp_path.iterdir()))
    again = BookIndex.build(text, cache_dir=tmp_path, passage_tokens=64)
    assert again.passages == first.passages
    assert [(p, round(s, 9)) for p, s in again.search(query, "hybrid")] == expected
    assert BookIndex.build(text, cache_dir=tmp_path, passage_tokens=64).loaded_from_cache


def unwritable_cache_message(message: str, path: Path, setting: str = "cache_dir") -> None:
    assert "\n" not in message
    assert message.startswith(f"cannot write the index cache at {path}: "), message
    assert message.endswith(f"(it must be a folder you can write: fix that, or use another {setting})"), message


def test_an_index_folder_that_cannot_be_made_fails_before_the_passages_are_cut(tmp_path, monkeypatch):
    """A file where the cache's folder should be (root can write anywhere else): the error comes
    before any work, not after the book's passages and BM25 index are computed."""
    def fail(*a, **k):
        raise AssertionError("computed before the index folder was checked")

    monkeypatch.setattr(retrieval, "make_passages", fail)
    monkeypatch.setattr(retrieval, "_new_bm25", fail)
    (tmp_path / "cache").write_text("a file, not a folder")
    indexes = tmp_path / "cache" / "indexes"
    with pytest.raises(BooklensError) as excinfo:
        BookIndex.build(story_text(), cache_dir=indexes)
    folder = indexes / retrieval.index_key(hashlib.sha256(story_text().encode()).hexdigest(), 256)[:32]
    unwritable_cache_message(str(excinfo.value), folder)  # a library call: its keyword
    from booklens.errors import command_line

    within_command = command_line.set(True)
    try:
        with pytest.raises(BooklensError) as excinfo:
            BookIndex.build(story_text(), cache_dir=indexes)
    finally:
        command_line.reset(within_command)
    unwritable_cache_message(str(excinfo.value), folder, "--cache-dir")  # a command: its option


def test_a_read_only_index_folder_fails_before_the_book_is_embedded(monkeypatch):
    """An index folder that holds the BM25 part but takes no file: BM25 search reads it, and the
    dense part fails at once instead of after embedding the whole book. A read-only cache with no
    index of the book fails before its passages are cut."""
    import shutil
    import tempfile

    embedded = []
    monkeypatch.setattr(retrieval, "embed", lambda texts: embedded.append(len(texts)) or fake_embed(texts))
    text = story_text()
    cache = Path(tempfile.mkdtemp(prefix="booklens-ro-"))  # pytest's folders are root's alone
    try:
        cache.chmod(0o777)
        folder = BookIndex.build(text, cache_dir=cache).cache_path
        folder.chmod(0o555)
        cache.chmod(0o555)

        def work() -> str:
            index = BookIndex.build(text, cache_dir=cache)
            assert index.loaded_from_cache and index.search("lamp", "bm25")
            try:
                index.ensure_dense()
                return "built"
            except BooklensError as exc:
                dense = str(exc)
            try:
                BookIndex.build(text + " One more line.", cache_dir=cache)
                return "built"
            except BooklensError as exc:
                return f"{len(embedded)}\n{dense}\n{exc}"

        out = run_as_nobody(work)
    finally:
        cache.chmod(0o777)
        folder.chmod(0o777)
        shutil.rmtree(cache, ignore_errors=True)
    count, dense, other = out.split("\n")
    assert count == "0"  # nothing was embedded
    unwritable_cache_message(dense, folder)
    key = retrieval.index_key(hashlib.sha256((text + " One more line.").encode()).hexdigest(), 256)[:32]
    unwritable_cache_message(other, cache / key)


def test_two_threads_embed_a_book_once(tmp_path, monkeypatch):
    """Sweep cells on one book ask for its dense index at the same time: one embeds, the other
    waits and loads what it saved. The first embedding holds until the second cell has reached the
    index (waiting at its build lock, or embedding too, as it did before the lock), so the two
    overlap whatever the threads' timing."""
    import threading

    big_calls = []
    second_arrived = threading.Event()

    class WatchedLock:
        """The build lock, noting when a second cell comes to it."""

        def __init__(self):
            self.lock, self.comers = threading.Lock(), 0

        def __enter__(self):
            self.comers += 1
            if self.comers == 2:
                second_arrived.set()
            self.lock.acquire()

        def __exit__(self, *exc):
            self.lock.release()

    watched = WatchedLock()

    class OneLock(dict):
        def setdefault(self, key, default=None):
            return watched

    monkeypatch.setattr(retrieval, "_BUILD_LOCKS", OneLock())

    def slow_embed(texts):
        if len(texts) > 1:  # the book's windows, not a query
            big_calls.append(len(texts))
            if len(big_calls) == 2:
                second_arrived.set()
            assert second_arrived.wait(60)  # a guard against a hang, not a timing assumption
        return fake_embed(texts)

    monkeypatch.setattr(retrieval, "embed", slow_embed)
    text = story_text()
    results, errors = [], []

    def cell():
        try:
            index = BookIndex.build(text, cache_dir=tmp_path, passage_tokens=128)
            index.ensure_dense()
            results.append([p.index for p, _ in index.search("the keeper and the lamp", "dense")])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=cell) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(big_calls) == 1
    assert results[0] == results[1]


_BUILD_IN_A_PROCESS = """
import os, pathlib, sys, time
import booklens.retrieval.index as retrieval
from booklens.retrieval import BookIndex
sys.path.insert(0, sys.argv[3])
from test_retrieval import fake_embed, story_text

arrivals = pathlib.Path(sys.argv[4])

def slow_embed(texts):
    if len(texts) > 1:
        with open(sys.argv[2], "a") as log:
            log.write("embedded\\n")
        # Hold the embedding until the other process has come to the index too.
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing assumption
        while len(list(arrivals.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    return fake_embed(texts)

retrieval.embed = slow_embed
index = BookIndex.build(story_text(), cache_dir=sys.argv[1], passage_tokens=128)
(arrivals / str(os.getpid())).touch()
index.ensure_dense()
"""


def test_two_processes_embed_a_book_once(tmp_path):
    """Two commands on one book at once (two `verify`s): the second waits for the first's dense
    index instead of embedding the book again."""
    import subprocess
    import sys

    log = tmp_path / "log"
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    # The BM25 part is saved first, so each process loads it without the folder's lock. Were it built
    # by the processes, the first could take the lock back for its embedding before the second had
    # built it, and hold it until its 60 s guard ran out, waiting for the second to arrive.
    BookIndex.build(story_text(), cache_dir=tmp_path / "indexes", passage_tokens=128)
    args = [sys.executable, "-c", _BUILD_IN_A_PROCESS, str(tmp_path / "indexes"), str(log), str(Path(__file__).parent),
            str(arrivals)]
    procs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert log.read_text().splitlines() == ["embedded"]


def test_dense_search_with_the_real_model():
    text = ("Chapter 1. Mara repaired fishing nets on the pier every morning. " * 4
            + "Chapter 2. The orchestra rehearsed a symphony in the concert hall until midnight. " * 4
            + "Chapter 3. A storm sank three boats, and the village mourned the drowned sailors. " * 4)
    index = BookIndex.build(text, passage_tokens=40)
    hits = index.search("musicians practising classical music", mode="dense", k=1)
    assert "orchestra" in hits[0][0].text
    hits = index.search("a shipwreck during bad weather", mode="hybrid", k=1)
    assert "storm" in hits[0][0].text


def test_loading_the_embedding_model_draws_no_progress_bar(monkeypatch, capfd):
    import booklens.retrieval.index as index_module
    from transformers.utils import logging as transformers_logging

    monkeypatch.setattr(index_module, "_MODEL", None)  # load it again, under capture
    model = index_module.embedding_model()
    assert model is index_module._MODEL
    assert "Loading weights" not in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()  # the user's setting is put back


# ---------------------------------------------------------------------------
# Quotes


def test_locate_quote_ignores_whitespace_and_curly_quotes():
    text = "He said:\n“Come   here,\n  now.” And she went.\n"
    start, end = locate_quote(text, "“Come here, now.”")
    assert text[start:end] == "“Come   here,\n  now.”"
    start, end = locate_quote(text, '"Come here,\nnow."')  # straight quotes
    assert text[start:end].startswith("“Come") and text[start:end].endswith("”")
    assert locate_quote(text, "Go away") is None
    assert locate_quote(text, "   ") is None
    locator = QuoteLocator(text)
    assert locator.locate("she went") == (text.index("she went"), text.index("she went") + 8)


def test_locate_quote_takes_dashes_and_ellipses_however_typed():
    """A quote with an em dash finds the book's '--' (and the other way round), with or without
    spaces around it, and '...' finds the one-character ellipsis; the span is the book's own text."""
    text = "She paused -- then, \u201cwait\u2026 the lamp\u201d, he said\u2014and left. Then\u2014more."
    start, end = locate_quote(text, "paused\u2014then")
    assert text[start:end] == "paused -- then"
    start, end = locate_quote(text, '"wait... the lamp"')
    assert text[start:end] == "\u201cwait\u2026 the lamp\u201d"
    start, end = locate_quote(text, "he said -- and left")
    assert text[start:end] == "he said\u2014and left"
    start, end = locate_quote(text, "and left. Then --")  # ends on the mark: no trailing space taken
    assert text[start:end] == "and left. Then\u2014"
    locator = QuoteLocator(text)
    assert locator.locate("paused--then", start=text.index("then")) is None  # searched after its place
    assert locate_quote(text, "paused then") is None  # a dash is not nothing


def test_locate_quote_takes_accents_however_composed():
    """'é' as one character (NFC) in the quote finds 'e' and a combining accent (NFD) in the book,
    and the other way round; the span is the book's own text."""
    import unicodedata

    composed = "Au caf\u00e9, Ren\u00e9e lut la l\u00e9gende du ch\u00e2teau."
    decomposed = unicodedata.normalize("NFD", composed)
    assert composed != decomposed
    start, end = locate_quote(decomposed, "Ren\u00e9e lut la l\u00e9gende")
    assert decomposed[start:end] == unicodedata.normalize("NFD", "Ren\u00e9e lut la l\u00e9gende")
    start, end = locate_quote(composed, unicodedata.normalize("NFD", "du ch\u00e2teau"))
    assert composed[start:end] == "du ch\u00e2teau"
    assert locate_quote(composed, "du chateau") is None  # an accent is still an accent
    assert locate_quote(composed, "Au cafe") is None
    assert locate_quote(decomposed, "Au cafe") is None  # 'e' and the accent after it are one letter
    assert locate_quote(composed + " Au cafe noir.", "Au cafe") == (len(composed) + 1, len(composed) + 8)


def test_soft_hyphens_neither_split_words_nor_hide_quotes():
    """EPUBs often carry soft hyphens (&shy;, U+00AD: where a line may break) inside words. BM25 cut
    'won\u00adder\u00adful' into 'won', 'der', 'ful', so a claim saying 'wonderful' matched no
    passage, and a quote typed without them was not found in the book."""
    from booklens.retrieval import words

    assert words("A won\u00adder\u00adful\u2060day") == ["a", "wonderfulday"]
    book = ("The harbour was quiet that morning. " * 4 + "\n\n"
            + "Ma\u00adren found a won\u00adder\u00adful tele\u00adscope in the cel\u00adlar. " * 2
            + "Rain fell on the grey town. " * 4)
    index = BookIndex.build(book, passage_tokens=32)
    assert len(index.passages) >= 3
    hits = index.search("Maren's wonderful telescope", mode="bm25", k=1)
    assert hits and "tele\u00adscope" in hits[0][0].text
    start, end = locate_quote(book, "a wonderful telescope in the cellar")
    assert book[start:end] == "a won\u00adder\u00adful tele\u00adscope in the cel\u00adlar"
    assert locate_quote("a wonderful day", "won\u00adder\u00adful") == (2, 11)


@pytest.mark.parametrize("claims_file, book, at_least", [
    (PP_CLAIMS, "pride_and_prejudice.txt", 40),
    (CASK_CLAIMS, "the_cask_of_amontillado.txt", 20),
])
def test_every_quote_of_a_benchmark_claim_set_occurs_in_its_book(books_dir, claims_file, book, at_least):
    from booklens.text import read_book

    text = read_book(books_dir / book)
    data = json.loads(claims_file.read_text(encoding="utf-8"))
    assert data.get("book", book) == book
    assert len(data["claims"]) >= at_least
    assert {c["label"] for c in data["claims"]} == {"true", "false"}
    locator = QuoteLocator(text)
    collapsed = lambda s: " ".join(s.split())  # noqa: E731
    for claim in data["claims"]:
        assert claim["evidence"], claim["id"]
        for quote in claim["evidence"]:
            span = locator.locate(quote)
            assert span is not None, (claim["id"], quote[:60])
            assert collapsed(text[span[0]:span[1]]) == collapsed(quote)


# A build killed while it writes (kill -9, a machine that went down): the write of `which` stops
# halfway and the process dies on the spot, as no handler runs.
_KILLED_BUILD = """
import os, signal, sys
import numpy as np
import booklens.retrieval.index as retrieval
from booklens.retrieval import BookIndex

which, cache, text = sys.argv[1], sys.argv[2], open(sys.argv[3], encoding="utf-8").read()
retrieval.embed = lambda texts: np.ones((len(texts), 8), dtype="float32") / np.sqrt(8)
real_dump = retrieval.json.dump

def dump(payload, handle, **kw):
    if which == "bm25" and isinstance(payload, dict) and payload.get("class") == "BM25Okapi":
        handle.write("{\\"half")
        handle.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_dump(payload, handle, **kw)

retrieval.json.dump = dump
index = BookIndex.build(text, cache_dir=cache)
if which == "dense":
    import faiss

    def write_index(index, path):
        open(path, "w").write("half")
        os.kill(os.getpid(), signal.SIGKILL)

    faiss.write_index = write_index
    index.ensure_dense()
"""


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".write-check"))


@pytest.mark.parametrize("which", ["bm25", "dense"])
def test_a_killed_index_build_leaves_nothing_the_next_build_takes_or_keeps(tmp_path, monkeypatch, which):
    """A build killed mid-write leaves its hidden `.NAME.XXXX.tmp` in the index folder. It is never
    read as an index (the next build builds), and that build removes it."""
    import subprocess
    import sys

    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", _KILLED_BUILD, which, str(tmp_path / "cache"),
                           str(tmp_path / "book.txt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    folder = next((tmp_path / "cache").iterdir())
    assert leftovers(folder), "the kill left the write's temporary file"
    index = BookIndex.build(text, cache_dir=tmp_path / "cache")
    assert index.loaded_from_cache == (which == "dense")
    assert index.search("lamp", "bm25")
    if which == "dense":
        assert not index.dense_ready and [p.index for p, _ in index.search("the keeper", "dense")]
    assert leftovers(folder) == []


@pytest.mark.parametrize("which", ["bm25", "dense"])
def test_an_index_build_stopped_by_ctrl_c_removes_its_temporary_files(tmp_path, monkeypatch, which):
    monkeypatch.setattr(retrieval, "embed", fake_embed)
    text = story_text()
    if which == "dense":
        index = BookIndex.build(text, cache_dir=tmp_path)

        def write_index(index, path):
            Path(path).write_text("half")
            raise KeyboardInterrupt

        import faiss

        monkeypatch.setattr(faiss, "write_index", write_index)
        with pytest.raises(KeyboardInterrupt):
            index.ensure_dense()
    else:
        real_dump = json.dump

        def dump(payload, handle, **kw):
            if isinstance(payload, dict) and payload.get("class") == "BM25Okapi":
                handle.write('{"half')
                raise KeyboardInterrupt
            return real_dump(payload, handle, **kw)

        monkeypatch.setattr(retrieval.json, "dump", dump)
        with pytest.raises(KeyboardInterrupt):
            BookIndex.build(text, cache_dir=tmp_path)
    assert leftovers(next(tmp_path.iterdir())) == []


def test_the_index_folder_has_one_lock_named_for_the_whole_index_and_an_old_dense_lock_is_left_alone(
        tmp_path, monkeypatch):
    """A BM25-only build took a lock named `dense.lock`. Both parts are built under one `index.lock`;
    a folder of an older version, with its `dense.lock`, is loaded as it was, nothing built again."""
    embedded = []
    monkeypatch.setattr(retrieval, "embed", lambda texts: embedded.append(len(texts)) or fake_embed(texts))
    text = story_text()

    def locks(folder: Path) -> list[str]:
        return sorted(p.name for p in folder.iterdir() if p.name.endswith(".lock"))

    index = BookIndex.build(text, cache_dir=tmp_path / "new", passage_tokens=128)
    folder = next((tmp_path / "new").iterdir())
    assert locks(folder) == ["index.lock"] and not index.dense_ready and embedded == []
    q = "the keeper and the lamp"
    found = [p.index for p, _ in index.search(q, "dense")]
    assert locks(folder) == ["index.lock"] and index.dense_ready and len(embedded) == 2  # passages, query

    # the same folder as an older version left it: its lock file was dense.lock
    old = tmp_path / "old" / folder.name
    old.mkdir(parents=True)
    for path in folder.iterdir():
        (old / ("dense.lock" if path.name == "index.lock" else path.name)).write_bytes(path.read_bytes())
    built = []
    real_build = BookIndex._build.__func__
    monkeypatch.setattr(BookIndex, "_build", classmethod(lambda cls, *a: built.append(a) or real_build(cls, *a)))
    embedded.clear()
    again = BookIndex.build(text, cache_dir=tmp_path / "old", passage_tokens=128)
    assert again.loaded_from_cache and built == []
    assert [p.index for p, _ in again.search(q, "dense")] == found
    assert embedded == [1]  # the query alone: the passages' embeddings were loaded
    assert locks(old) == ["dense.lock", "index.lock"]
