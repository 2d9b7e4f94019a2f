"""The context window of a self-hosted server: asked of the server where it says it (vLLM's model
list, llama.cpp's /props), given with the judges' `--context-window` where it does not
(llama-cpp-python's server), and named in the line a refused prompt gives."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from booklens.lm import LiteLLMBackend, make_lm
from booklens.testing import FakeOpenAIServer, Reply, run_command

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
# What llama-server (b1-0c1e570) started with `-c 2048` states: 4 slots by default, sharing the 2048 tokens.
LLAMA_CPP_PROPS = {"/props": {"default_generation_settings": {"n_ctx": 2048, "params": {}}, "total_slots": 4,
                              "model_alias": "smol", "build_info": "b1-0c1e570"}}
# A claim with quotes long enough that the evidence planned for an 8192-token window overflows 2048.
LONG_QUOTES = [{"claim": "Mara lit the lamp.", "evidence": [" ".join(["The lamp burned over the harbour."] * 700)]}]


def backend_for(server: FakeOpenAIServer, model: str = "openai/fake-model") -> LiteLLMBackend:
    return LiteLLMBackend(model, api_base=server.url)


def run_here(args, tmp_path):
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_LM", None)
    return run_command([str(a) for a in args], env=env)


def one_line_error(proc) -> str:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def overflow_at(window: int):
    """A server with a `window`-token context, refusing a longer request in llama-cpp-python's words
    (the prompt counted as a quarter of its characters)."""
    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        wanted = body.get("max_tokens") or 0
        if prompt + wanted <= window:
            return Reply(status=500, error="not expected to fit")
        return Reply(status=400, error=f"Requested tokens ({prompt + wanted}) exceed context window of {window}")
    return respond


def test_a_vllm_server_states_the_window_of_the_model_asked_for():
    pages = {"/v1/models": {"object": "list", "data": [{"id": "other", "max_model_len": 4096},
                                                       {"id": "fake-model", "max_model_len": 16384}]}}
    with FakeOpenAIServer(pages=pages) as server:
        assert backend_for(server).context_window == 16384
        assert server.fetched == ["/v1/models"]
        assert server.received == []  # a question, not a completion


def test_a_llama_cpp_server_states_its_per_slot_window_in_props():
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        assert backend_for(server).context_window == 2048
        assert server.fetched == ["/v1/models", "/props"]  # /props beside /v1, not in it


def test_a_text_generation_inference_server_states_its_window_in_info():
    pages = {"/info": {"model_id": "fake", "max_input_tokens": 3000, "max_total_tokens": 4096}}
    with FakeOpenAIServer(pages=pages) as server:
        assert backend_for(server).context_window == 4096  # the prompt and its answer
        assert server.fetched == ["/v1/models", "/props", "/info"]


def lm_studio(*instances: tuple[str, int], key: str = "google/gemma-4-26b-a4b") -> dict:
    """LM Studio's native model list (`GET /api/v1/models`, beside /v1): the model `key` with its loaded
    `instances` (id, context_length) beside another model that is not loaded."""
    loaded = [{"id": id_, "config": {"context_length": length, "eval_batch_size": 512, "parallel": 4}}
              for id_, length in instances]
    return {"/api/v1/models": {"models": [
        {"type": "llm", "key": key, "loaded_instances": loaded, "max_context_length": 262144},
        {"type": "llm", "key": "deepseek-r1", "loaded_instances": [], "max_context_length": 131072}]}}


def test_lm_studio_states_the_window_its_loaded_instance_has_not_the_models():
    """LM Studio loads a model with a small default window (4096) whatever the model supports."""
    with FakeOpenAIServer(pages=lm_studio(("google/gemma-4-26b-a4b", 4096))) as server:
        assert backend_for(server, "openai/google/gemma-4-26b-a4b").context_window == 4096
        assert server.fetched == ["/v1/models", "/props", "/info", "/api/v1/models"]  # beside /v1, not in it


def test_lm_studio_names_a_loaded_instance_by_its_id_and_the_smallest_window_is_taken():
    pages = lm_studio(("google/gemma-4-26b-a4b", 8192), ("google/gemma-4-26b-a4b:2", 6144))
    with FakeOpenAIServer(pages=pages) as server:
        assert backend_for(server, "openai/google/gemma-4-26b-a4b:2").context_window == 6144
        assert backend_for(server, "openai/google/gemma-4-26b-a4b").context_window == 6144  # either may serve it


def test_lm_studio_matches_the_model_key_when_its_instance_has_another_id():
    with FakeOpenAIServer(pages=lm_studio(("gemma-instance", 4096))) as server:
        assert backend_for(server, "openai/google/gemma-4-26b-a4b").context_window == 4096
        assert backend_for(server, "openai/gemma-instance").context_window == 4096


def test_an_lm_studio_model_not_loaded_has_no_known_window():
    """It is loaded on demand with a default window it does not state; its `max_context_length` is
    what it could be loaded with, not what it will be."""
    with FakeOpenAIServer(pages=lm_studio(("google/gemma-4-26b-a4b", 4096))) as server:
        assert backend_for(server, "openai/deepseek-r1").context_window is None
        assert backend_for(server, "openai/unlisted").context_window is None


@pytest.mark.parametrize("length", [0, -1, "4096", 4096.0, True, None])
def test_an_lm_studio_window_that_is_not_a_whole_number_above_zero_is_not_taken(length):
    with FakeOpenAIServer(pages=lm_studio(("google/gemma-4-26b-a4b", length))) as server:
        assert backend_for(server, "openai/google/gemma-4-26b-a4b").context_window is None


def test_a_server_that_states_its_window_in_its_model_list_is_not_asked_lm_studios_route():
    pages = {"/v1/models": {"object": "list", "data": [{"id": "fake-model", "max_model_len": 16384}]},
             **lm_studio(("fake-model", 4096), key="fake-model")}
    with FakeOpenAIServer(pages=pages) as server:
        assert backend_for(server).context_window == 16384
        assert server.fetched == ["/v1/models"]


def test_the_window_is_asked_once_per_server_and_model():
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        first, second = backend_for(server), backend_for(server)
        assert [first.context_window, second.context_window, first.context_window] == [2048, 2048, 2048]
        assert len(server.fetched) == 2
        assert backend_for(server, "openai/other-model").context_window == 2048
        assert len(server.fetched) == 4


@pytest.mark.parametrize("n_ctx", [0, -1, "2048", 2048.0, True, None])
def test_a_window_that_is_not_a_whole_number_above_zero_is_not_taken(n_ctx):
    with FakeOpenAIServer(pages={"/props": {"default_generation_settings": {"n_ctx": n_ctx}}}) as server:
        assert backend_for(server).context_window is None


def test_a_server_that_states_no_window_leaves_it_unknown():
    """llama-cpp-python's server lists its models without a window and has no /props or /info."""
    with FakeOpenAIServer() as server:
        lm = make_lm("openai/fake", api_base=server.url, use_cache=False)
        assert lm.context_window is None
        assert server.fetched == ["/v1/models", "/props", "/info", "/api/v1/models"]


