"""Hierarchical summary of Pride and Prejudice against a loopback OpenAI-compatible server that
answers every call after 1 s: booklens at --concurrency 8 against the published BooookScore
summarizer (PyPI `booookscore==0.1.3`), measured in the same run.

booookscore is not a booklens dependency. Install it next to booklens for this benchmark only:

    pip install --no-deps booookscore==0.1.3 anthropic==0.21.3

(its other pins, torch 1.13 and numpy 1.23, would replace booklens's; the packages its summarizer
imports are already present). It is run the way its README says, `python -m booookscore.chunk`
then `python -m booookscore.summ --api openai ...`, unedited, with three things from the outside:
the OpenAI client's `OPENAI_BASE_URL` points it at the loopback server; `PYTHONPATH` holds the
package folder, because `summ.py` imports its helpers as the top-level module `utils`; and its
prompt templates, which the wheel does not ship, come from the protocol folder of the BooookScore
data (`prompts/` in its working directory). Its input format is a pickle of {book: text}, which
this script writes itself from the same text booklens reads.

The server's answers come in two kinds:
- short: one fixed three-sentence summary for every call (merges then take everything at once);
- budget: prose of 80% of the words the prompt asks for (both tools state a word limit), so the
  tree has the depth real summaries give it.

booklens runs through its CLI (a fresh process with a fresh cache, start-up included: what a
user waits for; `--keep-artifacts`, since booookscore's summarizer makes no artifact-removal pass
either; once as `openai/` and once as `hosted_vllm/`, the two LiteLLM routes to such a server) and in-process with each merge context, pipelined and level by level (after one warm-up
call, so that no row pays LiteLLM's first-call import of the OpenAI client).

    python benchmarks/bench_vs_booookscore.py [--latency 1.0] [--concurrency 8] [--answers short,budget]
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import nonnegative_float, names_from, positive_int, run

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO.parent / "shared" / "data" / "books" / "pride_and_prejudice.txt"
PROTOCOL = REPO.parent / "shared" / "data" / "booookscore" / "protocol"
SENTENCE = "Elizabeth walked to Netherfield and spoke with Jane about the ball and Mr. Darcy's pride."
SHORT = ("Elizabeth Bennet meets the proud Mr. Darcy. She rejects his first proposal. "
         "They marry once pride and prejudice give way.")
WORD_LIMIT = (re.compile(r"\[\[ ## word_limit ## \]\]\s*(\d+)"), re.compile(r"within ([\d.]+) words"))


def responder(kind: str):
    def short(body: dict) -> str:
        return SHORT

    def budget(body: dict) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        for pattern in WORD_LIMIT:
            match = pattern.search(prompt)
            if match:
                words = int(float(match.group(1)) * 0.8)
                break
        else:
            words = 100
        n = max(1, words // len(SENTENCE.split()))
        return " ".join([SENTENCE] * n)

    return {"short": short, "budget": budget}[kind]


def booookscore_dir() -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("booookscore")
    except ImportError:
        return None
    return Path(spec.origin).parent if spec and spec.origin else None


def booookscore_env(package: Path, environ: dict[str, str]) -> dict[str, str]:
    """The environment of booookscore's scripts: its package folder first on PYTHONPATH (for its
    top-level `utils` import), then the caller's entries, which may be where booookscore is."""
    paths = [str(package), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environ, "PYTHONPATH": os.pathsep.join(paths)}


def run_step(name: str, command: list[str], **kwargs) -> None:
    """Run one step in a subprocess; a failure ends the benchmark in one line with the step's
    last line of stderr (its own error), not a traceback that hides it."""
    from booklens.errors import BooklensError

    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise BooklensError(f"{name} failed (exit {done.returncode}): {lines[-1] if lines else 'no output'}")


def run_booookscore(text: str, latency: float, answers: str, work: Path) -> tuple[float, int]:
    from booklens.testing import FakeOpenAIServer

    package = booookscore_dir()
    (work / "prompts").symlink_to(PROTOCOL)
    (work / "key.txt").write_text("not-a-key")
    with open(work / "books.pkl", "wb") as f:
        pickle.dump({"pride_and_prejudice": text}, f)
    env = booookscore_env(package, dict(os.environ))
    run_step("booookscore.chunk", [sys.executable, "-m", "booookscore.chunk", "--chunk_size", "2048",
                                   "--input_path", "books.pkl", "--output_path", "chunks.pkl"], cwd=work, env=env)
    with FakeOpenAIServer(latency=latency, responder=responder(answers)) as server:
        env["OPENAI_BASE_URL"] = server.url
        t0 = time.perf_counter()
        run_step("booookscore.summ", [sys.executable, "-m", "booookscore.summ", "--book_path", "chunks.pkl",
                                      "--summ_path", "summaries.json", "--model", "fake-model", "--api", "openai",
                                      "--api_key", "key.txt", "--method", "hier", "--chunk_size", "2048",
                                      "--max_context_len", "8192", "--max_summary_len", "900"], cwd=work, env=env)
        return time.perf_counter() - t0, len(server.served)


