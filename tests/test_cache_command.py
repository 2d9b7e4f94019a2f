"""`booklens cache`: what the cache folder holds, and `--prune`, which removes only the book
indexes no run reads any more (built under another index version, or kept where qa kept them
before), never calls, calibrations, current indexes or one another process is building in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import booklens.retrieval.index as retrieval
from booklens.cache_contents import cache_contents, describe_contents, prune_cache
from booklens.errors import BooklensError
from booklens.lm.cache import CACHE_FILE, CallCache
from booklens.records import file_lock
from booklens.retrieval import BookIndex, index_dir

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"


def story_text() -> str:
    from booklens.text import read_book

    return read_book(STORY)


def filled_cache(cache: Path, monkeypatch) -> dict[str, Path]:
    """A cache as months of use leave it: 3 calls, the shipped calibrations, two current indexes
    of the story (two passage sizes), one an older index version built, one whose build stopped
    before its description was written, and one in the folder qa used before `indexes/`."""
    calls = CallCache(cache / CACHE_FILE)
    for i in range(3):
        calls.put(f"key-{i}", {"text": f"answer {i}"})
    shutil.copy(REPO / "booklens" / "defaults" / "calibration.json", cache / "calibration.json")
    text = story_text()
    current = [BookIndex.build(text, cache_dir=index_dir(cache), passage_tokens=size).cache_path
               for size in (128, 256)]
    with monkeypatch.context() as older:
        older.setattr(retrieval, "INDEX_VERSION", retrieval.INDEX_VERSION - 1)
        stale = BookIndex.build(text, cache_dir=index_dir(cache), passage_tokens=256).cache_path
        old_qa = BookIndex.build(text, cache_dir=cache / "index", passage_tokens=256).cache_path
    (cache / "models").mkdir()
    (cache / "models" / "weights.gguf").write_bytes(b"w" * 2000)  # stands for the embedded model's copy
    incomplete = index_dir(cache) / ("0" * 32)
    incomplete.mkdir()
    (incomplete / "passages.json").write_text("[]", encoding="utf-8")
    return {"current_128": current[0], "current_256": current[1], "stale": stale, "old_qa": old_qa,
            "incomplete": incomplete}


def test_the_cache_is_described_by_what_it_holds(tmp_path, monkeypatch):
    from booklens.judges import read_store

    folders = filled_cache(tmp_path, monkeypatch)
    contents = cache_contents(tmp_path)
    assert contents.calls == 3
    assert contents.calibrations == len(read_store(tmp_path / "calibration.json")) > 0
    assert {index.path: index.state for index in contents.indexes} == {
        folders["current_128"]: "current", folders["current_256"]: "current", folders["stale"]: "stale",
        folders["old_qa"]: "stale", folders["incomplete"]: "incomplete"}
    lines = describe_contents(contents)
    assert lines[1].startswith("calls: 3 answers (")
    assert lines[2].startswith("book indexes: 2 current (")
    assert ", 1 incomplete, where a build stopped (the next run on that book finishes it), 2 stale, built by an " \
           "older booklens and read by none now (" in lines[2]
    assert lines[2].endswith("; `booklens cache --prune` removes them)")
    assert lines[3:] == [f"judge calibrations: {contents.calibrations}",
                         "embedded model weights, converted once: 2.0 KB"]


def test_prune_removes_only_the_stale_indexes_and_the_current_ones_are_still_read(tmp_path, monkeypatch):
    folders = filled_cache(tmp_path, monkeypatch)
    pruned = prune_cache(tmp_path)
    assert sorted(index.path for index in pruned.removed) == sorted([folders["stale"], folders["old_qa"]])
    assert pruned.in_use == 0 and pruned.size > 0
    assert not folders["stale"].exists() and not (tmp_path / "index").exists()
    assert all(folders[name].is_dir() for name in ("current_128", "current_256", "incomplete"))
    after = cache_contents(tmp_path)
    assert sorted(index.state for index in after.indexes) == ["current", "current", "incomplete"]
    assert after.calls == 3 and after.calibrations > 0
    # the current index is read as it was, not built again
    assert BookIndex.build(story_text(), cache_dir=index_dir(tmp_path), passage_tokens=256).loaded_from_cache
    assert prune_cache(tmp_path).removed == []


def test_a_stale_index_another_process_is_building_in_is_left(tmp_path, monkeypatch):
    folders = filled_cache(tmp_path, monkeypatch)
    # an older booklens building in it holds the lock it took then
    with file_lock(folders["stale"] / "dense.lock") as held:
        assert held
        pruned = prune_cache(tmp_path)
    assert [index.path for index in pruned.removed] == [folders["old_qa"]] and pruned.in_use == 1
    assert folders["stale"].is_dir()
    assert prune_cache(tmp_path).removed[0].path == folders["stale"]


def test_the_command_prints_the_contents_and_what_prune_removed(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from booklens.cli import app

    filled_cache(tmp_path, monkeypatch)
    result = CliRunner().invoke(app, ["cache", "--cache-dir", str(tmp_path), "--prune"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("removed 2 stale index folders (") and lines[0].endswith(")")
    assert lines[1].startswith(f"cache: {tmp_path} (")
    assert lines[3].startswith("book indexes: 2 current (") and "stale" not in lines[3]


def test_a_cache_that_is_a_file_is_one_line(tmp_path):
    from booklens.testing import run_command

    path = tmp_path / "notes.txt"
    path.write_text("not a cache", encoding="utf-8")
    with pytest.raises(BooklensError, match="it is a file"):
        cache_contents(path)
    result = run_command(["cache", "--cache-dir", path])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: cannot use {path} as the cache directory: it is a file"]
