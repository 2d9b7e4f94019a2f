"""Start-up of the command line: `booklens --help` and a one-line argument error, against a bare
typer app with as many commands and options and the same plain help layout (the floor any typer
CLI pays), in one run.

    python benchmarks/bench_startup.py [--repeat 15]

Prints the median wall-clock and CPU seconds of each, and the ratio to the bare app (target: at
most 2x). Each measurement is a fresh process, as a user's shell would start it.

Then what every LM command pays on top: a fresh Python importing booklens's LM layer (DSPy and
LiteLLM) and exiting, with Python's garbage-collector settings against the command's own
(`booklens.collector.GC_THRESHOLD` while it runs, the heap frozen at exit).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _cli import positive_int, run


def command_shape() -> list[tuple[str, int]]:
    """(command path, number of parameters) of every booklens command, to mirror in the bare app."""
    import typer.main

    from booklens.cli import app

    shape = []
    group = typer.main.get_command(app)

    def walk(command, prefix: str) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            path = f"{prefix} {name}".strip()
            if getattr(sub, "commands", None):
                walk(sub, path)
            else:
                shape.append((path, len(sub.params)))

    walk(group, "")
    return shape


def bare_app_source(shape: list[tuple[str, int]]) -> str:
    settings = "no_args_is_help=True, rich_markup_mode=None"  # as booklens.cli.common.command_group
    lines = ["import typer", f"app = typer.Typer(add_completion=False, {settings})", "groups = {}"]
    for i, (path, params) in enumerate(shape):
        parts = path.split()
        target = "app"
        for depth in range(len(parts) - 1):
            key = " ".join(parts[: depth + 1])
            lines.append(f"if {key!r} not in groups:\n    groups[{key!r}] = typer.Typer({settings})\n"
                         f"    {target}.add_typer(groups[{key!r}], name={parts[depth]!r})")
            target = f"groups[{key!r}]"
        options = ", ".join(f"o{j}: str = typer.Option('x', help='option {j}')" for j in range(params))
        lines.append(f"@{target}.command({parts[-1]!r})\ndef c{i}({options}):\n    'A command.'\n")
    lines.append("app()")
    return "\n".join(lines)


def timed(args: list[str], repeat: int, env: dict[str, str], *, succeeds: bool = True) -> tuple[float, float]:
    """Median wall-clock and CPU (user + system, children) seconds of `repeat` fresh processes.
    A process that crashed (a traceback), or that failed where it should succeed, ends the benchmark:
    its time would be that of the crash."""
    walls, cpus = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, env=env, check=False)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if b"Traceback" in proc.stderr or (proc.returncode == 0) != succeeds:
            stderr = proc.stderr.decode(errors="replace")[-2000:]
            sys.exit(f"error: {' '.join(args)} exited with {proc.returncode}"
                     f"{'' if succeeds else ' (an error was expected)'}:\n{stderr}")
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive_int, default=15, help="fresh processes per start-up row")
    parser.add_argument("--lm-repeat", type=positive_int, default=7, help="fresh processes per LM-layer row")
    options = parser.parse_args()
    shape = command_shape()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare_app.py"
        bare.write_text(bare_app_source(shape))
        rows = [
            ("bare typer app --help", [sys.executable, str(bare), "--help"]),
            ("booklens --help", [sys.executable, "-m", "booklens", "--help"]),
            ("bare typer app, unknown option", [sys.executable, str(bare), "--nonsense"]),
            ("booklens run missing.txt -o out", [sys.executable, "-m", "booklens", "run", "missing.txt", "-o",
                                                 str(Path(tmp) / "out")]),
        ]
        results = {name: timed(args, options.repeat, env, succeeds=name.endswith("--help")) for name, args in rows}
    print(f"{len(shape)} commands, {sum(p for _, p in shape)} parameters; median of {options.repeat} fresh processes;"
          f" load average {os.getloadavg()[0]:.2f}")
    base_wall, base_cpu = results["bare typer app --help"]
    error_wall = results["bare typer app, unknown option"][0]
    for name, (wall, cpu) in results.items():
        peer = f"; {wall / error_wall:.2f}x the bare app's error" if name.startswith("booklens run") else ""
        print(f"  {name:36s} {wall:6.3f} s wall  {cpu:6.3f} s cpu  {wall / base_wall:5.2f}x the bare --help{peer}")

    import_lm = "import booklens.lm.model"
    lm_rows = [
        ("Python's collector settings", [sys.executable, "-c", import_lm]),
        ("a young collection every 10,000", [sys.executable, "-c", (
            "from booklens.collector import collect_less_often, freeze_what_is_loaded; collect_less_often(); "
            f"{import_lm}; freeze_what_is_loaded()")]),
        ("the command's (booklens.cli.main)", [sys.executable, "-c", (
            "from booklens.collector import defer_collection, freeze_what_is_loaded; defer_collection(); "
            f"{import_lm}; freeze_what_is_loaded()")]),
    ]
    lm_results = {name: timed(args, options.lm_repeat, env) for name, args in lm_rows}
    print(f"\nImport the LM layer (DSPy, LiteLLM) and exit; median of {options.lm_repeat} fresh processes;"
          f" load average {os.getloadavg()[0]:.2f}")
    for name, (wall, cpu) in lm_results.items():
        print(f"  {name:36s} {wall:6.3f} s wall  {cpu:6.3f} s cpu")


if __name__ == "__main__":
    run(main)
