"""Prefix reuse on the embedded model: the time of each later call against the first, when the
calls share their beginning (instructions, demos, the summary) and differ at the end.

- coherence: per-sentence confusion detection of a 40-sentence summary (the first 40 sentences of
  the first BooookScore human-annotated summary that has that many), as `booklens score` runs it;
- verification: 20 claims about Pride and Prejudice, each with its evidence, as `booklens verify`
  runs it: with the given verbatim evidence quotes, and with BM25 passages (k = 5). Each claim has
  evidence of its own there, so only the instructions and demos are shared;
- verification in the `book` evidence mode: 20 claims about The Cask of Amontillado, a story that
  fits the window whole, so every call puts the same story before its claim and shares all but
  the claim.

Each is run with one call at a time, then with --concurrency 4 (calls take turns on the one
llama.cpp context; the scheduler runs the prefix-sharing ones back to back). The programs are
built by the same library functions as the commands (`booklens.steps`), so the figures follow
whatever prompts, demos and field order the programs have when this runs. Target: every later
call at most 10% of the first.

    python benchmarks/bench_prefix_reuse.py [--sentences 40] [--claims 20] [--concurrency 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import booklens  # noqa: F401  - offline settings
from _cli import positive_int, positive_ints, run as run_script

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
HUMAN = SHARED / "booookscore" / "human" / "summary-gpt4-4096-hier.json"
BOOK = SHARED / "books" / "pride_and_prejudice.txt"
CLAIMS = REPO / "benchmarks" / "data" / "pride_and_prejudice_claims.json"
SHORT_BOOK = SHARED / "books" / "the_cask_of_amontillado.txt"
SHORT_CLAIMS = REPO / "benchmarks" / "data" / "cask_of_amontillado_claims.json"


def forty_sentence_summary(n: int) -> str:
    from booklens.text import split_sentences

    data = json.loads(HUMAN.read_text())
    for item in data.values() if isinstance(data, dict) else data:
        summary = item["summary"] if isinstance(item, dict) else str(item)
        sentences = split_sentences(summary)
        if len(sentences) >= n:
            return " ".join(sentences[:n])
    raise SystemExit(f"error: no summary with {n} sentences in {HUMAN}")


def report(name: str, stats: list, items: int, wall: float) -> dict:
    first, rest = stats[0], stats[1:]
    ratios = [s.seconds / first.seconds for s in rest]
    print(f"  {name}: {len(stats)} calls for {items} items in {wall:.1f} s")
    print(f"    first call: {first.seconds:.2f} s ({first.prompt_tokens} prompt tokens, {first.reused_tokens} reused, "
          f"{first.generated_tokens} generated)")
    if rest:
        print(f"    later calls: median {statistics.median(s.seconds for s in rest):.2f} s, "
              f"max {max(s.seconds for s in rest):.2f} s; median {statistics.median(ratios):.1%} of the first, "
              f"max {max(ratios):.1%}; {sum(r <= 0.10 for r in ratios)} of {len(rest)} at most 10%")
        print(f"    later calls evaluate a median {statistics.median(s.prompt_eval_tokens for s in rest):.0f} of "
              f"{statistics.median(s.prompt_tokens for s in rest):.0f} prompt tokens and generate a median "
              f"{statistics.median(s.generated_tokens for s in rest):.0f} tokens "
              f"({statistics.median(s.generation_seconds / s.seconds for s in rest):.0%} of their time)")
    return {"calls": len(stats), "items": items, "wall_seconds": round(wall, 2),
            "first_seconds": first.seconds, "later_seconds": [s.seconds for s in rest],
            "later_over_first": [round(r, 4) for r in ratios]}


def run(backend, fn) -> tuple[list, float]:
    backend.stats.clear()
    t0 = time.perf_counter()
    fn()
    return list(backend.stats), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=positive_int, default=40, help="sentences of the judged summary")
    parser.add_argument("--claims", type=positive_int, default=20,
                        help="claims of each verification run (the Cask of Amontillado set holds 20)")
    parser.add_argument("--concurrency", type=positive_ints, default="1,4",
                        help="comma-separated: each is a run of its own")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    levels = args.concurrency
    for path in (HUMAN, BOOK, SHORT_BOOK):
        if not path.exists():
            sys.exit(f"error: {path} not found (the shared data folder)")
    import dspy

    from booklens.lm import BooklensAdapter, BooklensLM, LocalBackend
    from booklens.steps import score_summaries, verify_claims
    from booklens.text import read_book

    backend = LocalBackend()
    lm = BooklensLM(backend, cache=None)  # no disk cache: every call reaches the model
    backend._model()
    print(f"embedded model, {backend.n_threads} threads; load average {os.getloadavg()[0]:.2f}")
    summary = forty_sentence_summary(args.sentences)
    claims = json.loads(CLAIMS.read_text())["claims"][: args.claims]
    book_text = read_book(BOOK)
    short_claims = json.loads(SHORT_CLAIMS.read_text())["claims"][: args.claims]
    short_text = read_book(SHORT_BOOK)
    results = {}
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        print(f"\ncoherence, {args.sentences} sentences, one call per sentence")
        for concurrency in levels:
            backend._model().reset()  # each run starts from a context that shares nothing
            stats, wall = run(backend, lambda: score_summaries({"bench": summary},
                                                                            concurrency=concurrency))
            results[f"coherence c{concurrency}"] = report(f"concurrency {concurrency}", stats, args.sentences, wall)
        for mode in ("given", "bm25"):
            print(f"\nverification, {len(claims)} claims, {mode} evidence")
            for concurrency in levels:
                backend._model().reset()
                stats, wall = run(backend, lambda: verify_claims(
                    claims=[c["claim"] for c in claims], book_text=book_text, mode=mode,
                    given=[c["evidence"] for c in claims] if mode == "given" else None, concurrency=concurrency))
                results[f"verify {mode} c{concurrency}"] = report(f"concurrency {concurrency}", stats, len(claims),
                                                                  wall)
        print(f"\nverification, {len(short_claims)} claims, book evidence ({SHORT_BOOK.name}, whole)")
        for concurrency in levels:
            backend._model().reset()
            stats, wall = run(backend, lambda: verify_claims(
                claims=[c["claim"] for c in short_claims], book_text=short_text, mode="book",
                concurrency=concurrency))
            results[f"verify book c{concurrency}"] = report(f"concurrency {concurrency}", stats, len(short_claims),
                                                            wall)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    run_script(main)
