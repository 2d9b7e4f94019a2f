"""A corpus sweep against the shell loop it replaces, and the Ray engine against the local one.

A fake OpenAI-compatible server on loopback answers every call after LATENCY seconds (1 s by
default, like a busy hosted model) with plausible answers for every step. The same cells (the
shared books x two systems) run three ways, each with a fresh LM cache:

  loop   one `booklens run` after another, as a shell loop would (each at --baseline-concurrency,
         `booklens run`'s default 4 unless given)
  local  `booklens sweep --engine local --concurrency C` (all cells in one process, one call limit)
  ray    `booklens sweep --engine ray --concurrency C` (a local Ray with one worker per core; its
         start-up is part of the time)

and the script prints the wall times, the LM calls each made, when the first call reached the
server and how long the command ran after the last answer, and the ratios loop/local (target
>= 10) and ray/local (target <= 1.5). The calls are the same in all three unless two cells send
an identical request (a book that fits in one chunk under both systems): the loop's later run
finds it in its cache, while concurrent cells may both make it.

    python benchmarks/bench_sweep.py                       # the six shared books x hier/inc
    python benchmarks/bench_sweep.py --systems hier-hier   # two hierarchical systems (2048, 4096)
    python benchmarks/bench_sweep.py --books 2 --max-claims 3 --skip-ray   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import nonnegative_float, positive_int, run

REPO = Path(__file__).resolve().parents[1]
BOOKS_DIR = REPO.parent / "shared" / "data" / "books"
SYSTEMS = {
    "hier-inc": [{"name": "hier-2048", "method": "hier", "chunk_size": 2048},
                 {"name": "inc-2048", "method": "inc", "chunk_size": 2048}],
    "hier-hier": [{"name": "hier-2048", "method": "hier", "chunk_size": 2048},
                  {"name": "hier-4096", "method": "hier", "chunk_size": 4096}],
}


def booklens(*args: str) -> list[str]:
    return [sys.executable, "-m", "booklens", *args]


def timed(args: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("BOOKLENS_LM", "BOOKLENS_API_BASE")}
    started = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--books", type=positive_int, default=6, help="how many of the shared books (smallest first)")
    parser.add_argument("--systems", choices=sorted(SYSTEMS), default="hier-inc")
    parser.add_argument("--latency", type=nonnegative_float, default=1.0, help="seconds the server takes per answer")
    parser.add_argument("--concurrency", type=positive_int, default=16)
    parser.add_argument("--baseline-concurrency", type=positive_int, default=4,
                        help="--concurrency of each `booklens run`")
    parser.add_argument("--max-claims", type=positive_int, default=None)
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    opts = parser.parse_args()
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    books = sorted(BOOKS_DIR.glob("*.txt"), key=lambda p: p.stat().st_size)[: opts.books]
    if not books:
        sys.exit(f"no books in {BOOKS_DIR}")
    systems = SYSTEMS[opts.systems]
    judge = {"steps": ["coherence", "faithfulness"], "evidence": "bm25"}
    if opts.max_claims:
        judge["max_claims"] = opts.max_claims
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    manifest = work / "sweep.yaml"
    manifest.write_text(json.dumps({"books": [str(b) for b in books], "systems": systems, "judge": judge}))
    cells = len(books) * len(systems)
    print(f"{len(books)} books x {len(systems)} systems = {cells} cells ({', '.join(s['name'] for s in systems)}); "
          f"server latency {opts.latency:g} s; load average {os.getloadavg()[0]:.2f}")
    print(f"work directory: {work}")

    times: dict[str, float] = {}
    answers = PipelineResponder()
    arrivals: list[float] = []  # when each call reached the server (perf_counter)

    def responder(body: dict):
        arrivals.append(time.perf_counter() - opts.latency)  # answered `latency` s after it arrived
        return answers(body)

    with FakeOpenAIServer(latency=opts.latency, responder=responder) as server:
        common = ["--lm", "openai/fake-model", "--api-base", server.url]

        def measure(name: str, commands: list[list[str]]) -> None:
            start, server.max_in_flight = len(server.served), 0
            arrivals.clear()
            started = time.perf_counter()
            seconds = sum(timed(c) for c in commands)
            ended = time.perf_counter()
            times[name] = seconds
            calls = len(server.served) - start
            ends = (f"; first call after {min(arrivals) - started:.1f} s, ended "
                    f"{ended - max(arrivals) - opts.latency:.1f} s after the last answer" if arrivals else "")
            print(f"  {name:<6} {seconds:8.1f} s  {calls:6d} LM calls  at most {server.max_in_flight:3d} in flight"
                  f"{ends}", flush=True)

        measure("local", [booklens("sweep", str(manifest), "-o", str(work / "local"), "--concurrency",
                                   str(opts.concurrency), "--cache-dir", str(work / "cache-local"), *common)])
        if not opts.skip_baseline:
            runs = []
            for system in systems:
                for book in books:
                    args = booklens("run", str(book), "-o", str(work / "loop" / system["name"] / book.stem),
                                    "--method", system["method"], "--chunk-size", str(system["chunk_size"]),
                                    "--concurrency", str(opts.baseline_concurrency),
                                    "--cache-dir", str(work / "cache-loop"), *common)
                    if opts.max_claims:
                        args += ["--max-claims", str(opts.max_claims)]
                    runs.append(args)
            measure("loop", runs)
        if not opts.skip_ray:
            measure("ray", [booklens("sweep", str(manifest), "-o", str(work / "ray"), "--engine", "ray",
                                     "--concurrency", str(opts.concurrency), "--cache-dir", str(work / "cache-ray"),
                                     *common)])
    if "loop" in times:
        print(f"loop / local: {times['loop'] / times['local']:.1f}x faster with the sweep (target >= 10x)")
    if "ray" in times:
        print(f"ray / local: {times['ray'] / times['local']:.2f}x the local time (target <= 1.5x)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run(main)
