"""FABLES loader, examples, splits by book, and `booklens data stats fables` (the seed's Table 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from booklens.data.fables import (
    decomposition_examples,
    download_fables,
    label_statistics,
    load_fables,
    parse_fables,
    split_summaries,
    verification_examples,
)
from booklens.errors import BooklensError

TINY = {
    "canary": "do not train on this",
    "FABLES": {
        "Book A": {
            "GPT-4": {"summary": "Ann sails. Ben waits.", "general_comment": "fine",
                      "claims": {"1": {"claim": "Ben waits.", "label": "No", "evidence": ["N/A"], "reason": []},
                                 "0": {"claim": "Ann sails.", "label": "Yes", "evidence": ["Ann sailed away."],
                                       "reason": ["She does."]}}},
            "MIXTRAL": {"summary": "Ann flies.", "general_comment": "",
                        "claims": {"0": {"claim": "Ann flies.", "label": "PartialSupport", "evidence": [],
                                         "reason": []}}},
        },
        "Book B": {
            "GPT-4": {"summary": "Cal sings.", "general_comment": "",
                      "claims": {"0": {"claim": "Cal sings.", "label": "Inapplicable", "evidence": [""],
                                       "reason": []}}},
        },
    },
}


@pytest.fixture(scope="module")
def fables_path(shared_dir):
    path = shared_dir / "data" / "fables" / "FABLES.json"
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


def test_parse_keeps_claim_order_and_fields():
    summaries = parse_fables(TINY)
    assert [(s.book, s.summarizer) for s in summaries] == [("Book A", "GPT-4"), ("Book A", "MIXTRAL"),
                                                           ("Book B", "GPT-4")]
    first = summaries[0]
    assert [c.claim for c in first.claims] == ["Ann sails.", "Ben waits."]  # by numeric key
    assert first.claims[0].evidence == ["Ann sailed away."] and first.claims[0].reason == ["She does."]
    assert first.claims[1].id == "Book A|GPT-4|1"
    # the unwrapped form loads too
    assert len(parse_fables(TINY["FABLES"])) == 3


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update({"FABLES": []}), "not FABLES data"),
    (lambda d: d["FABLES"]["Book A"].update({"GPT-4": "text"}), "needs 'summary' and 'claims'"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"]["0"].update({"label": "Maybe"}), "label 'Maybe'"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"]["0"].update({"evidence": [3]}), "list of strings"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"].update({"x": {"claim": "c", "label": "Yes"}}), "numbers"),
    # "01" and "1" would be two claims with one id; " 2", "-1" and "٣" read as numbers only by int()
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"].update({"01": {"claim": "c", "label": "Yes"}}),
     "Book A / GPT-4 numbers two claims 1"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"].update({" 2": {"claim": "c", "label": "Yes"}}), "numbers"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"].update({"-1": {"claim": "c", "label": "Yes"}}), "numbers"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"].update({"\u0663": {"claim": "c", "label": "Yes"}}),
     "numbers"),
    # a claim without words would be verified and counted
    (lambda d: d["FABLES"]["Book A"]["GPT-4"]["claims"]["0"].update({"claim": "  "}), "claim 0 of Book A / GPT-4 has no text"),
    (lambda d: d["FABLES"]["Book A"]["GPT-4"].update({"general_comment": {"a": 1}}),
     "general_comment of Book A / GPT-4 must be a list of strings"),
])
def test_malformed_data_is_one_clear_error(mutate, message):
    data = json.loads(json.dumps(TINY))
    mutate(data)
    with pytest.raises(BooklensError, match=message):
        parse_fables(data)


def test_a_general_comment_given_as_lines_is_their_text():
    data = json.loads(json.dumps(TINY))
    data["FABLES"]["Book A"]["GPT-4"]["general_comment"] = ["Good start.", "Weak ending."]
    assert parse_fables(data)[0].general_comment == "Good start.\nWeak ending."  # not "['Good start.', ...]"


@pytest.mark.parametrize("text, message", [
    # JSON keeps the last of two equal keys: the first book would be dropped from every count unseen
    ('{"FABLES": {"Book": {"GPT-4": {"summary": "S.", "claims": {}}}, '
     '"Book": {"MIXTRAL": {"summary": "S.", "claims": {}}}}}', "the key 'Book' appears twice in one object"),
    ('{"Book": {"GPT-4": {"summary": "S.", "claims": {"0": {"claim": "c", "label": "Yes"}, '
     '"0": {"claim": "d", "label": "No"}}}}}', "the key '0' appears twice"),
    # the line of the second one, in the object that holds it twice (not a same key elsewhere)
    ('{"A": {"GPT-4": {"summary": "S.", "claims": {"0": {"claim": "c", "label": "Yes"}}}},\n'
     ' "B": {"GPT-4": {"summary": "S.",\n "claims": {"0": {"claim": "c", "label": "Yes"},\n'
     ' "1": {"claim": "d", "label": "No"},\n "0": {"claim": "e", "label": "No"}}}}}',
     r"^FABLES data is malformed: the key '0' appears twice in one object \(.*FABLES.json: line 5\); JSON keeps "
     "only the last$"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to be read"),
    ("", "is empty"),
    ("  \r\n", "is empty"),
])
def test_fables_files_that_would_load_wrong_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "FABLES.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(BooklensError, match=message) as caught:
        load_fables(path)
    assert "\n" not in str(caught.value)


def test_a_bom_and_crlf_line_ends_load(tmp_path):
    path = tmp_path / "FABLES.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(TINY, indent=1).replace("\n", "\r\n").encode("utf-8"))
    assert [len(s.claims) for s in load_fables(path)] == [2, 1, 1]


def test_examples_map_labels_and_drop_placeholder_evidence():
    summaries = parse_fables(TINY)
    dec = decomposition_examples(summaries)
    assert dec[0].summary == "Ann sails. Ben waits." and dec[0].claims == ["Ann sails.", "Ben waits."]
    assert set(dec[0].inputs().keys()) == {"summary"}
    ver = verification_examples(summaries)
    assert [e.label for e in ver] == ["faithful", "unfaithful", "partial support", "can't verify"]
    assert ver[0].evidence == ["Ann sailed away."] and ver[1].evidence == [] and ver[3].evidence == []
    assert set(ver[0].inputs().keys()) == {"claim", "evidence"}
    assert [e.label for e in verification_examples(summaries, labels=("Yes", "No"))] == ["faithful", "unfaithful"]


def test_zip_release_loads(tmp_path):
    archive = tmp_path / "FABLES.json.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("FABLES.json", json.dumps(TINY))
    assert len(load_fables(archive)) == 3


def _damaged_zip(path, compression):
    """A zip whose directory is intact but whose member bytes are not (a download cut or spoiled
    in transit): it passes zipfile.is_zipfile and fails only when the member is read."""
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("FABLES.json", json.dumps(TINY) * 20)
    raw = bytearray(path.read_bytes())
    start = 30 + len("FABLES.json")  # the member's data follows its local header
    for i in range(start + 5, start + 40):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert zipfile.is_zipfile(path)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_damaged_zip_is_one_clear_error(tmp_path, compression):
    archive = tmp_path / "FABLES.json.zip"
    _damaged_zip(archive, compression)
    with pytest.raises(BooklensError, match=r"FABLES.json.zip is a damaged zip archive"):
        load_fables(archive)


def test_zip_with_several_json_files_reads_fables_json_or_refuses(tmp_path):
    archive = tmp_path / "bundle.json.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("meta.json", json.dumps({"version": 1}))
        z.writestr("data/FABLES.json", json.dumps(TINY))
    assert len(load_fables(archive)) == 3  # the release's file, wherever it sits, not the first listed
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("meta.json", json.dumps({"version": 1}))
        z.writestr("other.json", json.dumps(TINY))
    with pytest.raises(BooklensError, match=r"bundle.json.zip holds 2 JSON files \(meta.json, other.json\)"):
        load_fables(archive)


def test_download_failure_is_one_clear_error(tmp_path):
    with pytest.raises(BooklensError, match="cannot download FABLES.*--data PATH"):
        download_fables(tmp_path, url="http://127.0.0.1:9/FABLES.json.zip", timeout=2)
    assert not (tmp_path / "FABLES.json").exists()


def test_download_that_does_not_load_leaves_nothing_behind(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "FABLES.json").write_text('{"not": "the release"}', encoding="utf-8")
    store = tmp_path / "store"
    with pytest.raises(BooklensError):
        download_fables(store, url=(served / "FABLES.json").as_uri())
    # Neither the release nor the downloaded bytes stay: the next try starts clean.
    assert sorted(p.name for p in store.iterdir()) == []


def test_two_downloads_at_once_both_load(tmp_path, monkeypatch):
    """Two commands downloading FABLES into one cache at once wrote the same temporary file: the one
    that finished first removed it under the other, which then failed. Here the second download runs
    while the first holds its bytes unread."""
    import booklens.data.fables as fables

    served = tmp_path / "served"
    served.mkdir()
    (served / "FABLES.json").write_text(json.dumps(TINY), encoding="utf-8")
    url = (served / "FABLES.json").as_uri()
    store = tmp_path / "store"
    read = fables._read_bytes
    others: list[Path] = []
    started = []

    def read_after_another_download(path):
        if not started:
            started.append(path)
            others.append(download_fables(store, url=url))
        return read(path)

    monkeypatch.setattr(fables, "_read_bytes", read_after_another_download)
    assert download_fables(store, url=url) == others[0] == store / "FABLES.json"
    assert len(load_fables(store / "FABLES.json")) == len(load_fables(served / "FABLES.json"))
    assert sorted(p.name for p in store.iterdir()) == ["FABLES.json"]


def test_real_release_loads_and_splits_by_book(fables_path):
    summaries = load_fables(fables_path)
    assert len(summaries) == 100 and sum(len(s.claims) for s in summaries) == 2446
    splits = split_summaries(summaries, seed=0)
    books = {name: {s.book for s in items} for name, items in splits.items()}
    assert not (books["train"] & books["dev"]) and not (books["train"] & books["test"]) \
        and not (books["dev"] & books["test"])
    assert sum(len(v) for v in books.values()) == 20
    assert split_summaries(summaries, seed=0)["test"] == splits["test"]  # reproducible
    assert {s.book for s in split_summaries(summaries, seed=1)["test"]} != books["test"]


def independent_table2(path):
    """Table 2 computed straight from the JSON, without booklens."""
    raw = json.load(open(path, encoding="utf-8"))["FABLES"]
    per_model_labels = defaultdict(Counter)
    per_model_counts = defaultdict(list)
    for book, models in raw.items():
        for model, entry in models.items():
            per_model_counts[model].append(len(entry["claims"]))
            for claim in entry["claims"].values():
                per_model_labels[model][claim["label"]] += 1
    return per_model_labels, per_model_counts


def test_statistics_match_an_independent_count(fables_path):
    stats = label_statistics(load_fables(fables_path))
    labels, counts = independent_table2(fables_path)
    assert set(stats["by_summarizer"]) == set(labels)
    for model, block in stats["by_summarizer"].items():
        total = sum(labels[model].values())
        assert block["claims"] == total and block["summaries"] == len(counts[model])
        assert block["claims_per_summary_mean"] == pytest.approx(sum(counts[model]) / len(counts[model]), abs=0.005)
        for name in ("Yes", "No", "PartialSupport", "Inapplicable"):
            assert block["label_percentages"][name] == pytest.approx(100 * labels[model][name] / total, abs=0.005)
    # a few figures written out, so a silent change in the release is noticed
    assert stats["by_summarizer"]["CLAUDE-3-OPUS"]["label_percentages"]["Yes"] == pytest.approx(88.91, abs=0.01)
    assert stats["by_summarizer"]["MIXTRAL"]["claims_per_summary_mean"] == pytest.approx(28.2, abs=0.01)
    assert stats["overall"]["claims"] == 2446


def test_data_stats_fables_cli(fables_path, tmp_path):
    out = tmp_path / "stats.json"
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "booklens", "data", "stats", "fables", "--data", str(fables_path),
                           "-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    labels, counts = independent_table2(fables_path)
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.strip()}
    for model in labels:
        total = sum(labels[model].values())
        row = rows[model]  # name, summaries, claims, mean, (std), faithful, unfaithful, partial, can't verify
        assert int(row[1]) == len(counts[model]) and int(row[2]) == total
        assert float(row[3]) == pytest.approx(sum(counts[model]) / len(counts[model]), abs=0.006)
        assert float(row[5]) == pytest.approx(100 * labels[model]["Yes"] / total, abs=0.006)
        assert float(row[6]) == pytest.approx(100 * labels[model]["No"] / total, abs=0.006)
        assert float(row[7]) == pytest.approx(100 * labels[model]["PartialSupport"] / total, abs=0.006)
        assert float(row[8]) == pytest.approx(100 * labels[model]["Inapplicable"] / total, abs=0.006)
    saved = json.loads(out.read_text())
    assert saved["overall"]["claims"] == 2446


@pytest.mark.parametrize("content", [b"[" * 100_000, b"\xff\xfe\x00{", b"", b'{"Book": {"GPT-4": {"summary": "S.", '
                                     b'"claims": {"1": {"claim": "c", "label": "Yes"}, "01": {"claim": "d", "label": "No"}}}}}'])
def test_data_stats_fables_malformed_files_exit_with_one_line(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "booklens", "data", "stats", "fables", "--data", str(bad)],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "internal error" not in lines[0] and proc.stdout == ""


def test_data_stats_fables_damaged_zip_exits_with_one_line(tmp_path):
    archive = tmp_path / "FABLES.json.zip"
    _damaged_zip(archive, zipfile.ZIP_DEFLATED)
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "booklens", "data", "stats", "fables", "--data", str(archive)],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "damaged zip archive" in lines[0], proc.stderr


def test_data_stats_fables_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"FABLES": {"Book": {"GPT-4": {"summary": 3}}}}))
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "booklens", "data", "stats", "fables", "--data", str(bad)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("error: malformed FABLES data") and len(proc.stderr.strip().splitlines()) == 1


SHARED_FABLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "fables" / "FABLES.json"


@pytest.mark.skipif(not SHARED_FABLES.is_file(), reason=f"no shared FABLES copy at {SHARED_FABLES}")
def test_data_stats_fables_reads_the_shared_copy_like_calibrate(tmp_path):
    """Without --data, `data stats fables` reads the same default as `calibrate --fables-data`:
    the shared copy, not a download into the cache."""
    from booklens.data.fables import default_fables_path

    assert default_fables_path() == SHARED_FABLES
    cache = tmp_path / "cache"
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "booklens", "data", "stats", "fables"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "CLAUDE-3-OPUS" in proc.stdout
    assert not (cache / "data" / "fables" / "FABLES.json").exists()


def test_statistics_of_a_summarizer_without_claims_or_with_one_summary_are_not_zeros():
    """Shares of no claims, and the spread of one summary's count, are unknown: "-", not 0.00."""
    from booklens.data.fables import format_statistics

    data = {"Book A": {"GPT-4": {"summary": "Ann sails.", "claims": {}},
                       "MIXTRAL": {"summary": "Ann flies.", "claims": {"0": {"claim": "Ann flies.", "label": "Yes"}}}},
            "Book B": {"MIXTRAL": {"summary": "Cal sings.", "claims": {"0": {"claim": "Cal sings.", "label": "No"},
                                                                       "1": {"claim": "Cal is a bird.", "label": "No"}}}}}
    stats = label_statistics(parse_fables(data))
    gpt4, mixtral = stats["by_summarizer"]["GPT-4"], stats["by_summarizer"]["MIXTRAL"]
    assert gpt4["claims"] == 0 and gpt4["claims_per_summary_mean"] == 0.0
    assert gpt4["claims_per_summary_std"] is None and set(gpt4["label_percentages"].values()) == {None}
    assert mixtral["claims_per_summary_std"] == pytest.approx(0.71, abs=0.005)
    assert mixtral["label_percentages"] == {"Yes": 33.33, "No": 66.67, "PartialSupport": 0.0, "Inapplicable": 0.0}
    assert stats["overall"]["claims_per_summary_std"] == 1.0
    rows = {line.split()[0]: line.split() for line in format_statistics(stats).splitlines()[2:]}
    assert rows["GPT-4"] == ["GPT-4", "1", "0", "0.00", "(-)", "-", "-", "-", "-"]
    assert rows["MIXTRAL"] == ["MIXTRAL", "2", "3", "1.50", "(0.71)", "33.33", "66.67", "0.00", "0.00"]


