"""Concurrency of hierarchical merging against a fixed-latency OpenAI-compatible server.

A fake server on loopback answers every call after LATENCY seconds. Run level by level with
independent merges (lower-level context), the calls of one level run together, so the expected
wall time is
    sum over levels of ceil(calls_in_level / c) * LATENCY.
The benchmark prints measured against expected for several c, then the same tree pipelined
(a merge starts once its inputs exist), and pipelined with the paper's context (the previous
merge of the level), whose merges of one level follow each other. One untimed call goes first, so
that no row pays LiteLLM's first-call import of the OpenAI client.

    python benchmarks/bench_concurrency.py [--latency 1.0]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

from _cli import positive_float, positive_int, run as run_script


def summary_answer(words: int):
    text = " ".join(f"The keeper lit lamp {i % 7}." for i in range(words // 5))

    def respond(body: dict) -> str:
        return text  # summaries are plain-text answers

    return respond


def synthetic_book(sentences: int) -> str:
    return "".join(f"On day {i} the keeper climbed the tower and wrote in the ledger about ship {i % 31}. "
                   for i in range(sentences))


def warm_up() -> None:
    """One call through the LM layer before the timed runs: LiteLLM imports the OpenAI client on its
    first call (about 1 s), which the first timed run (concurrency 1, level by level) would pay
    alone, inflating its time and the client overhead per call derived from it."""
    from booklens.lm import BooklensLM, LiteLLMBackend
    from booklens.testing import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url))("Say hello.")


def run(book: str, latency: float, words: int, concurrency: int, **config):
    import dspy

    from booklens.lm import BooklensAdapter, BooklensLM, LiteLLMBackend
    from booklens.programs.summarizer import HierarchicalSummarizer
    from booklens.testing import FakeOpenAIServer

    with FakeOpenAIServer(latency=latency, responder=summary_answer(words)) as server:
        lm = BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url))
        program = HierarchicalSummarizer(chunk_size=1024, context_window=8192, max_summary_tokens=600,
                                         level_budgets=[600], concurrency=concurrency, **config)
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            t0 = time.perf_counter()
            result = program(book=book)
            wall = time.perf_counter() - t0
    return result, wall, len(server.served)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=positive_float, default=1.0, help="seconds the server takes per answer")
    parser.add_argument("--sentences", type=positive_int, default=8000, help="sentences of the synthetic book")
    parser.add_argument("--summary-words", type=positive_int, default=350, help="words of every answer")
    args = parser.parse_args()
    import booklens  # noqa: F401  - first: its offline settings must precede LiteLLM's import

    book = synthetic_book(args.sentences)
    warm_up()
    print(f"fixed latency {args.latency:.2f} s per call; chunk 1024, context 8192, G = 600 at every level, "
          f"summaries of ~{args.summary_words} words")
    print(f"{'concurrency':>11} {'calls':>5} {'per level':>12} {'expected s':>10} {'level by level':>14} "
          f"{'ratio':>6} {'pipelined':>9} {'same-level context':>18}")
    for concurrency in (1, 2, 4, 8, 16):
        result, wall, calls = run(book, args.latency, args.summary_words, concurrency,
                                  merge_context="lower-level", pipelined=False)
        per_level = Counter(n.level for n in result.nodes)
        expected = sum(math.ceil(n / concurrency) for n in per_level.values()) * args.latency
        _, pipelined, _ = run(book, args.latency, args.summary_words, concurrency, merge_context="lower-level")
        _, chained, _ = run(book, args.latency, args.summary_words, concurrency)
        levels = "+".join(str(per_level[level]) for level in sorted(per_level))
        print(f"{concurrency:>11} {calls:>5} {levels:>12} {expected:>10.2f} {wall:>14.2f} "
              f"{wall / expected:>6.2f} {pipelined:>9.2f} {chained:>18.2f}")
        if concurrency == 1:
            per_call = (wall - expected) / calls
            print(f"{'':>11} client overhead at concurrency 1: {per_call * 1000:.0f} ms per call "
                  "(chunking, prompt building, HTTP, parsing)")


if __name__ == "__main__":
    run_script(main)
