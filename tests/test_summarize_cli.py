"""`booklens summarize` end to end: bad input, resume after a kill, and the embedded model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from booklens.testing import FakeOpenAIServer, PipelineResponder, run_command

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"


def cli_env(tmp_path, **extra) -> dict[str, str]:
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache"), **extra}
    env.pop("BOOKLENS_LM", None)
    return env


def run_cli(args, tmp_path):
    """`booklens ARGS` in this process (see booklens.testing.run_command), with its own cache."""
    return run_command(args, env=cli_env(tmp_path))


def assert_one_line_error(proc, out: Path, pattern: str):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and pattern in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "make_input, pattern",
    [
        (lambda d: d / "missing.txt", "book not found"),
        (lambda d: _write(d / "empty.txt", b""), "empty"),
        (lambda d: _write(d / "binary.txt", bytes(range(256)) * 40), "binary"),
        (lambda d: _write(d / "latin1.txt", "Caf\xe9 au lait. Tr\xe8s bien.".encode("latin-1") * 50), "UTF-8"),
    ],
    ids=["missing", "empty", "binary", "undecodable"],
)
def test_bad_book_input(tmp_path, make_input, pattern):
    out = tmp_path / "out.json"
    proc = run_cli(["summarize", str(make_input(tmp_path)), "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, pattern)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_chunk_size_the_context_window_cannot_hold(tmp_path):
    out = tmp_path / "out.json"
    proc = run_cli(["summarize", str(STORY), "--chunk-size", "9000", "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "does not fit")


def test_unknown_lm(tmp_path):
    out = tmp_path / "out.json"
    proc = run_cli(["summarize", str(STORY), "--lm", "nosuchprovider-xyz/model", "-o", str(out)], tmp_path)
    assert_one_line_error(proc, out, "unknown model")


def test_missing_api_key(tmp_path):
    out = tmp_path / "out.json"
    env = {k: v for k, v in cli_env(tmp_path).items() if k != "OPENAI_API_KEY"}
    proc = run_command(["summarize", str(STORY), "--lm", "openai/gpt-4o-mini", "-o", str(out)], env=env)
    assert_one_line_error(proc, out, "OPENAI_API_KEY")


def test_an_api_base_without_a_scheme_is_one_line_at_once(tmp_path):
    out = tmp_path / "out.json"
    with FakeOpenAIServer() as server:
        bare = server.url.removeprefix("http://")
        proc = run_cli(["summarize", str(STORY), "--lm", "openai/fake", "--api-base", bare, "-o", str(out)], tmp_path)
        assert server.received == []
    assert_one_line_error(proc, out, f"--api-base needs an http:// or https:// URL such as "
                                     f"http://127.0.0.1:8000/v1 (got '{bare}')")


def one_line_error(proc) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_an_output_that_is_an_input_is_refused_before_any_call(tmp_path):
    book = tmp_path / "book.txt"
    book.write_bytes(STORY.read_bytes())
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light.", encoding="utf-8")
    with FakeOpenAIServer() as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url]
        for args in (["summarize", book, "-o", book], ["summarize", "-o", tmp_path / "." / "book.txt", book],
                     ["score", summary, "-o", summary], ["check", book, summary, "-o", summary]):
            line = one_line_error(run_cli([*args, *lm], tmp_path))
            assert "is also an input of this command" in line and "would overwrite it" in line, line
        assert server.received == []
    assert book.read_bytes() == STORY.read_bytes() and summary.read_text() == "Maren keeps the light."


def test_an_output_over_a_file_of_an_input_folder_or_of_the_lm_cache_is_refused_before_any_call(tmp_path):
    """A folder of data (compile's --data) is read file by file: -o over one of them would replace
    the data, as -o over the cache's database would lose every call made. A file booklens wrote
    there before (an artifact, a record) may be replaced."""
    data = tmp_path / "human"
    data.mkdir()
    annotations = data / "summary-gpt4-4096-inc.json"
    annotations.write_text('{"a-book.epub": {}}', encoding="utf-8")
    cache = tmp_path / "cache"
    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light.", encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url, "--cache-dir", cache]
        line = one_line_error(run_cli(["compile", "coherence", "--data", data, "--optimizer", "labeled",
                                       "-o", annotations, *lm], tmp_path))
        assert line == (f"error: -o {annotations} is a file of the input folder {data}: writing the result there "
                        "would overwrite it; choose an output file outside that folder")
        proc = run_cli(["score", summary, "-o", tmp_path / "scored.json", *lm], tmp_path)
        assert proc.returncode == 0, proc.stderr
        calls = len(server.received)
        line = one_line_error(run_cli(["score", summary, "-o", cache / "calls.sqlite", *lm], tmp_path))
        assert line.startswith(f"error: -o {cache / 'calls.sqlite'} is a file of the LM cache in {cache}")
        assert len(server.received) == calls
        proc = run_cli(["score", summary, "-o", tmp_path / "again.json", *lm], tmp_path)
        assert proc.returncode == 0 and len(server.received) == calls  # the cache kept every call
    from booklens.records import written_by_booklens

    assert annotations.read_text(encoding="utf-8") == '{"a-book.epub": {}}'
    assert written_by_booklens(tmp_path / "scored.json") and not written_by_booklens(annotations)


def test_an_output_through_a_link_or_into_a_pipe_keeps_them(tmp_path):
    """-o through a link replaces the file it names and keeps the link; -o into a pipe (or a device,
    such as /dev/null) writes the result into it instead of putting a file in its place."""
    import os
    import threading

    summary = tmp_path / "summary.txt"
    summary.write_text("Maren keeps the light.", encoding="utf-8")
    target, link, pipe = tmp_path / "target.json", tmp_path / "link.json", tmp_path / "pipe"
    target.write_text("{}", encoding="utf-8")
    link.symlink_to(target)
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url, "--cache-dir", tmp_path / "cache"]
        for out in (link, pipe):
            proc = run_cli(["score", summary, "-o", out, *lm], tmp_path)
            assert proc.returncode == 0, proc.stderr
    reader.join(timeout=60)
    assert link.is_symlink() and json.loads(target.read_text())["kind"] == "booklens.coherence"
    assert pipe.is_fifo() and json.loads(received[0])["kind"] == "booklens.coherence"


def test_a_device_or_a_pipe_given_as_a_book_or_summary_is_one_line(tmp_path):
    """/dev/zero would be read until memory runs out, a pipe with no writer forever: refused at once."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for args, expected in ((["summarize", "/dev/zero"], "error: book is a device or a pipe, not a file: /dev/zero"),
                           (["summarize", pipe], f"error: book is a device or a pipe, not a file: {pipe}"),
                           (["score", pipe], f"error: summary file is a device or a pipe, not a file: {pipe}")):
        proc = subprocess.run([sys.executable, "-m", "booklens", *map(str, args), "-o", str(tmp_path / "out.json"),
                               "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
                              capture_output=True, text=True, timeout=120)
        line = one_line_error(proc)
        assert line.startswith("error: ") and expected in line and "device or a pipe" in line, line
    assert not (tmp_path / "out.json").exists()

def test_an_output_that_cannot_be_a_file_is_refused_before_any_call(tmp_path):
    (tmp_path / "existdir").mkdir()
    (tmp_path / "existfile").write_text("mine")
    with FakeOpenAIServer() as server:
        lm = ["--lm", "openai/fake", "--api-base", server.url]
        line = one_line_error(run_cli(["summarize", STORY, "-o", tmp_path / "existdir", *lm], tmp_path))
        assert line == f"error: -o {tmp_path / 'existdir'} is a directory: give the path of the file to write"
        line = one_line_error(run_cli(["summarize", STORY, "-o", tmp_path / "existfile" / "x.json", *lm], tmp_path))
        assert line == (f"error: cannot write {tmp_path / 'existfile' / 'x.json'}: {tmp_path / 'existfile'} "
                        "is not a directory")
        if Path("/proc/self").is_dir():  # a folder no one may create files in, whatever os.access tells root
            line = one_line_error(run_cli(["summarize", STORY, "-o", "/proc/summary.json", *lm], tmp_path))
            assert line.startswith("error: cannot write /proc/summary.json: /proc"), line
        assert server.received == []
        # Missing folders are made.
        out = tmp_path / "new" / "deeper" / "summary.json"
        proc = run_cli(["summarize", STORY, "-o", out, "--method", "inc", "--chunk-size", "2048", *lm], tmp_path)
        assert proc.returncode == 0 and json.loads(out.read_text())["summary"], proc.stderr
    assert (tmp_path / "existfile").read_text() == "mine" and list((tmp_path / "existdir").iterdir()) == []


BLANK_OUTPUT_COMMANDS = {  # commands that need no LM: they would write at once
    "agree": lambda d: ["agree", _write(d / "a.json", json.dumps(HUMAN_SET).encode()),
                        _write(d / "b.json", json.dumps(HUMAN_SET).encode())],
    "data stats fables": lambda d: ["data", "stats", "fables", "--data",
                                    _write(d / "FABLES.json", json.dumps(FABLES_SET).encode())],
    "summarize": lambda d: ["summarize", STORY, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
}
HUMAN_SET = {"lighthouse": {"summary": "Mara keeps the lamp. Zed comes.", "relations": [], "singles": [
    {"id": "a", "span": "Zed", "questions": "Who is Zed?", "labels": ["entity omission"]}]}}
FABLES_SET = {"FABLES": {"book": {"GPT-4": {"summary": "Mara walks.", "claims": {
    "0": {"claim": "Mara walks.", "label": "Yes", "evidence": ["Mara walked."], "reason": ["r"]}}}}}}


@pytest.mark.parametrize("name", [" ", "  \t", "sub/ "])
@pytest.mark.parametrize("command", list(BLANK_OUTPUT_COMMANDS))
def test_an_output_file_with_a_blank_name_is_refused(tmp_path, command, name, monkeypatch):
    """`-o " "` (a quoted variable holding a space, say) would write a file no one can see in a listing."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    proc = run_cli([*BLANK_OUTPUT_COMMANDS[command](tmp_path), "-o", name], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: -o ") and "no file name" in lines[0], proc.stderr
    assert sorted(p.name for p in work.rglob("*")) == []


@pytest.mark.parametrize("command", list(BLANK_OUTPUT_COMMANDS))
def test_an_empty_output_file_is_refused_as_empty(tmp_path, command, monkeypatch):
    """`-o "$OUT"` with OUT unset was told '-o . is a directory' (the empty path is the current folder)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    proc = run_cli([*BLANK_OUTPUT_COMMANDS[command](tmp_path), "-o", ""], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: -o is empty: name the file to write"), proc.stderr
    assert list(work.iterdir()) == []


def _path_options(names: set[str]):
    """(command path, option) for every option of the CLI spelled as one of `names`."""
    import typer

    from booklens.cli import app

    def walk(command, path):
        for sub_name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, sub_name])
        for param in command.params:
            if set(param.opts) & names:
                yield " ".join(path), param

    return list(walk(typer.main.get_command(app), []))


EMPTY_INPUT_OPTIONS = {"--program", "--data", "--coherence-data", "--fables-data"}


def test_every_empty_program_or_data_option_is_refused_as_empty_options_are():
    """`--program "$ART"` or `--data "$DIR"` with the variable unset read the current folder ('program
    artifact is a directory, not a file: .', 'no BooookScore human annotation files (summary-*.json)
    in .'); they are refused as `-o ""` is: the option is empty, name what it reads."""
    from booklens.errors import BooklensError

    found = _path_options(EMPTY_INPUT_OPTIONS)
    assert {option for _, param in found for option in param.opts} >= {"--program", "--data"}
    assert len(found) >= 10, [(command, param.opts) for command, param in found]
    for command, param in found:
        option = next(o for o in param.opts if o.startswith("--"))
        parse = param.type_descriptor.parameter_info.parser  # the value's parser, as the option was declared
        assert parse is not None, (command, option)
        with pytest.raises(BooklensError) as caught:
            parse("")
        assert str(caught.value).startswith(f"{option} is empty: name the "), (command, str(caught.value))


@pytest.mark.parametrize("args, option", [
    (["summarize", STORY, "--program", ""], "--program"),
    (["run", STORY, "-o", "run", "--program", ""], "--program"),
    (["evaluate", "coherence", "--data", ""], "--data"),
    (["data", "stats", "fables", "--data", ""], "--data"),
], ids=["summarize", "run", "evaluate", "data-stats-fables"])
def test_an_empty_program_or_data_option_is_one_line_naming_it(tmp_path, args, option, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    proc = run_cli([*args, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"]
                   if args[0] in ("summarize", "run") else args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {option} is empty: name the "), proc.stderr
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("name", ["", " "])
@pytest.mark.parametrize("command", [["run", STORY], ["sweep", REPO / "examples" / "sweep.yaml"],
                                     ["judges", "build"]], ids=["run", "sweep", "judges-build"])
def test_an_empty_output_folder_is_refused_not_taken_for_the_current_one(tmp_path, command, name, monkeypatch):
    """`-o "$DIR"` with DIR unset: the run, sweep or judges would be written into the current folder."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    lm = [] if command[0] == "judges" else ["--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"]
    proc = run_cli([*command, *lm, "-o", name], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: -o is empty"), proc.stderr
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("command", [
    lambda d, long: ["summarize", long, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
    lambda d, long: ["score", STORY, "--book", long, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
    lambda d, long: ["report", long],
    lambda d, long: ["sweep", long, "-o", d / "sweep", "--dry-run"],
    lambda d, long: ["run", STORY, "-o", long, "--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"],
    lambda d, long: ["data", "stats", "fables", "--data", long],
    lambda d, long: ["judges", "build", "-o", long],
], ids=["summarize-book", "score-book", "report", "sweep-manifest", "run-output", "fables-data", "judges-output"])
def test_a_path_whose_name_the_file_system_refuses_is_a_user_error(tmp_path, command):
    """A file name longer than the file system takes (255 bytes) ended in 'internal error: OSError'
    (exit 1, with the hint to rerun for a traceback) from the first check of whether the file exists."""
    long = tmp_path / ("n" * 300 + ".txt")
    proc = run_cli(command(tmp_path, long), tmp_path)
    line = one_line_error(proc)
    assert "internal error" not in line and "File name too long" in line and str(long) in line, line


def test_killed_run_resumes_without_repeating_finished_calls(tmp_path):
    out = tmp_path / "summary.json"
    args = [sys.executable, "-m", "booklens", "summarize", str(STORY), "--method", "inc", "--chunk-size", "512",
            "--max-summary-tokens", "200", "--lm", "openai/fake-model", "--concurrency", "1", "-o", str(out)]
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    with FakeOpenAIServer(latency=0.3) as server:
        proc = subprocess.Popen([*args, "--api-base", server.url], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        # Kill while the 4th call is in flight: with concurrency 1 the client sends it only after
        # it has received (and cached) the 3rd answer, so its arrival is the signal.
        while not (len(server.received) >= 4 and len(server.served) == 3) and time.time() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first_run = [json.dumps(b["messages"], sort_keys=True) for b in server.served]
        assert len(first_run) >= 3 and not out.exists()
        served_before = len(server.served)
        rerun = run_command([*args[3:], "--api-base", server.url], env=env)
        assert rerun.returncode == 0, rerun.stderr
        second_run = [json.dumps(b["messages"], sort_keys=True) for b in server.served[served_before:]]
    assert second_run, "the rerun had calls left to make"
    assert not set(first_run) & set(second_run), "a call that had finished was made again"
    record = json.loads(out.read_text())
    assert record["usage"]["cached_calls"] >= len(set(first_run))
    assert record["summary"]
    # A remote model's summaries are capped at 1.5 G + 64, and the record says so.
    assert (record["config"]["generation_slack"], record["config"]["generation_allowance"]) == (1.5, 64)


def test_no_usable_summary_is_not_kept_so_a_rerun_asks_again(tmp_path):
    """Answers without a word are dropped from the cache when the command stops on them: a plain
    rerun (after the server is fixed, say) asks again, and more regenerations make more tries."""
    out = tmp_path / "summary.json"
    with FakeOpenAIServer(responder=lambda body: "1234") as server:
        args = ["summarize", str(STORY), "--lm", "openai/fake", "--api-base", server.url, "-o", str(out)]
        proc = run_cli([*args, "--max-regenerations", "1"], tmp_path)
        assert_one_line_error(proc, out, "no usable summary for level 1 summary 0 in 3 tries (answers without a "
                                         "word, such as '1234', not kept: a rerun asks again)")
        assert "--max-regenerations above 2" in proc.stderr
        first = len(server.served)
        rerun = run_cli([*args, "--max-regenerations", "1"], tmp_path)
        assert len(server.served) == 2 * first, "a plain rerun asks again"
        more = run_cli([*args, "--max-regenerations", "4"], tmp_path)
        assert len(server.served) == 2 * first + 5, "five tries, all new calls"
    assert rerun.returncode == more.returncode == 2


def test_empty_answers_are_asked_again_by_a_plain_rerun(tmp_path):
    """An empty answer is not cached (a provider's glitch should not stick): the error says a rerun
    asks again, and it does."""
    out = tmp_path / "summary.json"
    with FakeOpenAIServer(responder=lambda body: "") as server:
        args = ["summarize", str(STORY), "--lm", "openai/fake", "--api-base", server.url, "-o", str(out),
                "--max-regenerations", "1"]
        proc = run_cli(args, tmp_path)
        assert_one_line_error(proc, out, "in 3 tries (only empty answers, not kept: a rerun asks again)")
        first = len(server.served)
        assert run_cli(args, tmp_path).returncode == 2 and len(server.served) == 2 * first


@pytest.mark.embedded
def test_summarize_sample_story_with_the_embedded_model(tmp_path, story_opening):
    out = tmp_path / "summary.json"
    # The story's first twelve paragraphs (about 540 tokens) with small chunks, window and budgets, so
    # the model makes few short calls and still builds a real merge tree: three 192-token chunks, two
    # level-1 groups and a level-2 merge.
    book = tmp_path / "beginning.txt"
    book.write_text("\n\n".join(story_opening.read_text(encoding="utf-8").split("\n\n")[:12]), encoding="utf-8")
    proc = run_cli(["summarize", str(book), "--chunk-size", "192", "--context-window", "768",
                    "--max-summary-tokens", "48", "--max-regenerations", "0", "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["kind"] == "booklens.summary" and record["method"] == "hier"
    # A 135M model writing to a 48-token budget: what it writes varies in length; that it writes is the point.
    assert len(record["summary"].split()) >= 5
    assert record["lm"].startswith("local/")
    assert record["usage"]["calls"] >= 3
    assert record["usage"]["cost_usd"] == 0.0  # the embedded model's calls are free, a known price
    # The embedded model's cap is its budget in its own tokens, recorded with the summary.
    assert (record["config"]["generation_slack"], record["config"]["generation_allowance"]) == (1.06, 8)
    levels = [n["level"] for n in record["nodes"]]
    assert levels.count(1) >= 2 and 2 in levels
    assert record["nodes"][-1]["chunks"] == [c["index"] for c in record["chunks"]]


def test_a_book_whose_file_name_is_not_utf8_is_summarized_and_named_in_the_record(tmp_path):
    """A Latin-1 file name reaches Python with its byte as a lone surrogate: writing the record, after
    every LM call, was an internal error. The record names the book by a JSON escape that reads back
    as the same path, in a file or on stdout."""
    book = tmp_path / os.fsdecode(b"caf\xe9.txt")
    book.write_bytes(STORY.read_bytes())
    out = tmp_path / "summary.json"
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        args = ["summarize", str(book), "--lm", "openai/fake", "--api-base", server.url, "--keep-artifacts"]
        proc = run_cli([*args, "-o", str(out)], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(out.read_text(encoding="utf-8"))["book"] == str(book)
        printed = subprocess.run([sys.executable, "-m", "booklens", *args], capture_output=True,
                                 env={**cli_env(tmp_path), "PYTHONIOENCODING": "utf-8"})
    assert printed.returncode == 0, printed.stderr.decode()
    assert json.loads(printed.stdout.decode("utf-8")) == json.loads(out.read_text(encoding="utf-8")) | {
        "timings": json.loads(printed.stdout.decode("utf-8"))["timings"],
        "usage": json.loads(printed.stdout.decode("utf-8"))["usage"]}


LM = ["--lm", "openai/fake", "--api-base", "http://127.0.0.1:9/v1"]
PATH_COMMANDS = {  # each command's path arguments, one at a time: `bad` where the others are good
    "summarize-book": lambda d, bad: ["summarize", bad, *LM, "-o", d / "out.json"],
    "summarize-output": lambda d, bad: ["summarize", STORY, *LM, "-o", bad],
    "summarize-output-folder": lambda d, bad: ["summarize", STORY, *LM, "-o", bad / "out.json"],
    "score-summary": lambda d, bad: ["score", bad, *LM],
    "claims-summary": lambda d, bad: ["claims", bad, *LM],
    "verify-claims": lambda d, bad: ["verify", "--claims", bad, "--book", STORY, *LM],
    "verify-book": lambda d, bad: ["verify", "--claims", _write(d / "c.json", b'["Anna sails."]'), "--book", bad, *LM],
    "check-book": lambda d, bad: ["check", bad, _write(d / "s.txt", b"Anna sails."), *LM],
    "check-summary": lambda d, bad: ["check", STORY, bad, *LM],
    "run-book": lambda d, bad: ["run", bad, *LM, "-o", d / "run"],
    "run-summary": lambda d, bad: ["run", STORY, "--summary", bad, *LM, "-o", d / "run"],
    "run-output": lambda d, bad: ["run", STORY, *LM, "-o", bad],
    "run-output-folder": lambda d, bad: ["run", STORY, *LM, "-o", bad / "run"],
    "qa-book": lambda d, bad: ["qa", bad, "--questions", _write(d / "q.json", json.dumps([QUESTION]).encode()), *LM],
    "qa-questions": lambda d, bad: ["qa", STORY, "--questions", bad, *LM],
    "diverse-events": lambda d, bad: ["diverse", bad, *LM],
    "judge-events": lambda d, bad: ["judge", bad, _write(d / "s.json", b'{"e1": "x"}'), *LM],
    "sweep-manifest": lambda d, bad: ["sweep", bad, "-o", d / "sweep", "--dry-run"],
    "sweep-output": lambda d, bad: ["sweep", REPO / "examples" / "sweep.yaml", "-o", bad, "--dry-run"],
    "report": lambda d, bad: ["report", bad],
    "judges-build-output": lambda d, bad: ["judges", "build", "-o", bad],
    "fables-data": lambda d, bad: ["data", "stats", "fables", "--data", bad],
    "program": lambda d, bad: ["verify", "--claims", _write(d / "c.json", b'["Anna sails."]'), "--book", STORY,
                                "--program", bad, *LM],
}
QUESTION = {"QID": "T-1", "Question": "Which?", "Options": {"A": "a", "B": "b", "C": "c", "D": "d"}, "Answer": "a",
            "Gold": "A", "Evidences": [], "Aspect": "plot", "Complexity": "sh"}


@pytest.mark.parametrize("command", list(PATH_COMMANDS))
def test_a_symbolic_link_loop_is_named_as_one_not_as_a_missing_file(tmp_path, command):
    """A link that leads back to itself was reported 'not found' (Path.exists() says no), and as an
    output it passed the checks and failed only when the result was written, after every LM call."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    proc = run_cli(PATH_COMMANDS[command](tmp_path, loop), tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{loop}" in line and "Too many levels of symbolic links" in line and "not found" not in line, line
    assert loop.is_symlink()


@pytest.mark.parametrize("command", [c for c in PATH_COMMANDS if "output" not in c and c != "report"])
def test_a_folder_given_where_a_file_is_read_is_one_line(tmp_path, command):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "inside.txt").write_text("Anna sails.")
    proc = run_cli(PATH_COMMANDS[command](tmp_path, folder), tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{folder}" in line and ("is a directory" in line or "holds no" in line or "FABLES" in line), line


def test_a_book_of_only_punctuation_is_named_as_an_empty_one_is(tmp_path):
    """A book of punctuation and symbols alone gave 'the book has no text to summarize' (or to
    index) without naming the file; it is refused as a book of whitespace is, naming it."""
    summary = _write(tmp_path / "summary.txt", b"Mara keeps the lighthouse.")
    claims = _write(tmp_path / "claims.json", b'["Mara keeps the lighthouse."]')
    for name, data in (("blank.txt", b"  \n\n\t\n"), ("symbols.txt", b"* * *\n\n--- ... ---\n\n!!! ???\n")):
        book = _write(tmp_path / name, data)
        out = tmp_path / "out.json"
        for args in (["summarize", str(book), "-o", str(out)],
                     ["run", str(book), "-o", str(tmp_path / "run")],
                     ["run", str(book), "--summary", str(summary), "-o", str(tmp_path / "run")],
                     ["check", str(book), str(summary), "-o", str(out)],
                     ["verify", "--book", str(book), "--claims", str(claims), "--evidence", "bm25", "-o", str(out)]):
            proc = run_cli(args, tmp_path)
            assert_one_line_error(proc, out, f"error: {book} contains no text")
            assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("method, concurrency", [("hier", 1), ("hier", 3), ("inc", 1)])
def test_a_backend_that_rejects_a_call_stops_the_run_and_a_rerun_asks_only_the_missing_calls(tmp_path, method,
                                                                                           concurrency):
    """Call 5 rejected (HTTP 400): one line, and every answer that came back before (or alongside, with
    calls in flight) stays in the cache, so the rerun makes exactly the calls an uninterrupted run makes
    less those, and writes the same summary."""
    import threading

    from booklens.testing import Reply

    responder, lock, count, failing = PipelineResponder(), threading.Lock(), [0], [5]

    def respond(body):
        with lock:
            count[0] += 1
            rejected = count[0] in failing
        return Reply(status=400, error="request rejected") if rejected else responder(body)

    with FakeOpenAIServer(responder=respond) as server:
        def summarize(cache: str, out: Path):
            env = {**cli_env(tmp_path), "BOOKLENS_CACHE_DIR": str(tmp_path / cache)}
            return run_command(["summarize", str(STORY), "--method", method, "--chunk-size", "256",
                                "--context-window", "1024", "--max-summary-tokens", "100", "--concurrency",
                                concurrency, "--lm", "openai/fake", "--api-base", server.url, "-o", out], env=env)

        stopped = summarize("cache", tmp_path / "summary.json")
        assert_one_line_error(stopped, tmp_path / "summary.json", "rejected the request: request rejected")
        answered = len(server.served)
        failing.clear()
        resumed = summarize("cache", tmp_path / "summary.json")
        rerun_calls = len(server.served) - answered
        whole = summarize("fresh", tmp_path / "whole.json")
        whole_calls = len(server.served) - answered - rerun_calls
    assert resumed.returncode == whole.returncode == 0, resumed.stderr + whole.stderr
    assert answered >= 4 and rerun_calls == whole_calls - answered > 0
    record, reference = (json.loads((tmp_path / name).read_text()) for name in ("summary.json", "whole.json"))
    assert record["summary"] == reference["summary"] and record["usage"]["cached_calls"] == answered


def llama_cpp_overflow(window: int):
    """A responder that answers as llama-cpp-python's server started with `-c WINDOW` does to every
    request: its 400, in its words (the prompt counted as a quarter of its characters)."""
    from booklens.testing import Reply

    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        wanted = body.get("max_tokens") or 0
        return Reply(status=400, error=f"This model's maximum context length is {window} tokens. However, you "
                                       f"requested {prompt + wanted} tokens ({prompt} in the messages, {wanted} in "
                                       "the completion). Please reduce the length of the messages or completion.")
    return respond


def test_a_server_window_smaller_than_the_one_planned_for_names_context_window(tmp_path):
    """A self-hosted server's window is unknown, so the summarizer plans for 8192 tokens; a server
    started with a smaller one (llama.cpp's -c 2048) refuses the prompts: the line says which option
    plans for the server's window, not only to use smaller inputs."""
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=llama_cpp_overflow(2048)) as server:
        proc = run_cli(["summarize", str(STORY), "--lm", "openai/fake", "--api-base", server.url, "-o", str(out)],
                       tmp_path)
    line = one_line_error(proc)
    assert line.endswith("do not fit the 2048-token context window of 'openai/fake': the summarizer plans for a "
                         "8192-token window; set --context-window to 2048 or less (at 2048: --max-summary-tokens to "
                         "499 or less and --chunk-size to 1021 or less)"), line
    assert not out.exists()


@pytest.mark.parametrize("window, advice", [
    (512, ": the summarizer plans for a 8192-token window; set --context-window to 512 or less (at 512: "
          "--max-summary-tokens to 64 or less and --chunk-size to 151 or less)"),
    (256, ": the summarizer holds no chunk and summary in 256 tokens beside its prompt; use a model or server with "
          "a larger context"),
])
def test_a_server_window_the_settings_do_not_fit_names_what_they_need_there_too(tmp_path, window, advice):
    """llama-cpp-python's server with `--n_ctx 512` refused the first prompt and the line said to set
    --context-window to 512 or less; with it, the check before any call said to set --max-summary-tokens
    and --chunk-size too, or raise --context-window (which the server would refuse). The first line now
    names all of them, or, where no chunk fits, that the window is too small."""
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=llama_cpp_overflow(window)) as server:
        proc = run_cli(["summarize", str(STORY), "--lm", "openai/fake", "--api-base", server.url, "-o", str(out)],
                       tmp_path)
        assert len(server.received) == 1
    line = one_line_error(proc)
    assert line.startswith("error: the prompt (") and line.endswith(
        f"do not fit the {window}-token context window of 'openai/fake'{advice}"), line
    assert not out.exists()