def test_ollama_is_not_asked_it_is_sent_the_window_to_use():
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        backend = LiteLLMBackend("ollama_chat/fake", api_base=server.url.removesuffix("/v1"))
        backend.context_window
        assert server.fetched == []


def test_a_given_window_is_what_the_judges_plan_for_and_may_not_exceed_the_models(tmp_path):
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        assert make_lm("openai/fake", api_base=server.url, use_cache=False, context_window=1024).context_window == 1024
        lm = make_lm("openai/fake", api_base=server.url, use_cache=False, context_window=1024)
        assert lm.view().context_window == 1024  # a program's copy plans the same
        with pytest.raises(Exception) as refused:
            make_lm("openai/fake", api_base=server.url, use_cache=False, context_window=4096)
        assert str(refused.value) == ("context_window 4096 is larger than this model's 2048: set context_window "
                                      "to 2048 or less")  # make_lm's keyword


# The default five passages of 256 tokens at 2048 tokens: too many even beside no demo.
FIVE_PASSAGES_AT_2048 = ("error: --k 5 passages of up to --passage-tokens 256 tokens: 1280 tokens of evidence per claim, "
                         "more than the 733 that fit beside the judge's answer and prompt in its 2048-token context "
                         "window; lower --k to 2 or less or --passage-tokens to 146 or less")


def test_verify_plans_for_the_window_the_server_states(tmp_path):
    """Five passages of 256 tokens do not fit the 2048 tokens llama.cpp says it has, even beside no
    demo: one line naming the settings, before any call."""
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara lit the lamp."]))
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        proc = run_here(["verify", "--claims", claims, "--book", STORY, "--evidence", "bm25", "--lm", "openai/fake",
                         "--api-base", server.url], tmp_path)
    line = one_line_error(proc)
    assert line == FIVE_PASSAGES_AT_2048
    assert server.received == []


def test_verify_plans_for_a_given_context_window(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara lit the lamp."]))
    with FakeOpenAIServer() as server:
        proc = run_here(["verify", "--claims", claims, "--book", STORY, "--evidence", "bm25", "--lm", "openai/fake",
                         "--api-base", server.url, "--context-window", "2048"], tmp_path)
    line = one_line_error(proc)
    assert line == FIVE_PASSAGES_AT_2048
    assert server.received == []


@pytest.mark.parametrize("command", [
    lambda claims, summary: ["verify", "--claims", claims, "--evidence", "given"],
    # the few-shot judge, on a short summary: with fewer demos it fits 2048 tokens (a summary that does
    # not fit even with none gets the line of `test_score_on_a_server_whose_window_holds_no_judgment...`)
    lambda claims, summary: ["score", summary.with_name("short.txt"), "--tries", "1"],
])
def test_a_refused_prompt_names_the_judges_context_window_option(tmp_path, command):
    """A server that states no window is planned for with 8192 tokens; when it refuses a prompt as
    too long for its 2048, the line says which option plans for that."""
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(LONG_QUOTES))
    summary = tmp_path / "summary.txt"
    summary.write_text(" ".join(["Mara lit the lamp over the harbour and waited for the boats."] * 180))
    (tmp_path / "short.txt").write_text("Mara lit the lamp over the harbour. She waited for the boats.\n")
    with FakeOpenAIServer(responder=overflow_at(2048)) as server:
        proc = run_here([*command(claims, summary), "--lm", "openai/fake", "--api-base", server.url, "--concurrency",
                         "1"], tmp_path)
    line = one_line_error(proc)
    assert line.endswith("fit the 2048-token context window of 'openai/fake': the judge plans for a 8192-token "
                         "window; set --context-window to 2048 or less"), line
    assert len(server.received) == 1


def test_a_decomposition_too_long_for_the_server_is_not_told_to_set_the_judges_window(tmp_path):
    """The decomposer sends the whole summary whatever the window: a smaller one would not help."""
    summary = tmp_path / "summary.txt"
    summary.write_text(" ".join(["Mara lit the lamp over the harbour and waited for the boats."] * 180))
    with FakeOpenAIServer(responder=overflow_at(2048)) as server:
        proc = run_here(["check", STORY, summary, "--evidence", "none", "--lm", "openai/fake", "--api-base",
                         server.url], tmp_path)
    line = one_line_error(proc)
    assert "context-window" not in line and "fit the 2048-token context window" in line, line


def test_summarize_refuses_the_default_window_a_server_says_it_does_not_have(tmp_path):
    with FakeOpenAIServer(pages=LLAMA_CPP_PROPS) as server:
        proc = run_here(["summarize", STORY, "--lm", "openai/fake", "--api-base", server.url], tmp_path)
    assert one_line_error(proc) == ("error: the default context window 8192 is larger than this model's 2048: set "
                                    "--context-window to 2048 or less")
    assert server.received == []


def test_summarize_refuses_the_default_window_lm_studio_loaded_its_model_without(tmp_path):
    with FakeOpenAIServer(pages=lm_studio(("google/gemma-4-26b-a4b", 4096))) as server:
        proc = run_here(["summarize", STORY, "--lm", "openai/google/gemma-4-26b-a4b", "--api-base", server.url],
                        tmp_path)
    assert one_line_error(proc) == ("error: the default context window 8192 is larger than this model's 4096: set "
                                    "--context-window to 4096 or less")
    assert server.received == []


