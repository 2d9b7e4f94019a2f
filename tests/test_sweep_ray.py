"""`booklens sweep --engine ray` when Ray cannot be reached or started: one line, nothing written.

These start no Ray of their own (the engine's other tests, with a local Ray, are in test_sweep.py)."""

from __future__ import annotations

import os
import subprocess
import sys
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
    try:
        proc = subprocess.run([sys.executable, "-m", "booklens",
                               *ray_sweep_args(manifest, tmp_path / "out", tmp_path / "cache", address)],
                              capture_output=True, text=True, timeout=90, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the sweep still waited for a Ray cluster at {address} after 90 s")
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and address in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address", ["head:abc", "http://127.0.0.1:6379"])
def test_a_malformed_ray_address_is_one_line_before_anything_is_written(tmp_path, address):
    import ray

    assert not ray.is_initialized()  # else the engine would use this process's Ray, whatever the address
    manifest = small_sweep(tmp_path)
    proc = run_command(ray_sweep_args(manifest, tmp_path / "out", tmp_path / "cache", address),
                       env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and address in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
