"""Greedy decoding under a grammar on the embedded model: llama-cpp-python's sampler chain, which
tests the whole vocabulary against the grammar for every token, against booklens's
`GreedyGrammarSampler`, which tests the best 32 tokens first. Same workload, taking turns in one
process (each sampler on a llama.cpp context of its own, first in every other turn): per-sentence confusion detection of an N-sentence summary, and verification of N claims
with the given evidence and with the whole story (`book` mode), as `booklens score` and
`booklens verify` run them. Prints the time spent outside llama.cpp's compute (sampling, mostly)
per generated token, the generation and call times, how often the shortlist did not settle a token,
and whether both samplers wrote the same answers (they must: only the work differs).

    python benchmarks/bench_grammar_sampler.py [--items 8] [--turns 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_prefix_reuse as data  # noqa: E402  - the prefix-reuse benchmark's inputs
from _cli import positive_int, run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=positive_int, default=8, help="sentences, and claims of each kind")
    parser.add_argument("--turns", type=positive_int, default=2, help="runs of the workload per sampler, taking turns")
    args = parser.parse_args()
    for path in (data.HUMAN, data.BOOK, data.SHORT_BOOK):
        if not path.exists():
            sys.exit(f"error: {path} not found (the shared data folder)")
    import dspy

    from booklens.lm import BooklensAdapter, BooklensLM, LocalBackend
    from booklens.steps import score_summaries, verify_claims
    from booklens.text import read_book

    # One backend (one llama.cpp context) per sampler, the same settings otherwise.
    backends = {"llama-cpp-python chain": LocalBackend(best_token_first=False), "best 32 first": LocalBackend()}
    answers: list[str] = []
    for backend in backends.values():
        backend._model()
        complete = backend.complete

        def recording(request, complete=complete):
            out = complete(request)
            answers.append(out.text)
            return out

        backend.complete = recording
    summary = data.forty_sentence_summary(args.items)
    claims = json.loads(data.CLAIMS.read_text())["claims"][: args.items]
    book_text = read_book(data.BOOK)
    short_claims = json.loads(data.SHORT_CLAIMS.read_text())["claims"][: args.items]
    short_text = read_book(data.SHORT_BOOK)

    def workload() -> None:
        score_summaries({"bench": summary}, concurrency=1)
        verify_claims(claims=[c["claim"] for c in claims], book_text=book_text, mode="given",
                      given=[c["evidence"] for c in claims], concurrency=1)
        verify_claims(claims=[c["claim"] for c in short_claims], book_text=short_text, mode="book", concurrency=1)

    print(f"embedded model, {backends['best 32 first'].n_threads} threads; load average {os.getloadavg()[0]:.2f}")
    print(f"{args.items} sentences, {args.items} claims with given evidence, {args.items} in book mode; "
          f"{args.turns} turns each")
    written: dict[str, list[list[str]]] = {name: [] for name in backends}
    for turn in range(args.turns):
        for name in (list(backends) if turn % 2 == 0 else list(backends)[::-1]):  # each goes first in turn
            backend = backends[name]
            backend._model().reset()  # each turn starts from a context that shares nothing
            answers.clear()
            backend.stats.clear()
            backend.grammar_counts.clear()
            with dspy.context(lm=BooklensLM(backend, cache=None), adapter=BooklensAdapter()):
                workload()
            stats = list(backend.stats)
            sampled = sum(s.generated_tokens + 1 for s in stats)  # and the end-of-answer token
            outside = sum(s.seconds - s.prompt_eval_seconds - s.generation_seconds for s in stats)
            generated = sum(s.generated_tokens for s in stats)
            print(f"  {name:24s} {len(stats)} calls, {generated} tokens written; outside llama.cpp "
                  f"{outside:5.1f} s ({1000 * outside / sampled:.1f} ms per sampled token); reading prompts "
                  f"{sum(s.prompt_eval_seconds for s in stats):5.1f} s ({sum(s.prompt_eval_tokens for s in stats)} tokens); computing tokens "
                  f"{sum(s.generation_seconds for s in stats):5.1f} s; calls {sum(s.seconds for s in stats):6.1f} s"
                  + (f"; whole-vocabulary passes {backend.grammar_counts['full_passes']} of "
                     f"{backend.grammar_counts['tokens']} tokens" if backend.grammar_counts else ""))
            written[name].append(list(answers))
    same = all(a == b for a, b in zip(*written.values()))
    print(f"same answers from both samplers: {'yes' if same else 'NO'} ({len(written['best 32 first'][0])} calls)")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run(main)
