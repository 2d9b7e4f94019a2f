"""The benchmark scripts' command lines: every script's `--help` works, and a bad argument ends in
argparse's usage line and exit code 2 (an error booklens raises, in one `error:` line), never a
traceback. None of these runs a benchmark: each fails at its arguments, before any work."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _cli  # noqa: E402

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))

BAD_ARGUMENTS = [
    ("bench_call_overhead.py", ["--repeat", "0"]),
    ("bench_call_overhead.py", ["--calls", "0"]),
    ("bench_chunking.py", ["--repeat", "0"]),
    ("bench_chunking.py", ["--chunk-size", "-5"]),
    ("bench_coherence_batching.py", ["--limit", "-1"]),
    ("bench_coherence_batching.py", ["--judge", "gpt4"]),
    ("bench_concurrency.py", ["--latency", "0"]),
    ("bench_concurrency.py", ["--sentences", "many"]),
    ("bench_embedded_model.py", ["--configs", "nonsense"]),
    ("bench_embedded_model.py", ["--lengths", "x"]),
    ("bench_embedded_model.py", ["--lengths", "9000"]),
    ("bench_embedded_novel.py", []),  # neither --profile nor --full: nothing to run
    ("bench_embedded_novel.py", ["--profile", "1", "--configs", "after,nonsense"]),
    ("bench_embedded_sequences.py", ["--sequences", "1"]),
    ("bench_embedded_sequences.py", ["--steps", "0"]),
    ("bench_fables_decomposition_threshold.py", ["--examples", "-1"]),
    ("bench_fables_verification.py", ["--batch", "0"]),
    ("bench_fables_verification.py", ["--max-minutes", "soon"]),
    ("bench_grammar_sampler.py", ["--turns", "0"]),
    ("bench_prefix_reuse.py", ["--concurrency", "x"]),
    ("bench_prefix_reuse.py", ["--claims", "0"]),
    ("bench_retrieval.py", ["--k", "0"]),
    ("bench_startup.py", ["--repeat", "0"]),
    ("bench_sweep.py", ["--books", "0"]),
    ("bench_sweep.py", ["--systems", "inc-inc"]),
    ("bench_vs_booookscore.py", ["--answers", "long"]),
]


def run_script(name: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          timeout=120)


def test_every_script_is_covered():
    assert {name for name, _ in BAD_ARGUMENTS} == set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name):
    proc = run_script(name, ["--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name, args", BAD_ARGUMENTS, ids=[f"{n}-{' '.join(a)}" for n, a in BAD_ARGUMENTS])
def test_bad_arguments_end_in_a_usage_error(name, args):
    proc = run_script(name, args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{name}: error: " in proc.stderr.splitlines()[-1]


def test_a_booklens_error_ends_in_one_line(tmp_path):
    # The BooookScore loader refuses a data folder without the annotations.
    proc = run_script("bench_coherence_batching.py", ["--data", str(tmp_path)])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1


def test_argument_types():
    assert _cli.positive_ints("1000, 6000") == [1000, 6000]
    assert _cli.names_from(["a", "b c"])("b c,a") == ["b c", "a"]
    assert _cli.names_from(["a", "b"])("all") == ["a", "b"]
    assert _cli.positive_float("0.5") == 0.5 and _cli.nonnegative_float("0") == 0.0
    for parse, text in ((_cli.positive_int, "0"), (_cli.nonnegative_int, "-1"), (_cli.positive_ints, ","),
                        (_cli.positive_ints, "4,0"), (_cli.names_from(["a"]), "a,z"), (_cli.positive_float, "0"),
                        (_cli.nonnegative_float, "nan"), (_cli.positive_float, "inf")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_booookscore_runs_keep_the_callers_python_path(tmp_path):
    # booookscore installed outside the interpreter's site-packages (found through PYTHONPATH)
    # must still be importable once its package folder is added for its `utils` import
    import bench_vs_booookscore as bench

    env = bench.booookscore_env(tmp_path / "booookscore", {"PYTHONPATH": "/opt/extra", "HOME": "/h"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "booookscore"), "/opt/extra"]
    assert env["HOME"] == "/h"
    assert bench.booookscore_env(tmp_path, {})["PYTHONPATH"] == str(tmp_path)


def test_a_failing_booookscore_step_ends_in_one_line(tmp_path):
    import bench_vs_booookscore as bench
    from booklens.errors import BooklensError

    script = "import sys; print('noise', file=sys.stderr); sys.exit('ModuleNotFoundError: no utils')"
    with pytest.raises(BooklensError, match=r"^booookscore\.chunk failed \(exit 1\): ModuleNotFoundError: no utils$"):
        bench.run_step("booookscore.chunk", [sys.executable, "-c", script], cwd=tmp_path, env=None)