def run_booklens_cli(latency: float, answers: str, concurrency: int, work: Path,
                     model: str = "openai/fake-model") -> tuple[float, int, float, float]:
    """(seconds, calls, seconds until the first call reached the server, seconds from the last
    answer to the end of the process)."""
    from booklens.testing import FakeOpenAIServer

    arrivals: list[float] = []
    answer = responder(answers)

    def timed_answer(body: dict) -> str:
        arrivals.append(time.perf_counter() - t0 - latency)  # answered `latency` s after it arrived
        return answer(body)

    with FakeOpenAIServer(latency=latency, responder=timed_answer) as server:
        t0 = time.perf_counter()
        run_step("booklens summarize", [sys.executable, "-m", "booklens", "summarize", str(BOOK), "--method", "hier",
                                        "--chunk-size", "2048", "--context-window", "8192",
                                        "--concurrency", str(concurrency), "--lm", model, "--api-base", server.url,
                                        "--cache-dir", str(work / "cache"), "--keep-artifacts",
                                        "-o", str(work / "summary.json")])
        seconds = time.perf_counter() - t0
        return seconds, len(server.served), min(arrivals), seconds - max(arrivals) - latency


def warm_up_library() -> None:
    """One call through the LM layer before the in-process runs: LiteLLM imports the OpenAI client
    on its first call (about 1 s), which only the first timed run would otherwise pay."""
    from booklens.lm import BooklensLM, LiteLLMBackend
    from booklens.testing import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url))("Say hello.")


def run_booklens_library(text: str, latency: float, answers: str, concurrency: int,
                         **config) -> tuple[float, int, str]:
    import dspy

    from booklens.lm import BooklensAdapter, BooklensLM, LiteLLMBackend
    from booklens.programs.summarizer import HierarchicalSummarizer
    from booklens.testing import FakeOpenAIServer

    with FakeOpenAIServer(latency=latency, responder=responder(answers)) as server:
        lm = BooklensLM(LiteLLMBackend("openai/fake-model", api_base=server.url))
        program = HierarchicalSummarizer(chunk_size=2048, context_window=8192, max_summary_tokens=900,
                                         concurrency=concurrency, **config)
        with dspy.context(lm=lm, adapter=BooklensAdapter()):
            t0 = time.perf_counter()
            result = program(book=text)
            seconds = time.perf_counter() - t0
    per_level: dict[int, int] = {}
    for node in result.nodes:
        per_level[node.level] = per_level.get(node.level, 0) + 1
    return seconds, len(server.served), "+".join(str(per_level[k]) for k in sorted(per_level))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=nonnegative_float, default=1.0, help="seconds the server takes per answer")
    parser.add_argument("--concurrency", type=positive_int, default=8, help="booklens's --concurrency")
    parser.add_argument("--answers", type=names_from(("short", "budget")), default="short,budget",
                        help="the server's answers, comma-separated: short, budget (see above), or all")
    args = parser.parse_args()
    import booklens  # noqa: F401  - offline settings (tiktoken's file, LiteLLM's price map) for child processes too
    from booklens.text import count_tokens, read_book

    if not BOOK.exists():
        sys.exit(f"error: {BOOK} not found (the shared data folder)")
    if booookscore_dir() is None:
        sys.exit("error: booookscore is not installed: pip install --no-deps booookscore==0.1.3 anthropic==0.21.3")
    text = read_book(BOOK)
    print(f"Pride and Prejudice: {count_tokens(text)} tokens; chunk 2048, window 8192, G_n 900; "
          f"server latency {args.latency:g} s per call; load average {os.getloadavg()[0]:.2f}")
    for answers in args.answers:
        print(f"\nanswers: {answers}")
        print(f"{'run':<54} {'calls':>5} {'levels':>9} {'seconds':>8} {'speed-up':>8}")
        with tempfile.TemporaryDirectory() as tmp:
            base_seconds, base_calls = run_booookscore(text, args.latency, answers, Path(tmp))
        print(f"{'booookscore 0.1.3 summ.py (sequential)':<54} {base_calls:>5} {'':>9} {base_seconds:>8.1f} "
              f"{1.0:>7.1f}x")
        # The same server as `openai/` (LiteLLM's OpenAI SDK route, the usual one for llama.cpp) and as
        # `hosted_vllm/` (LiteLLM's own HTTP client, no OpenAI SDK to load before the first call).
        for model in ("openai/fake-model", "hosted_vllm/fake-model"):
            with tempfile.TemporaryDirectory() as tmp:
                seconds, calls, first_call, after_last = run_booklens_cli(args.latency, answers, args.concurrency,
                                                                          Path(tmp), model)
            route = model.split("/")[0]
            print(f"{f'booklens summarize CLI, {route}/, --concurrency {args.concurrency}':<54} {calls:>5} {'':>9} "
                  f"{seconds:>8.1f} {base_seconds / seconds:>7.1f}x")
            print(f"{'  of which until the first call reaches the server':<54} {'':>5} {'':>9} {first_call:>8.1f}")
            print(f"{'  of which after the last answer':<54} {'':>5} {'':>9} {after_last:>8.1f}")
        warm_up_library()
        for context in ("same-level", "lower-level"):
            for pipelined in (True, False):
                seconds, calls, levels = run_booklens_library(text, args.latency, answers, args.concurrency,
                                                              merge_context=context, pipelined=pipelined)
                name = f"booklens library, {context} context, {'pipelined' if pipelined else 'level by level'}"
                print(f"{name:<54} {calls:>5} {levels:>9} {seconds:>8.1f} {base_seconds / seconds:>7.1f}x")


if __name__ == "__main__":
    run(main)
