"""`booklens sweep --engine ray` as a command: Ray that cannot be reached or started (one line,
nothing written) and Ctrl-C. A command runs in a process of its own where the test interrupts it,
breaks Ray's import, or once saw it hang at exit; the others run in this one
(booklens.testing.run_command). The engine's tests on a Ray of this process are in test_sweep.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from booklens.testing import free_port, run_command

pytest.importorskip("ray")


def small_sweep(base: Path) -> Path:
    (base / "story.txt").write_text("Mara kept the light through the winter. " * 60, encoding="utf-8")
    (base / "sweep.yaml").write_text(
        "books: [story.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 1024, max_summary_tokens: 200}]\n"
        "judge: {steps: [coherence]}\n", encoding="utf-8")
    return base / "sweep.yaml"


def refused_in_time(args: list[str], env: dict[str, str], seconds: float = 60.0) -> subprocess.CompletedProcess:
    """`run_command` for a command that must refuse a Ray address at once. Ray itself retries an address
    for ever, so a regression would hang the whole suite; on a thread of its own it fails this test
    after `seconds` instead."""
    import threading

    result: dict[str, subprocess.CompletedProcess] = {}
    thread = threading.Thread(target=lambda: result.update(proc=run_command(args, env=env)), daemon=True)
    thread.start()
    thread.join(seconds)
    if "proc" not in result:
        pytest.fail(f"the command had not refused the address after {seconds:.0f} s")
    return result["proc"]


def ray_sweep_args(manifest: Path, out: Path, cache: Path, address: str) -> list[str]:
    return ["sweep", str(manifest), "-o", str(out), "--lm", "openai/fake-model", "--api-base",
            f"http://127.0.0.1:{free_port()}/v1", "--cache-dir", str(cache), "--engine", "ray",
            "--ray-address", address]


def test_a_ray_address_nothing_listens_at_is_one_line_before_anything_is_written(tmp_path):
    """Ray itself retries such an address for ever, silently (its messages go to the sweep's ray.log):
    the command used to hang after writing the sweep directory."""
    manifest = small_sweep(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = refused_in_time(ray_sweep_args(manifest, tmp_path / "out", tmp_path / "cache", address), env=env)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and address in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_ray_address_where_another_service_listens_is_one_line_before_anything_is_written(tmp_path):
    """A port where something other than Ray listens (a web server, the wrong port of the head): Ray asks
    it for the cluster 20 times over, half a minute each, and the command waited silently for minutes."""
    import http.server
    import threading

    manifest = small_sweep(tmp_path)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # its log would go to the command's stderr, in this process
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{web.server_address[1]}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_USE_TLS")}
    try:
        proc = refused_in_time(ray_sweep_args(manifest, tmp_path / "out", tmp_path / "cache", address), env=env)
    finally:
        web.shutdown()
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"cannot reach the Ray cluster at {address}: something listens there, " \
        "but not Ray" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_malformed_ray_address_is_one_line_before_anything_is_written(tmp_path):
    """Each address in a process of its own, so the command runs twice: after such an error it
    sometimes hung at exit (Ray Data's import, started beside Ray's, was left half done). Both forms
    take one path (the reachability check leaves them to ray.init, which refuses them)."""
    manifest = small_sweep(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for address in ("head:abc", "http://127.0.0.1:6379"):
        try:
            proc = subprocess.run([sys.executable, "-m", "booklens",
                                   *ray_sweep_args(manifest, tmp_path / "out", tmp_path / "cache", address)],
                                  capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail("the sweep had not exited after 60 s")
        assert proc.returncode != 0
        assert proc.stderr.count("\n") == 1 and address in proc.stderr and "Traceback" not in proc.stderr, \
            proc.stderr
        assert not (tmp_path / "out").exists()


def test_ray_address_auto_with_no_ray_on_the_machine_is_one_line_in_the_commands_terms(monkeypatch):
    """`--ray-address auto` (README's cluster command) where no Ray runs: the line said "cannot start
    the Ray cluster at auto" (it joins one) and, in Ray's words, to set "the `--address` flag", which
    booklens does not have. (Ray's refusal is scripted: `auto` would join a Ray another process runs.)"""
    import ray

    from booklens.errors import BooklensError
    from booklens.sweep.engines import PoolSettings, RayEngine

    def no_ray(*args, **kwargs):  # what ray.init(address="auto") raises where it finds no Ray
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address` flag or `RAY_ADDRESS` environment variable.")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    engine = RayEngine(PoolSettings(lm="openai/x", api_base=None, cache_dir=None, concurrency=1), address="auto")
    with pytest.raises(BooklensError) as caught:
        engine.start()
    assert str(caught.value) == ("cannot join the Ray cluster at auto: no Ray runs on this machine (`ray start "
                                 "--head` starts one; without --ray-address, or with --ray-address local, the "
                                 "sweep starts a Ray of its own)")


def test_ctrl_c_on_a_ray_sweep_lets_the_calls_in_flight_end_and_be_cached(tmp_path):
    """As with the local engine, Ctrl-C starts no new call and the calls in flight end and are cached
    before the command exits, so the rerun asks none of them again. (The KeyboardInterrupt used to come
    out of Ray Data's iterator, which killed the workers mid-call: every call in flight was lost.)"""
    import json
    import signal
    import sqlite3
    import time

    from booklens.testing import FakeOpenAIServer, PipelineResponder, terminal_command

    (tmp_path / "a.txt").write_text("Mara kept the light through the winter. " * 80, encoding="utf-8")
    (tmp_path / "b.txt").write_text("The ship came home in the spring and Tom rang the bell. " * 50, encoding="utf-8")
    (tmp_path / "sweep.yaml").write_text(
        "books: [a.txt, b.txt]\n"
        "systems: [{name: hier, method: hier, chunk_size: 256, max_summary_tokens: 100},\n"
        "          {name: inc, method: inc, chunk_size: 256, max_summary_tokens: 100}]\n"
        "judge: {steps: [coherence, faithfulness], evidence: bm25, k: 2, max_claims: 2}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    responder = PipelineResponder(delay=0.3)  # slow enough to interrupt with calls in flight
    with FakeOpenAIServer(responder=responder) as srv:
        args = ["sweep", tmp_path / "sweep.yaml", "-o", tmp_path / "out", "--lm", "openai/fake-model", "--api-base",
                srv.url, "--cache-dir", tmp_path / "cache", "--engine", "ray", "--concurrency", "4"]
        proc = subprocess.Popen(terminal_command(args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=env)
        try:
            deadline = time.time() + 300
            while time.time() < deadline and proc.poll() is None and len(srv.served) < 12:
                time.sleep(0.01)
            assert proc.poll() is None, "the sweep ended before it could be interrupted"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, stderr
        assert stderr.strip().splitlines()[-1] == "error: interrupted (completed LM calls are cached; rerun to resume)"
        # The terminal is told at once that the calls in flight end first (not the sweep's ray.log).
        assert "stopping: the LM calls in flight end first" in stderr, stderr
        asked = {json.dumps(body, sort_keys=True) for body in srv.served}
        # Every request the server answered before the command exited is in the cache (cells on two
        # workers may ask one request side by side: one row).
        with sqlite3.connect(tmp_path / "cache" / "calls.sqlite") as db:
            cached = db.execute("SELECT COUNT(*) FROM calls").fetchone()[0]
        assert cached == len(asked), f"{len(asked) - cached} of the {len(asked)} answered calls were not cached"
        before = len(srv.served)
        # The rerun on the local engine, in this process and with no delay: the calls the Ray workers
        # cached are the ones it finds (the engines make the same calls), without a second Ray start-up.
        responder.delay = 0.0
        local = [*args[:args.index("--engine")], "--engine", "local", "--concurrency", "4"]
        rerun = run_command(local, env=env)
        assert rerun.returncode == 0, rerun.stderr
        again = [body for body in srv.served[before:] if json.dumps(body, sort_keys=True) in asked]
    assert not again, f"the rerun asked {len(again)} calls again"


def test_a_ray_without_ray_data_is_one_line_before_anything_is_written(tmp_path):
    """Ray installed without its Data library (`pip install ray`, not the `ray` extra's `ray[data]`):
    an internal error with a traceback hint, after the sweep directory was written. Now one line, before
    a local Ray starts (it had started one, some 5 s, to find out)."""
    manifest = small_sweep(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # Where a local Ray would make its session folder: short, as Ray's socket paths must be.
    ray_tmp = Path(tempfile.mkdtemp(prefix="bl-ray-", dir="/tmp"))
    env["RAY_TMPDIR"] = str(ray_tmp)
    args = ["sweep", str(manifest), "-o", str(tmp_path / "out"), "--lm", "openai/fake-model", "--api-base",
            f"http://127.0.0.1:{free_port()}/v1", "--cache-dir", str(tmp_path / "cache"), "--engine", "ray"]
    script = ("import sys; sys.modules['pyarrow'] = None; sys.argv = ['booklens', *sys.argv[1:]]; "
              "from booklens.cli import main; main()")
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                              env=env)
        started = list(ray_tmp.iterdir())
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "ray[data]" in proc.stderr and "internal error" not in proc.stderr, \
        proc.stderr
    assert "(import ray.data: No module named 'pyarrow')" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
    assert not started, "a local Ray was started"


def test_ray_address_in_the_environment_is_the_cluster_joined(tmp_path):
    """RAY_ADDRESS (set by `ray job submit` for the job's command, or exported on a cluster machine)
    names the cluster when --ray-address does not, as it does for Ray itself: the sweep used to fail
    with "cannot start a local Ray: When connecting to an existing cluster, num_cpus and num_gpus
    must not be provided"."""
    manifest = small_sweep(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    args = ["sweep", str(manifest), "-o", str(tmp_path / "out"), "--lm", "openai/fake-model", "--api-base",
            f"http://127.0.0.1:{free_port()}/v1", "--cache-dir", str(tmp_path / "cache"), "--engine", "ray"]
    proc = refused_in_time(args, env={**os.environ, "RAY_ADDRESS": address})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"cannot reach the Ray cluster at {address} (RAY_ADDRESS)" in proc.stderr, \
        proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_ray_that_fails_to_import_is_one_line_before_anything_is_written(tmp_path):
    """Ray installed but broken (a shared library of another system, a protobuf of another version):
    the import error came out again as an internal error when the engine was closed, and an import
    failing with anything but ImportError was one from the start."""
    manifest = small_sweep(tmp_path)
    package = tmp_path / "site" / "ray"
    package.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path / "site"), env.get("PYTHONPATH")) if p)
    for error, reason in (("ImportError", "libfoo.so.6: version FOO_3.4 not found (required by _raylet.so)"),
                          ("TypeError", "Descriptors cannot be created directly.")):
        (package / "__init__.py").write_text(f"raise {error}({reason!r} + '\\nmore lines')\n", encoding="utf-8")
        args = ["sweep", str(manifest), "-o", str(tmp_path / "out"), "--lm", "openai/fake-model", "--api-base",
                f"http://127.0.0.1:{free_port()}/v1", "--cache-dir", str(tmp_path / "cache"), "--engine", "ray"]
        proc = subprocess.run([sys.executable, "-m", "booklens", *args], capture_output=True, text=True, timeout=120,
                              env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and reason in proc.stderr and "internal error" not in proc.stderr, \
            proc.stderr
        assert not (tmp_path / "out").exists()


def test_the_cluster_ray_start_recorded_on_this_machine_is_joined(tmp_path):
    """Without --ray-address or RAY_ADDRESS, Ray joins the cluster `ray start` recorded on the machine (a
    cluster's head node, say) rather than start one: the sweep used to fail there with "cannot start a
    local Ray: When connecting to an existing cluster, num_cpus and num_gpus must not be provided". Here
    the record names an address nothing answers at (a cluster since stopped): one line that names it."""
    manifest = small_sweep(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    temp = tmp_path / "tmp"  # Ray's own folder, `ray start`'s record in it: RAY_TMPDIR/ray/ray_current_cluster
    (temp / "ray").mkdir(parents=True)
    (temp / "ray" / "ray_current_cluster").write_text(address + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    args = ["sweep", str(manifest), "-o", str(tmp_path / "out"), "--lm", "openai/fake-model", "--api-base",
            f"http://127.0.0.1:{free_port()}/v1", "--cache-dir", str(tmp_path / "cache"), "--engine", "ray"]
    proc = refused_in_time(args, env={**env, "RAY_TMPDIR": str(temp)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"cannot reach the Ray cluster at {address}" in proc.stderr \
        and "ray start" in proc.stderr and "--ray-address local" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("missing", ["ray", "pandas", "pyarrow", "fsspec"])
def test_ray_or_what_ray_data_adds_missing_is_one_line_before_the_sweep_reads_its_books(missing, tmp_path,
                                                                                       monkeypatch):
    """Found without importing: `run_sweep` names the install, and neither reads the manifest's books nor
    starts a Ray."""
    from booklens.errors import BooklensError
    from booklens.sweep.run import run_sweep

    manifest = small_sweep(tmp_path)
    monkeypatch.setitem(sys.modules, missing, None)  # what find_spec answers for a module not installed
    monkeypatch.setattr("booklens.sweep.run.prepare", lambda *a, **k: pytest.fail("the books were read"))
    want = ("the ray engine needs Ray: pip install 'booklens[ray]'" if missing == "ray" else
            f"the ray engine needs Ray Data: pip install 'booklens[ray]', which installs ray[data] (import ray.data: "
            f"No module named '{missing}')")
    with pytest.raises(BooklensError) as raised:
        run_sweep(manifest, tmp_path / "out", engine="ray", lm="openai/fake-model",
                  api_base=f"http://127.0.0.1:{free_port()}/v1", cache_dir=tmp_path / "cache")
    assert str(raised.value) == want
    assert not (tmp_path / "out").exists()