def test_a_context_window_larger_than_the_embedded_models_is_refused(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara lit the lamp."]))
    proc = run_here(["verify", "--claims", claims, "--evidence", "none", "--context-window", "16384"], tmp_path)
    assert one_line_error(proc) == ("error: --context-window 16384 is larger than this model's 8192: set "
                                    "--context-window to 8192 or less")


def judged_within(window: int):
    """Plausible answers for every step, for prompts that fit `window` tokens; longer ones refused as
    llama-cpp-python's server refuses them."""
    from booklens.testing import PipelineResponder

    answer, refuse = PipelineResponder(), overflow_at(window)

    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        return answer(body) if prompt + (body.get("max_tokens") or 0) <= window else refuse(body)
    return respond


def test_runs_judges_plan_for_the_judge_context_window_not_the_summarizers(tmp_path):
    summary = tmp_path / "summary.txt"
    summary.write_text("Mara kept the light. The boats came home.", encoding="utf-8")
    args = ["run", STORY, "--summary", summary, "--evidence", "book", "--lm", "openai/fake", "--concurrency", "1"]
    with FakeOpenAIServer(responder=judged_within(3072)) as server:
        failed = run_here([*args, "--api-base", server.url, "-o", tmp_path / "first"], tmp_path)
        assert failed.returncode != 0
        last = failed.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the run is incomplete: coherence (") and last.count(
            "the judge plans for a 8192-token window; set --judge-context-window to 3072 or less") == 2, last
        assert last.endswith("or less); rerun with the setting it names to retry"), last  # not the same command
        before = len(server.served)
        proc = run_here([*args, "--api-base", server.url, "-o", tmp_path / "run", "--judge-context-window", "3072"],
                        tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) - before >= 3  # coherence, claims and their verification, each within 3072
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["config"]["judge_context_window"] == 3072 and run["complete"] is True
    assert {info["context_window"] for info in run["judges"].values()} == {3072}
    assert (tmp_path / "run" / "report.html").read_text().count("planned for a 3072-token window") == 2


def one_book_sweep(folder: Path, judge: str) -> Path:
    """A manifest of one short book and its given summary, judged as `judge` (YAML) says."""
    (folder / "a.txt").write_text("Mara kept the light on the island. " * 40, encoding="utf-8")
    (folder / "given.json").write_text(json.dumps({"a": "Mara kept the light. The boats came home."}))
    manifest = folder / "sweep.yaml"
    manifest.write_text(f"books: [a.txt]\nsystems: [{{name: given, summaries: given.json}}]\njudge: {judge}\n",
                        encoding="utf-8")
    return manifest


def test_a_sweeps_cells_show_the_judge_the_demos_their_window_holds_as_run_does(tmp_path):
    """Two passages of 256 tokens fit a 2048-token judge window beside four of the six demos: the
    sweep refused them before any cell (advising zero_shot); now its driver lets them through and
    each cell fits the demos by `run`'s rule, sends four with every verification and records it."""
    from booklens.testing import pipeline_step

    (tmp_path / "a.txt").write_text("Mara kept the light on the island. " * 200, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"a": "Mara kept the light. The boats came home."}))
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text("books: [a.txt]\nsystems: [{name: given, summaries: given.json}]\n"
                        "judge: {steps: [faithfulness], k: 2, context_window: 2048}\n", encoding="utf-8")
    with FakeOpenAIServer(responder=judged_within(2048)) as server:
        proc = run_here(["sweep", manifest, "-o", tmp_path / "out", "--lm", "openai/fake", "--api-base", server.url],
                        tmp_path)
    assert proc.returncode == 0, proc.stderr
    note = ("the judge is shown 4 of its 6 demos: its 2048-token context window holds no more beside 2 passages "
            "of up to 256 tokens")
    assert proc.stderr.splitlines().count(f"note: {note}") == 1
    verifications = [r.body for r in server.received if pipeline_step(r.body) == "verify"]
    assert verifications and {sum(m["role"] == "assistant" for m in body["messages"]) for body in verifications} == {4}
    run = json.loads(next((tmp_path / "out").rglob("run.json")).read_text())
    assert (run["judges"]["verification"]["demos_shown"], run["judges"]["verification"]["demos_note"]) == (4, note)


def test_a_sweeps_judge_window_is_a_manifest_key_within_the_models(tmp_path):
    from booklens.errors import BooklensError
    from booklens.sweep.run import run_sweep

    manifest = one_book_sweep(tmp_path, "{evidence: book, context_window: 16384}")
    with pytest.raises(BooklensError) as refused:
        run_sweep(manifest, tmp_path / "refused", lm="local", cache_dir=tmp_path / "cache", progress_interval=60)
    assert str(refused.value) == (f"{manifest}: judge.context_window 16384 is larger than this model's 8192: set "
                                  "judge.context_window to 8192 or less")
    manifest.write_text(manifest.read_text().replace("16384", "3072"), encoding="utf-8")
    with FakeOpenAIServer(responder=judged_within(3072)) as server:
        outcome = run_sweep(manifest, tmp_path / "out", lm="openai/fake", api_base=server.url,
                            cache_dir=tmp_path / "cache", progress_interval=60)
    assert [o.status for o in outcome.outcomes] == ["complete"], [o.error for o in outcome.outcomes]
    run = json.loads((tmp_path / "out" / "cells" / "given" / "a" / "run.json").read_text())
    assert run["config"]["judge_context_window"] == 3072