def test_the_fables_folder_is_read_as_the_release_in_it_as_compile_reads_it(tmp_path):
    """`data stats fables --data FOLDER` (and every loader) takes the FABLES folder, as `compile --data` does."""
    from booklens.optimizers.tasks import data_files, get_task

    (tmp_path / "FABLES.json").write_text(json.dumps(TINY), encoding="utf-8")
    (tmp_path / "LICENSE").write_text("not data", encoding="utf-8")
    assert [(s.book, s.summarizer) for s in load_fables(tmp_path)] == [(s.book, s.summarizer)
                                                                       for s in load_fables(tmp_path / "FABLES.json")]
    assert data_files(get_task("verification"), tmp_path) == [tmp_path / "FABLES.json"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(BooklensError, match="FABLES data not found: .*empty/FABLES.json"):
        load_fables(tmp_path / "empty")


def test_the_fables_label_names_have_one_source():
    """The dataset's four label names are written once: the loader, the records and the mapping onto
    booklens' labels read them from `booklens.vocabulary`, pairing them with its labels in order."""
    from typing import get_args

    from booklens.data import fables
    from booklens.records import ClaimVerdict
    from booklens.signatures.faithfulness import FABLES_LABELS, LABEL_TO_FABLES
    from booklens.vocabulary import CLAIM_LABELS, FABLES_LABEL_NAMES

    assert fables.FABLES_LABEL_NAMES is FABLES_LABEL_NAMES
    assert get_args(get_args(ClaimVerdict.model_fields["fables_label"].annotation)[0]) == FABLES_LABEL_NAMES
    assert list(FABLES_LABELS.items()) == list(zip(FABLES_LABEL_NAMES, CLAIM_LABELS))
    assert LABEL_TO_FABLES == {"faithful": "Yes", "unfaithful": "No", "partial support": "PartialSupport",
                               "can't verify": "Inapplicable"}


def test_load_fables_given_summaries_instead_of_a_path_is_one_line(tmp_path):
    """A library caller who hands the loaded summaries back (`fables_splits(summaries)`) is told in one
    short line, not a TypeError, nor a line holding the whole list."""
    from booklens.data.fables import fables_splits, load_fables

    summaries = [object()] * 100
    for call in (lambda: load_fables(summaries), lambda: fables_splits(summaries)):
        with pytest.raises(BooklensError) as excinfo:
            call()
        assert str(excinfo.value) == ("the FABLES data must be a path, not a list (split_summaries splits loaded "
                                      "summaries)")
