"""What booklens itself adds to each LM call: a predictor called against a scripted LM that answers
at once, so everything measured is Python. booklens's predictors (`booklens.programs.base.Predict`)
against the same predictor as a plain `dspy.Predict`, whose `Module.__getattribute__` walks the
whole stack with `inspect.stack()` on every call.

    python benchmarks/bench_call_overhead.py [--calls 200] [--repeat 5]

Each variant runs in a fresh process: the first call (when `inspect` maps every loaded module's
file), then the median of the following calls, called from a shallow stack (as a command's call
is) and from 60 frames down (as under a notebook, a web server or a test runner). Each call is
one program call and one predictor call, as in `ClaimDecomposer`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _cli import positive_int, run

PROBE = """
import json, statistics, sys, time
import booklens  # its offline settings, before DSPy imports LiteLLM
import dspy
from booklens.lm import BooklensAdapter
from booklens.programs.faithfulness import ClaimDecomposer
from booklens.testing import ScriptedLM

plain = sys.argv[1] == "dspy"
calls, depth = int(sys.argv[2]), int(sys.argv[3])
program = ClaimDecomposer()
if plain:  # the same program on DSPy's own classes
    predictor = dspy.Predict(program.decompose.signature)
    program = dspy.Module.__new__(dspy.Module)
    dspy.Module.__init__(program)
    program.decompose = predictor
    program.forward = lambda summary: predictor(summary=summary)
lm = ScriptedLM(lambda call: {"claims": ["Mara keeps the light."]})


def timed():
    times = []
    with dspy.context(lm=lm, adapter=BooklensAdapter()):
        for i in range(calls + 1):
            start = time.perf_counter()
            program(summary=f"Mara keeps the light on night {i}.")  # a new summary: no cached answer
            times.append(time.perf_counter() - start)
    return times


def down(n):
    return timed() if n <= 0 else down(n - 1)


times = down(depth)
print(json.dumps({"first": times[0], "median": statistics.median(times[1:])}))
"""


def measure(variant: str, calls: int, depth: int) -> dict:
    # From a file, not `python -c`: inspect looks up a frame's module by its file, and for "<string>"
    # it finds none and scans every loaded module again on each call.
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.py"
        probe.write_text(PROBE, encoding="utf-8")
        proc = subprocess.run([sys.executable, str(probe), variant, str(calls), str(depth)], capture_output=True,
                              text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=200, help="timed calls per process, after the first")
    parser.add_argument("--repeat", type=positive_int, default=5,
                        help="fresh processes per variant (medians are shown)")
    args = parser.parse_args()
    print(f"{'stack':<10} {'classes':<10} {'first call':>11} {'each later call':>16}")
    for depth, label in ((0, "shallow"), (60, "60 deep")):
        for variant in ("dspy", "booklens"):
            runs = [measure(variant, args.calls, depth) for _ in range(args.repeat)]
            first = statistics.median(r["first"] for r in runs)
            later = statistics.median(r["median"] for r in runs)
            print(f"{label:<10} {variant:<10} {first * 1000:>9.1f} ms {later * 1000:>13.2f} ms")


if __name__ == "__main__":
    run(main)