def test_runs_evidence_too_large_for_the_judges_window_is_named_by_runs_options(tmp_path):
    """`run` is a command line: its line names --k and --passage-tokens, not a manifest's keys."""
    summary = tmp_path / "summary.txt"
    summary.write_text("Mara kept the light. The boats came home.", encoding="utf-8")
    with FakeOpenAIServer() as server:
        proc = run_here(["run", STORY, "--summary", summary, "--lm", "openai/fake", "--api-base", server.url,
                         "--judge-context-window", "2048", "--zero-shot", "-o", tmp_path / "run"], tmp_path)
    line = one_line_error(proc)
    assert line.startswith("error: --k 5 passages of up to --passage-tokens 256 tokens: 1280 tokens"), line
    assert line.endswith("in its 2048-token context window; lower --k to 2 or less or --passage-tokens to 146 or "
                         "less"), line
    assert server.received == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("method, refusal, fitting", [
    # A 2048-token window holds neither the default chunk nor two default summaries beside a third.
    ("hier", "a chunk of 2048 tokens does not fit the 2048-token context window with a 900-token summary and the "
             "prompt; set --max-summary-tokens to 499 or less and --chunk-size to 1021 or less, or raise "
             "--context-window", ("499", "1021")),
    # No chunk fits beside the default 900-token running summary (the line named no value before).
    ("inc", "incremental updating needs 4513 tokens per call (chunk 2048 + running summary 900 + output + prompt) "
            "but the usable context window is 1740; set --max-summary-tokens to 375 or less and --chunk-size to 588 "
            "or less, or raise --context-window", ("375", "588")),
])
def test_summarize_in_a_small_window_names_the_settings_that_fit_it(tmp_path, method, refusal, fitting):
    """One line gives the values that fit, and with them the summary is written."""
    from booklens.testing import PipelineResponder

    out = tmp_path / "summary.json"
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        args = ["summarize", STORY, "--method", method, "--lm", "openai/fake", "--api-base", server.url,
                "--context-window", "2048", "-o", out]
        assert one_line_error(run_here(args, tmp_path)) == f"error: {refusal}"
        assert server.received == [] and not out.exists()
        proc = run_here([*args, "--max-summary-tokens", fitting[0], "--chunk-size", fitting[1]], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["summary"]


def test_evidence_is_checked_against_the_judges_whole_prompt_not_only_its_demos(tmp_path):
    """At 2048 tokens the few-shot judge's instructions and six demos leave no room for three
    passages: they passed the check (counted beside the demos alone) and the server refused every
    prompt, a line naming no setting. Then one line advised --zero-shot, and with it the next named
    --k: two reruns. Now the judge shows the first demos that fit beside the passages and says so,
    and passages that fit beside no demo get one line whose values the one rerun then fits."""
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Maren bound the book."]))
    args = ["verify", "--claims", claims, "--book", STORY, "--lm", "openai/fake", "--context-window", "2048"]
    with FakeOpenAIServer(responder=judged_within(2048)) as server:
        proc = run_here([*args, "--api-base", server.url, "--k", "3", "-o", tmp_path / "k3.json"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.splitlines().count("note: the judge is shown 2 of its 6 demos: its 2048-token context "
                                              "window holds no more beside 3 passages of up to 256 tokens") == 1
        assert len(server.served) == 1 and json.loads((tmp_path / "k3.json").read_text())["judge"]["demos_shown"] == 2
        assert one_line_error(run_here([*args, "--api-base", server.url], tmp_path)) == FIVE_PASSAGES_AT_2048
        assert len(server.received) == 1
        proc = run_here([*args, "--api-base", server.url, "--k", "2", "-o", tmp_path / "v.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(server.served) == 2 and json.loads((tmp_path / "v.json").read_text())["claims"][0]["label"]
    assert sum(m["role"] == "assistant" for m in server.received[-1].body["messages"]) == 4


def test_a_sweep_whose_cells_fail_for_a_setting_says_to_rerun_with_it(tmp_path):
    manifest = one_book_sweep(tmp_path, "{steps: [coherence]}")
    with FakeOpenAIServer(responder=judged_within(3072)) as server:
        proc = run_here(["sweep", manifest, "-o", tmp_path / "out", "--lm", "openai/fake", "--api-base", server.url],
                        tmp_path)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("error: 1 of 1 cells failed"), proc.stderr
    assert last.endswith("set judge.context_window to 3072 or less); rerun with the setting it names to retry "
                         "them"), last


def test_a_server_that_accepts_but_never_answers_is_asked_once_not_once_per_route():
    """A server that holds the connection without a word would cost a full timeout per route asked."""
    import socket

    from booklens.lm.remote import server_window

    # Never accepted: the kernel completes each connection into the backlog, where it waits unanswered.
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    held = []
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        assert server_window(url, "fake-model", None, timeout=0.3) is None
        listener.setblocking(False)
        while True:
            try:
                held.append(listener.accept()[0])
            except BlockingIOError:
                break
        assert len(held) == 1
    finally:
        for connection in held:
            connection.close()
        listener.close()


def three_books(folder: Path) -> Path:
    folder.mkdir()
    for i in range(3):
        (folder / f"story{i}.txt").write_text(STORY.read_text())
    return folder


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_the_summarize_task_plans_for_the_window_and_summarizer_settings_given(tmp_path, command):
    """As `summarize` does: the default window a 2048-token server does not have is refused before any
    call, and so are the default chunk and summary budgets in a 2048-token window, naming values that
    fit; with them every prompt fits 2048 and a compiled artifact records them."""
    from booklens.testing import PipelineResponder

    books, out = three_books(tmp_path / "books"), tmp_path / "s.json"
    with FakeOpenAIServer(responder=PipelineResponder(), pages=LLAMA_CPP_PROPS) as server:
        args = [command, "summarize", "--data", books, "--lm", "openai/fake", "--api-base", server.url, "-o", out,
                *(["--optimizer", "labeled"] if command == "compile" else [])]
        assert one_line_error(run_here(args, tmp_path)) == (
            "error: the default context window 8192 is larger than this model's 2048: set --context-window to 2048 "
            "or less")
        assert one_line_error(run_here([*args, "--context-window", "2048"], tmp_path)) == (
            "error: a chunk of 2048 tokens does not fit the 2048-token context window with a 900-token summary and "
            "the prompt; set --max-summary-tokens to 499 or less and --chunk-size to 1021 or less, or raise "
            "--context-window")
        assert server.received == [] and not out.exists()
        proc = run_here([*args, "--context-window", "2048", "--chunk-size", "1021", "--max-summary-tokens", "499"],
                        tmp_path)
    assert proc.returncode == 0, proc.stderr
    sent = [sum(len(str(m.get("content", ""))) // 4 for m in r.body["messages"]) + (r.body.get("max_tokens") or 0)
            for r in server.received]
    assert len(sent) > 1 and max(sent) <= 2048, sent
    written = json.loads(out.read_text())
    if command == "compile":
        config = written["metadata"]["booklens"]["program_config"]
        assert (config["context_window"], config["chunk_size"], config["max_summary_tokens"]) == (2048, 1021, 499)
    else:
        assert written["results"][0]["n"] == 1


@pytest.mark.parametrize("command", ["compile", "evaluate"])
def test_a_prompt_of_the_summarize_task_a_server_refuses_names_its_context_window_option(tmp_path, command):
    """A server that states no window: the summarize task plans for 8192 tokens, and the first prompt
    refused as too long for 2048 says which option sets the window it plans for."""
    books = three_books(tmp_path / "books")
    with FakeOpenAIServer(responder=overflow_at(2048)) as server:
        proc = run_here([command, "summarize", "--data", books, "--lm", "openai/fake", "--api-base", server.url,
                         *(["--optimizer", "labeled", "-o", tmp_path / "s.json"] if command == "compile" else [])],
                        tmp_path)
    line = one_line_error(proc) if command == "evaluate" else proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert line.endswith("fit the 2048-token context window of 'openai/fake': the summarize task plans for a "
                         "8192-token window; set --context-window to 2048 or less"), line
    assert len(server.received) == 1


def test_a_judge_window_that_holds_no_summary_is_refused_before_the_summary_is_written(tmp_path):
    """At 1200 tokens the coherence judge's instructions and answer leave no room for any summary:
    `run` summarized the book (paid calls), then failed the coherence step and said to rerun the same
    command, which fails alike. Now one line before any call names the window the judge needs, and
    that window is enough for a run."""
    from booklens.testing import PipelineResponder

    args = ["run", STORY, "-o", tmp_path / "run", "--lm", "openai/fake", "--evidence", "none", "--zero-shot",
            "--context-window", "2048", "--chunk-size", "512", "--max-summary-tokens", "200"]
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        line = one_line_error(run_here([*args, "--api-base", server.url, "--judge-context-window", "1200"], tmp_path))
        assert line == ("error: the judge's 1200-token context window holds no summary beside its answer and its "
                        "prompt's instructions: the coherence judge needs a window of more than 1,262 tokens; use "
                        "a model or server with a larger context window")
        assert server.received == [] and not (tmp_path / "run").exists()
        proc = run_here([*args, "--api-base", server.url, "--judge-context-window", "1500"], tmp_path)
    assert proc.returncode == 0, proc.stderr


def coherence_requests(server) -> int:
    from booklens.testing import pipeline_step

    return sum(1 for request in server.received if pipeline_step(request.body) == "coherence")


def test_a_summary_too_long_for_the_judges_window_names_runs_settings_that_fit_it(tmp_path):
    """At 1300 tokens the coherence judge holds a summary of 21 tokens, and the 37-token one written was
    refused (before any coherence call) with "judge it with a model of a window of 1,318 tokens or
    more"; the run then said to rerun the same command, which fails alike. The line now names run's
    settings with values that fit, and each of them finishes the run."""
    from booklens.testing import PipelineResponder

    args = ["run", STORY, "--lm", "openai/fake", "--evidence", "none", "--zero-shot", "--context-window", "2048",
            "--chunk-size", "512", "--max-summary-tokens", "200", "--judge-context-window", "1300"]
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        failed = run_here([*args, "--api-base", server.url, "-o", tmp_path / "run"], tmp_path)
        assert failed.returncode != 0 and "Traceback" not in failed.stderr
        assert failed.stderr.strip().splitlines()[-1] == (
            "error: the run is incomplete: coherence (the summary 'sample_story.txt' (37 tokens) does not fit the "
            "model's 1,300-token context window even with none of the judge's demos; set --judge-context-window to "
            "1318 or more, or --max-summary-tokens to 21 or less); rerun with the setting it names to retry")
        assert coherence_requests(server) == 0
        wider = run_here([*args, "--api-base", server.url, "-o", tmp_path / "run", "--judge-context-window", "1318"],
                         tmp_path)
        assert wider.returncode == 0, wider.stderr
        assert coherence_requests(server) == 3  # the summary's three sentences
        shorter = run_here([*args, "--api-base", server.url, "-o", tmp_path / "shorter", "--max-summary-tokens", "21"],
                           tmp_path)
    assert shorter.returncode == 0, shorter.stderr
    assert json.loads((tmp_path / "shorter" / "run.json").read_text())["complete"] is True


def test_a_summary_budget_longer_than_the_judges_window_holds_is_warned_of_before_any_call(tmp_path):
    """`run`'s check before any call held the judge window against the judge's instructions only, so a
    window that held no summary as long as --max-summary-tokens said nothing until the summary was
    written. It warns now (the summary may end within the window: not an error), and says nothing where
    the budget fits, or on a rerun that reuses the summary written."""
    from booklens.testing import PipelineResponder

    args = ["run", STORY, "--lm", "openai/fake", "--evidence", "none", "--zero-shot", "--context-window", "2048",
            "--chunk-size", "512", "--judge-context-window", "1300"]
    warning = ("warning: --max-summary-tokens 200 allows a longer summary than the coherence judge's 1,300-token "
               "context window holds beside its prompt (at most 35 tokens): a summary that long fails the coherence "
               "step once it is written, and its error then names the settings that fit")
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        long_budget = run_here([*args, "--api-base", server.url, "-o", tmp_path / "run", "--max-summary-tokens", "200"],
                               tmp_path)
        assert long_budget.stderr.strip().splitlines()[0] == warning
        rerun = run_here([*args, "--api-base", server.url, "-o", tmp_path / "run", "--max-summary-tokens", "200"],
                         tmp_path)
        assert warning not in rerun.stderr and "summary: reused" in rerun.stderr
        fitting = run_here([*args, "--api-base", server.url, "-o", tmp_path / "fits", "--max-summary-tokens", "35"],
                           tmp_path)
    assert "allows a longer summary" not in fitting.stderr


def test_a_summary_too_long_for_a_sweeps_judge_names_the_manifests_keys(tmp_path):
    from booklens.sweep.run import run_sweep
    from booklens.testing import PipelineResponder

    (tmp_path / "story.txt").write_text(STORY.read_text(encoding="utf-8"), encoding="utf-8")
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text("books: [story.txt]\nsystems: [{name: hier, context_window: 2048, chunk_size: 512, "
                        "max_summary_tokens: 200}]\njudge: {steps: [coherence], zero_shot: true, context_window: "
                        "1300}\n", encoding="utf-8")
    with FakeOpenAIServer(responder=PipelineResponder()) as server:
        outcome = run_sweep(manifest, tmp_path / "out", lm="openai/fake", api_base=server.url,
                            cache_dir=tmp_path / "cache", progress_interval=60)
        assert coherence_requests(server) == 0
    [cell] = outcome.outcomes
    assert cell.status == "failed" and cell.error == (
        "coherence: the summary 'story.txt' (37 tokens) does not fit the model's 1,300-token context window even with none of "
        "the judge's demos; set judge.context_window to 1318 or more, or the system's max_summary_tokens to 21 or "
        "less")


@pytest.mark.parametrize("model_window, system, judge_window, advice", [
    # the model's own window is smaller than the summary needs: only a shorter summary fits
    (1310, {}, 1300, "; set --max-summary-tokens to 21 or less"),
    (None, {"level_budgets": [150, 200]}, 1300,
     "; set --judge-context-window to 1318 or more, or the last --level-budget to 21 or less"),
    # a budget of 21 already: the summary went over it, and a smaller one is not what fits
    (None, {"max_summary_tokens": 21}, 1300, "; set --judge-context-window to 1318 or more"),
    (None, {"summary_text": "x"}, 1300, "; set --judge-context-window to 1318 or more, or shorten the summary"),
    # no judge window set, and the summary's budget is no larger than fits: nothing of the run's helps
    (None, {"max_summary_tokens": 21}, None, ": shorten it, or judge it with a model of a window of 1,318 tokens or "
                                             "more"),
])
def test_the_settings_a_misfit_names_are_those_that_apply(model_window, system, judge_window, advice):
    from types import SimpleNamespace

    from booklens.judges import judge_programs
    from booklens.pipeline import JudgeConfig, SystemConfig, coherence_misfit

    summary = ("Maren and November meet on page 949. On page 949, November hides a letter from Maren. By the end "
               "of page 950, Maren knows what happened.")
    scorer = judge_programs({}, tasks=("coherence",), zero_shot=True)["coherence"]
    lm = SimpleNamespace(context_window=1300, backend=SimpleNamespace(context_window=model_window))
    reason = coherence_misfit(scorer, summary, lm, SystemConfig(**system), JudgeConfig(context_window=judge_window),
                              window_option="--judge-context-window", as_keys=False)
    assert reason == ("(37 tokens) does not fit the model's 1,300-token context window even with none of the judge's "
                      "demos" + advice)
    assert coherence_misfit(scorer, summary, SimpleNamespace(context_window=1318, backend=lm.backend),
                            SystemConfig(**system), JudgeConfig(context_window=judge_window)) is None


def test_a_sweeps_judge_window_that_holds_no_summary_is_refused_by_the_dry_run(tmp_path):
    """--dry-run passed a judge.context_window in which no summary fits the coherence judge's prompt,
    and the run then failed every cell at its coherence step."""
    from booklens.errors import BooklensError
    from booklens.sweep.run import dry_run, run_sweep

    manifest = one_book_sweep(tmp_path, "{steps: [coherence], context_window: 1200}")
    expected = (f"{manifest}: the judge's 1200-token context window holds no summary beside its answer and its "
                "prompt's instructions: the coherence judge needs a window of more than 1,262 tokens; use a model "
                "or server with a larger context window")
    with FakeOpenAIServer() as server:
        with pytest.raises(BooklensError) as refused:
            dry_run(manifest, tmp_path / "out", lm="openai/fake", api_base=server.url)
        assert str(refused.value) == expected
        with pytest.raises(BooklensError) as refused:
            run_sweep(manifest, tmp_path / "out", lm="openai/fake", api_base=server.url, cache_dir=tmp_path / "cache",
                      progress_interval=60)
        assert str(refused.value) == expected
        assert server.received == [] and not (tmp_path / "out").exists()


def test_a_sweeps_dry_run_warns_of_a_system_whose_summary_budget_the_judges_window_cannot_hold(tmp_path):
    """Every cell of such a system would fail its coherence step once its summary is written; the dry
    run (no completion) names the system, and says nothing of one whose budget fits or whose summaries
    are given."""
    from booklens.sweep.run import dry_run

    (tmp_path / "a.txt").write_text("Mara kept the light on the island. " * 40, encoding="utf-8")
    (tmp_path / "given.json").write_text(json.dumps({"a": "Mara kept the light. The boats came home."}))
    manifest = tmp_path / "sweep.yaml"
    manifest.write_text("books: [a.txt]\nsystems: [{name: long, context_window: 2048, chunk_size: 512, "
                        "max_summary_tokens: 200}, {name: short, context_window: 2048, chunk_size: 512, "
                        "max_summary_tokens: 35}, {name: given, summaries: given.json}]\n"
                        "judge: {steps: [coherence], zero_shot: true, context_window: 1300}\n", encoding="utf-8")
    with FakeOpenAIServer() as server:
        text = dry_run(manifest, tmp_path / "out", lm="openai/fake", api_base=server.url)
        assert not any(r.path.endswith("/chat/completions") for r in server.received)
    assert [line for line in text.splitlines() if "allows a longer summary" in line] == [
        "warning: system 'long': max_summary_tokens 200 allows a longer summary than the coherence judge's 1,300-token "
        "context window holds beside its prompt (at most 35 tokens): a summary that long fails the coherence step once "
        "it is written, and its error then names the settings that fit"]


def vllm_strict_at(window: int):
    """A server that, as vLLM and TGI do, refuses a request whose prompt and answer budget together
    exceed its window, though the prompt alone fits (the prompt counted as a quarter of its characters)."""
    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        wanted = body.get("max_tokens") or 0
        if prompt >= window:
            return Reply(status=400, error=f"This model's maximum context length is {window} tokens. However, you "
                                           f"requested {prompt + wanted} tokens ({prompt} in the messages, "
                                           f"{wanted} in the completion).")
        if prompt + wanted > window:
            return Reply(status=400, error=f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. This "
                                           f"model's maximum context length is {window} tokens and your request has "
                                           f"{prompt} input tokens ({wanted} > {window} - {prompt}).")
        return "The answer."
    return respond


def test_an_answer_budget_the_window_cannot_hold_beside_the_prompt_is_trimmed_to_what_it_leaves():
    """A strict server refused a prompt that fits its window because the answer budget did not fit
    beside it; llama.cpp's servers and the embedded model write as far as the window goes. The request
    is sent again with the budget the server's figures leave, once."""
    prompt = "x" * 4 * 700  # 700 tokens by the fake server's count
    with FakeOpenAIServer(responder=vllm_strict_at(1000)) as server:
        completion = backend_for(server).complete({"messages": [{"role": "user", "content": prompt}],
                                                   "max_tokens": 512})
    assert completion.text == "The answer."
    assert [r.body["max_tokens"] for r in server.received] == [512, 300]
    # an answer the window then cuts off is told apart from one its budget did (a larger one cannot help)
    assert completion.answer_room == 300


def test_a_prompt_that_leaves_no_room_for_an_answer_is_refused_not_trimmed():
    prompt = "x" * 4 * 995
    with FakeOpenAIServer(responder=vllm_strict_at(1000)) as server:
        with pytest.raises(Exception) as refused:
            backend_for(server).complete({"messages": [{"role": "user", "content": prompt}], "max_tokens": 512})
    assert "do not fit the 1000-token context window" in str(refused.value)
    assert len(server.received) == 1


def test_verify_on_a_strict_server_judges_a_claim_whose_answer_budget_the_window_cannot_hold(tmp_path):
    """The default evidence budget (never under 256 tokens) leaves a 1024-token window too little for
    the verifier's 256-token answer budget by a strict server's count, though the prompt fits:
    llama-cpp-python's server judges such a claim, and a vLLM-like one now does too."""
    from booklens.testing import PipelineResponder

    quotes = " ".join(["Mara rationed the oil and burned the lamp only in the darkest hours."] * 500)
    (tmp_path / "claims.json").write_text(json.dumps([{"claim": "Mara rationed the oil.", "evidence": [quotes]}]))
    strict, answer = vllm_strict_at(1024), PipelineResponder()

    def respond(body):
        refusal = strict(body)
        return refusal if isinstance(refusal, Reply) else answer(body)

    with FakeOpenAIServer(responder=respond) as server:
        proc = run_here(["verify", "--claims", tmp_path / "claims.json", "--evidence", "given", "--zero-shot",
                         "--lm", "openai/fake", "--api-base", server.url, "--context-window", "1024",
                         "-o", tmp_path / "out.json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    prompt = sum(len(str(m.get("content", ""))) for m in server.received[0].body["messages"]) // 4
    assert prompt + 256 > 1024 > prompt
    assert [r.body["max_tokens"] for r in server.received] == [256, 1024 - prompt]
    assert json.loads((tmp_path / "out.json").read_text())["claims"][0]["label"] == "faithful"


DIVERSE_EVENTS = REPO / "examples" / "diverse" / "harbor_bridge_closure.json"


def judges_within(window: int):
    """Every output field a DiverseSumm judge asks for (a rating of 1, the verdict B) for a prompt that
    fits `window` tokens (a quarter of its characters); a longer one refused as llama.cpp refuses it."""
    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        if prompt > window:
            return Reply(status=400, error=f"Requested tokens ({prompt}) exceed context window of {window}")
        return json.dumps({"explanation": "because", "rating": 1, "verdict": "B"})
    return respond


def many_questions(tmp_path):
    """The harbour event with its six QA pairs asked three times over (the question reworded), so
    that all of them at once overflow a 2048-token window though each alone fits it; and two
    summaries of it."""
    event = json.loads(DIVERSE_EVENTS.read_text())[0]
    event["question_answers"] = [{**qa, "question": f"{qa['question']} (round {r})"} for r in range(3)
                                 for qa in event["question_answers"]]
    events = tmp_path / "events.json"
    events.write_text(json.dumps([event]))
    summaries = []
    for name, text in (("one", "The bridge closed after a crack; sources disagree on the cost."),
                       ("two", "Sources disagree on the cause of the crack and on when the bridge reopens.")):
        summaries.append(tmp_path / f"{name}.json")
        summaries[-1].write_text(json.dumps({event["eid"]: text}))
    return events, summaries


@pytest.mark.parametrize("command, fix, fitting", [
    (lambda e, s: ["judge", e, s[0], "--criterion", "coverage", "--protocol", "likert"],
     "judge each QA pair alone with --protocol binary", ["--protocol", "binary"]),
    (lambda e, s: ["bias", "position", e, s[0], s[1], "--criterion", "coverage"],
     "compare on each QA pair with --per-qa", ["--per-qa"]),
])
def test_diverse_judges_refuse_before_any_call_what_no_judgment_fits_and_name_what_does(tmp_path, command, fix,
                                                                                       fitting):
    """The QA pairs shown at once do not fit the 2048 tokens llama.cpp says it has: every call was
    sent and refused, and the run ended in the server's line naming no setting. Now one line, before
    any call, names what fits, and with it the run finishes."""
    events, summaries = many_questions(tmp_path)
    with FakeOpenAIServer(responder=judges_within(2048), pages=LLAMA_CPP_PROPS) as server:
        args = [*command(events, summaries), "--lm", "openai/fake", "--api-base", server.url, "--concurrency", "1"]
        line = one_line_error(run_here(args, tmp_path))
        assert server.received == []
        what = "coverage likert" if "judge" in args else "coverage pairwise"
        tokens = 2638 if "judge" in args else 2766
        assert line == (f"error: the coverage judge's prompt for event ev-0001 with its reference QA pairs is {tokens} "
                        f"tokens, more than the 1920 the 2048-token context window holds beside its answer, and no "
                        f"{what} judgment fits; {fix}, or use a model or server with a larger context window")
        proc = run_here([*args, *fitting], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(server.received) == (18 if "judge" in args else 36)  # each QA pair (both orders, for pairwise)


def test_diverse_judges_judge_in_a_window_that_holds_their_prompts(tmp_path):
    events, summaries = many_questions(tmp_path)
    pages = {"/props": {"default_generation_settings": {"n_ctx": 4096}}}
    with FakeOpenAIServer(responder=judges_within(4096), pages=pages) as server:
        proc = run_here(["judge", events, summaries[0], "--criterion", "coverage", "--protocol", "likert", "--lm",
                         "openai/fake", "--api-base", server.url], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(server.received) == 1


def answers_within(window: int):
    """`overflow_at(window)`'s server, stating no window, that answers a request that fits as every
    DiverseSumm judge asks (a rating of 1, the verdict B)."""
    refuse = overflow_at(window)

    def respond(body):
        reply = refuse(body)
        if reply.status == 400:
            return reply
        return json.dumps({"explanation": "because", "rating": 1, "verdict": "B"})
    return respond


def test_each_command_run_in_one_process_learns_its_servers_afresh(tmp_path):
    """Tests run commands in one process; a server started later may take the port of one that stopped,
    and a command then planned for the window the old server stated (here 1024: the judge refused its
    prompt before any call), which a new process never does."""
    from booklens.lm.remote import _learned_about

    events, summaries = many_questions(tmp_path)
    with FakeOpenAIServer(responder=answers_within(2048)) as server:
        _learned_about("openai", server.url)["window of openai/fake"] = 1024  # what a stopped server said
        run_here(["judge", events, summaries[0], "--criterion", "coverage", "--protocol", "likert", "--lm",
                  "openai/fake", "--api-base", server.url, "--concurrency", "1", "--output", tmp_path / "out.json"],
                 tmp_path)
        assert len(server.received) == 1  # sent, as to a server that states no window


@pytest.mark.parametrize("command, tokens, fix, fitting", [
    (lambda e, s: ["judge", e, s[0], "--criterion", "coverage", "--protocol", "likert"], 2638,
     "judge each QA pair alone with --protocol binary", ["--protocol", "binary"]),
    (lambda e, s: ["bias", "position", e, s[0], s[1], "--criterion", "coverage"], 2766,
     "compare on each QA pair with --per-qa", ["--per-qa"]),
    (lambda e, s: ["bias", "verbosity", e, s[0], "--criterion", "coverage", "--protocol", "pairwise"], 2776,
     "compare on each QA pair with --per-qa", ["--per-qa"]),
])
def test_diverse_judges_refused_where_no_window_is_stated_end_naming_what_fits(tmp_path, command, tokens, fix,
                                                                                fitting):
    """llama-cpp-python's server states no window, so the QA pairs at once are sent and refused in
    words that name it. The run ended in a line naming no setting; then, after a refused call for
    every judgment of every event (4 and 8 here), in the line the stated window gives before any
    call. Now the first refusal ends it in that line: one call, however many events."""
    events, summaries = many_questions(tmp_path)
    event = json.loads(events.read_text())[0]
    copies = [{**event, "eid": f"ev-000{n}"} for n in range(1, 5)]
    events.write_text(json.dumps(copies))
    for path in summaries:
        text = next(iter(json.loads(path.read_text()).values()))
        path.write_text(json.dumps({copy["eid"]: text for copy in copies}))
    out = tmp_path / "out.json"
    with FakeOpenAIServer(responder=answers_within(2048)) as server:
        args = [*command(events, summaries), "--lm", "openai/fake", "--api-base", server.url, "--concurrency", "1",
                "--output", out]
        proc = run_here(args, tmp_path)
        judge = "judge" in args
        assert len(server.received) == 1
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        what = "coverage likert" if judge else "coverage pairwise"
        line = (f"the coverage judge's prompt for event ev-0001 with its reference QA pairs is {tokens} tokens, more "
                f"than the 1920 the 2048-token context window holds beside its answer, and no {what} judgment fits; "
                f"{fix}, or use a model or server with a larger context window")
        assert proc.stderr.strip().splitlines() == [f"error: {line}"]
        assert not out.exists()  # nothing judged: no record, as where the window is stated
        proc = run_here([*args, *fitting], tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the four copies ask the same questions of the same summary: the cache answers all but the first
    assert len(server.received) == (1 + 18 if judge else 1 + 36)
    record = json.loads(out.read_text())
    figure = record["events"] if judge else record.get("coverage", record.get("coverage_pairwise"))["cases"]
    assert "window_misfit" not in record and len(figure) == (4 if judge else 4 * 18)


@pytest.mark.parametrize("window_args, pages", [([], LLAMA_CPP_PROPS), (["--context-window", "2048"], None)])
def test_diverse_refuses_before_any_call_judging_that_no_window_holds(tmp_path, window_args, pages):
    """`diverse` checked its extraction and summary against the window but not its judges: it wrote
    the summary, then every coverage likert judgment was sent and refused. Now, with the window known
    (stated by the server or given), the run ends before any call in the judges' line."""
    events, _ = many_questions(tmp_path)
    with FakeOpenAIServer(responder=judges_within(2048), pages=pages) as server:
        line = one_line_error(run_here(["diverse", events, "--lm", "openai/fake", "--api-base", server.url,
                                        "--concurrency", "1", *window_args], tmp_path))
        assert server.received == []
    fix = ("set --context-window to 2754 or more (3778 holds a summary of the 1024 tokens kept for it), or "
           if window_args else "")
    assert line == ("error: the coverage judge's prompt for event ev-0001 with its reference QA pairs is 2626 tokens, "
                    "more than the 1920 the 2048-token context window holds beside its answer, and no coverage likert "
                    f"judgment fits; {fix}use a model or server with a larger context window")


def llama_cpp_python_at(window: int):
    """llama-cpp-python's server started with `--n_ctx WINDOW`: every request larger than its window
    gets its 400, in its words (the prompt counted as a quarter of its characters); it states no
    window beforehand."""
    def respond(body):
        prompt = sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4
        wanted = body.get("max_tokens") or 0
        if prompt + wanted <= window:
            return Reply(status=500, error="not expected to fit")
        return Reply(status=400, error=f"This model's maximum context length is {window} tokens. However, you "
                                       f"requested {prompt + wanted} tokens ({prompt} in the messages, {wanted} in "
                                       "the completion). Please reduce the length of the messages or completion.")
    return respond


def test_score_on_a_server_whose_window_holds_no_judgment_says_so_not_to_set_the_window_to_it(tmp_path):
    """A real llama-cpp-python server with `--n_ctx 1024` refused the first sentence's prompt, and `score`
    said to set --context-window to 1024 or less; with it, the check before any call said to set it to
    1395 or more: no setting of the option fits. The window the server named in refusing now gets the
    line that check gives without the option: a larger window is what it takes."""
    (tmp_path / "summary.txt").write_text(
        "Dr. Finch watches the nurse's station. Maren Holt stands there. She watches him in turn.\n",
        encoding="utf-8")
    with FakeOpenAIServer(responder=llama_cpp_python_at(1024)) as server:
        proc = run_here(["score", tmp_path / "summary.txt", "--lm", "openai/fake", "--api-base", server.url,
                         "-o", tmp_path / "out.json"], tmp_path)
    line = one_line_error(proc)
    assert line == ("error: the summary 'summary.txt' (21 tokens) does not fit the model's 1,024-token context "
                    "window even with none of the judge's demos: judge it with a model of a window of 1,295 "
                    "tokens or more"), line
    assert proc.returncode == 2 and not (tmp_path / "out.json").exists()


def test_verify_on_a_server_whose_window_holds_no_evidence_says_so_not_to_set_the_window_to_it(tmp_path):
    """`check` against llama-cpp-python's server with `--n_ctx 1024` was told to set --context-window to
    1024 or less; with it, that the judge's window holds no evidence. The first refusal now says so."""
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps(["Mara lit the lamp."]))
    with FakeOpenAIServer(responder=llama_cpp_python_at(1024)) as server:
        proc = run_here(["verify", "--claims", claims, "--book", STORY, "--evidence", "bm25", "--lm", "openai/fake",
                         "--api-base", server.url, "-o", tmp_path / "out.json"], tmp_path)
    assert one_line_error(proc) == ("error: the judge's 1024-token context window holds no evidence beside its answer "
                                    "and its prompt's instructions; use a model or server with a context window of 2,731 "
                                    "tokens or more")  # five passages of 256 tokens, the defaults, beside no demo
    assert len(server.received) == 1 and not (tmp_path / "out.json").exists()
