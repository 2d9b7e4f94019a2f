"""report.html: structure and accessibility, escaping of everything a book or a model writes, rebuilding
from the records, bad run directories, and the page in headless Chromium (skipped without chromium)."""

from __future__ import annotations

import html
import json
import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from booklens.errors import BooklensError
from booklens.testing import FakeOpenAIServer, ScriptedLM, run_command

REPO = Path(__file__).resolve().parents[1]
STORY = REPO / "examples" / "sample_story.txt"
ERROR_TYPES = ["entity omission", "event omission", "causal omission", "salience", "discontinuity",
               "duplication", "inconsistency", "language"]


# ---------------------------------------------------------------------------
# Helpers: a small DOM, Chromium


class Dom(HTMLParser):
    """Elements with their attributes and text (entities decoded), from an HTML string."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "wbr", "source", "col", "area", "base", "embed", "track"}

    def __init__(self, markup: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": {k: (v or "") for k, v in attrs}, "parts": []}
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for element in self._open:
            element["parts"].append(data)

    def find(self, tag=None, cls=None, **attrs) -> list[dict]:
        found = []
        for e in self.elements:
            if tag and e["tag"] != tag:
                continue
            if cls and cls not in e["attrs"].get("class", "").split():
                continue
            if any(e["attrs"].get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            found.append(e)
        return found

    def by_id(self, id_: str) -> dict:
        matches = [e for e in self.elements if e["attrs"].get("id") == id_]
        assert len(matches) == 1, f"id {id_!r} found {len(matches)} times"
        return matches[0]

    @staticmethod
    def text(element: dict) -> str:
        return "".join(element["parts"])


def chromium_exe() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.skip("chromium is not installed (`install.sh --test` installs Debian's chromium package)")
    return exe


def chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    args = [chromium_exe(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra, page.as_uri()]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def console_messages(stderr: str) -> list[str]:
    """Console output of the page (log, errors, CSP violations) as Chromium logs it."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def load_in_chromium(page: Path, tmp_path: Path) -> tuple[Dom, list[str]]:
    proc = chromium(page, tmp_path / "profile-dom", "--dump-dom")
    return Dom(proc.stdout), console_messages(proc.stderr)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


# ---------------------------------------------------------------------------
# Runs with a scripted LM (in process)


def scripted(summary: str, *, questions=None, claims=None, reason="Passage 1 says so.", failing_sentence=None,
             failing_claim=None):
    questions = questions or ["Who is Zed?"]
    claims = claims or ["Maren Holt is a bookbinder.", "Zed hides the key."]

    def respond(call):
        if call.output_fields == ["summary"] or "summary" in call.output_fields and len(call.output_fields) == 1:
            return {"summary": summary}
        if call.wants("verdict"):
            sentence = call.inputs.get("sentence", "")
            if failing_sentence and failing_sentence in sentence:
                return "this is not JSON"
            if "Zed" in sentence:
                return {"verdict": "confusion", "questions": questions, "error_types": ["entity omission",
                                                                                       "causal omission"]}
            return {"verdict": "no confusion", "questions": [], "error_types": []}
        if call.wants("claims"):
            return {"claims": claims}
        if call.wants("label"):
            claim = call.inputs.get("claim", "")
            if failing_claim and failing_claim in claim:
                return {"label": "somewhat true", "reason": "?", "supporting_passages": [], "refuting_passages": []}
            label = "unfaithful" if "Zed" in claim else "faithful"
            return {"label": label, "reason": reason, "supporting_passages": [1] if label == "faithful" else [],
                    "refuting_passages": [2] if label == "unfaithful" else []}
        if call.output_fields:
            return {name: summary for name in call.output_fields}
        return summary

    return ScriptedLM(respond)


SYSTEM_OPTIONS = {"method", "chunk_size", "context_window", "max_summary_tokens", "summary_file", "summary_text"}


def execute(tmp_path: Path, lm, *, book: Path = STORY, out: str = "run", **options):
    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book

    given = {"summary_file", "summary_text"} & options.keys()
    made = {} if given else {"remove_artifacts": False}  # a given summary is judged as it is
    system = SystemConfig(**made, **{k: v for k, v in options.items() if k in SYSTEM_OPTIONS})
    judge = JudgeConfig(**{k: v for k, v in options.items() if k not in SYSTEM_OPTIONS})
    output = tmp_path / out
    run_book(book, output, system, judge, lms=FixedLMPool(lm, cache_dir=tmp_path / "cache"), concurrency=2,
             notify=lambda message: None)
    return output


STORY_SUMMARY = ("Maren Holt, a bookbinder, rebinds the ledger of Tobias Wren, the disgraced lighthouse keeper. "
                 "Zed hides the key. The ledger shows the lamp went dark because the fuel was given away. "
                 "A garbled sentence nobody can judge. The town learns the truth.")


def test_coherence_is_judged_beside_claims_and_verification(tmp_path):
    """Coherence needs only the summary: its calls are in flight while the claims are split."""
    import threading

    lm = scripted(STORY_SUMMARY)
    respond = lm.backend.responder
    claims_asked = threading.Event()
    saw_claims_in_flight: list[bool] = []

    def respond_in_order(call):
        if call.wants("claims"):
            claims_asked.set()
        elif call.wants("verdict"):
            # One after the other, this would wait for a claims call that comes only afterwards.
            saw_claims_in_flight.append(claims_asked.wait(timeout=30))
        return respond(call)

    lm.backend.responder = respond_in_order
    output = execute(tmp_path, lm)
    run = json.loads((output / "run.json").read_text())
    assert run["complete"] and list(run["steps"]) == ["summary", "coherence", "claims", "faithfulness"]
    assert saw_claims_in_flight and all(saw_claims_in_flight)


@pytest.fixture(scope="module")
def hier_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hier")
    lm = scripted(STORY_SUMMARY, failing_sentence="garbled", failing_claim="key",
                  claims=["Maren Holt is a bookbinder.", "Tobias Wren kept the light.", "Zed hides the key."])
    out = execute(tmp, lm, chunk_size=512, context_window=2048, max_summary_tokens=200, k=3)
    return out


def test_report_structure_and_accessibility(hier_run):
    page = (hier_run / "report.html").read_text()
    dom = Dom(page)
    # landmarks and headings
    for tag in ("header", "nav", "main", "footer"):
        assert len(dom.find(tag)) == 1, tag
    assert len(dom.find("h1")) == 1
    assert [Dom.text(e) for e in dom.find("h2")] == ["Scores", "Summary", "Error types", "Claims",
                                                     "How the summary was made", "Run"]
    assert dom.find("html")[0]["attrs"].get("lang") == "en"
    # self-contained: a strict CSP, no script, nothing loaded from anywhere
    csp = dom.find("meta", http_equiv="Content-Security-Policy")
    assert csp and "default-src 'none'" in csp[0]["attrs"]["content"]
    assert not dom.find("script") and not dom.find("img") and not dom.find("link") and not dom.find("iframe")
    assert all(e["attrs"]["href"].startswith("#") for e in dom.find("a"))
    assert "http://" not in page.split("<main")[0] and "url(" not in page

    # score cards: BooookScore and the share of each label
    cards = {Dom.text(e).strip() for e in dom.find(cls="card")}
    assert any(c.startswith("BooookScore75.0") for c in cards), cards  # 3 of 4 judged sentences
    # the shares are of the verified claims; the one without a valid label is counted apart
    assert any(c.startswith("Faithful100.0%2 of 2 verified claims") for c in cards), cards
    assert any(c.startswith("Not verified1of 3 claims") for c in cards), cards

    # confusing sentence: highlighted, focusable, described by a tooltip with its types and questions
    marks = dom.find("mark", tabindex="0")
    assert len(marks) == 2  # the confusing sentence and the one that could not be judged
    tips = [dom.by_id(m["attrs"]["aria-describedby"]) for m in marks]
    assert all(t["attrs"].get("role") == "tooltip" for t in tips)
    assert Dom.text(marks[0]).startswith("Zed hides the key.")
    assert "entity omission, causal omission" in Dom.text(tips[0]) and "Who is Zed?" in Dom.text(tips[0])
    assert Dom.text(marks[1]).startswith("A garbled sentence") and "Not judged" in Dom.text(tips[1])
    assert ".sent mark:hover + .tip, .sent mark:focus + .tip" in page  # shown on hover and on keyboard focus
    # colours come with text: a visible marker on each highlight, labels on every claim
    assert all(m_flag for m_flag in (dom.find("span", cls="flag")))
    # numbered as the list of confusing sentences numbers them; the unjudged one has a '?'
    assert [Dom.text(f) for f in dom.find("span", cls="flag")] == ["1", "?"]
    # the error-type chart: all eight types with their rate as text
    rows = dom.find("table", cls="chart")[0]
    assert all(f"{t}" in Dom.text(rows) for t in ERROR_TYPES)
    assert "25.0% (1 of 4)" in Dom.text(rows)  # entity omission: 1 of the 4 judged sentences (as metrics count)
    assert "Share of the summary's 4 judged sentences" in Dom.text(rows)

    # claims with labels, reasons and evidence placed in the book
    claims = dom.find("li", cls="claim")
    assert len(claims) == 3
    first = Dom.text(claims[0])
    assert "faithful" in first and "Passage 1 says so." in first and "characters " in first and "into the book" in first
    assert "Not verified" in Dom.text(claims[2])
    assert dom.find("blockquote")

    # the merge tree: one collapsible node per summary node, the root open
    summary = json.loads((hier_run / "summary.json").read_text())
    details = dom.find("details")
    tree = [d for d in details if "level " in Dom.text(d)]
    assert len(tree) == len(summary["nodes"]) and "open" in tree[0]["attrs"]
    assert "Book chunk 0" in page


def test_report_is_rebuilt_identically_from_the_records(hier_run, tmp_path):
    from booklens.reports import write_report

    target = write_report(hier_run, tmp_path / "again.html")
    assert target.read_bytes() == (hier_run / "report.html").read_bytes()


def test_an_unfinished_run_still_renders(hier_run, tmp_path):
    from booklens.reports import load_run, render_report

    partial = tmp_path / "partial"
    shutil.copytree(hier_run, partial)
    run = json.loads((partial / "run.json").read_text())
    run["complete"] = False
    del run["steps"]["faithfulness"]
    (partial / "run.json").write_text(json.dumps(run))
    (partial / "faithfulness.json").unlink()
    page = render_report(load_run(partial))
    assert "This run is not finished" in page and "The claims were not verified in this run" in page


def test_claims_whose_verification_failed_are_still_listed(tmp_path):
    """The claims were split (and paid for) but not one could be verified: the page lists them under
    the notice of the failed step, instead of an empty claims section."""
    claims = ["Maren Holt binds books for a living.", "Tobias Wren & the <lamp> went dark."]
    lm = scripted(STORY_SUMMARY, claims=claims, failing_claim=" ")  # no verdict for any claim
    out = execute(tmp_path, lm, chunk_size=512, context_window=2048, max_summary_tokens=200, k=3)
    run = json.loads((out / "run.json").read_text())
    assert list(run["failures"]) == ["faithfulness"] and "claims" in run["steps"]
    dom = Dom((out / "report.html").read_text())
    section = Dom.text(dom.by_id("claims"))
    assert "The claims were not verified in this run" in section
    assert [Dom.text(e) for e in dom.find("li", cls="claim")] == [f"Claim {i}{c}" for i, c in enumerate(claims, 1)]
    assert "Some steps failed" in (out / "report.html").read_text()


def test_a_record_that_is_not_the_one_run_json_lists_is_said_on_the_page_and_by_the_command(hier_run, tmp_path):
    """A step record replaced after the run wrote it (by another run, a kill between the record and
    run.json, a hand edit) sits beside a run.json that describes another result: the page still shows
    it, but says so, and so does `booklens report`."""
    changed = _copy(hier_run, tmp_path)
    record = json.loads((changed / "coherence.json").read_text())
    record["batch_size"] = 4  # as a run with other settings would have written it
    (changed / "coherence.json").write_text(json.dumps(record))
    result = run_command(["report", changed])
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "coherence.json" in notes[0] and "run.json" in notes[0], result.stderr
    alert = [Dom.text(e) for e in Dom((changed / "report.html").read_text()).find("div", role="alert")]
    assert len(alert) == 1 and "coherence.json" in alert[0], alert
    # the records as the run wrote them: no note, no alert
    intact = run_command(["report", _copy(hier_run, tmp_path / "intact")])
    assert intact.returncode == 0 and "note:" not in intact.stderr, intact.stderr
    assert "coherence.json" not in (hier_run / "report.html").read_text()


def test_a_cut_off_verdict_says_its_passages_are_unknown(hier_run, tmp_path):
    from booklens.reports import load_run, render_report

    note = "answer was cut off at its token limit"
    assert note not in (hier_run / "report.html").read_text()
    cut = tmp_path / "cut"
    shutil.copytree(hier_run, cut)
    record = json.loads((cut / "faithfulness.json").read_text())
    record["claims"][0]["truncated"] = True
    (cut / "faithfulness.json").write_text(json.dumps(record))
    assert render_report(load_run(cut)).count(note) == 1


def low_agreement_calibration(judge: str, lm: str, program) -> dict:
    """A stored calibration with the figures of a judge that finds no unfaithful claim / low kappa."""
    from booklens.judges import calibration_key, judge_mode, program_fingerprint

    key = calibration_key(judge, judge_mode(judge, program), lm, program_fingerprint(program))
    if judge == "coherence":
        return {"key": key, "sample_name": "BooookScore's test split (8 summaries of 4 books)",
                "counts": {"tp": 3, "human_confusing": 31},
                "figures": {"f1": {"value": 0.12, "ci95": [0.05, 0.2], "n": 318},
                            "kappa": {"value": 0.08, "ci95": [0.01, 0.15], "n": 318}}}
    return {"key": key, "sample_name": "FABLES' test split (8 books, 813 claims)",
            "counts": {"unfaithful": 96, "unfaithful_found": 0},
            "figures": {"f1": {"faithful": {"value": 0.93, "ci95": [0.91, 0.95], "n": 813},
                               "unfaithful": {"value": 0.0, "ci95": [0.0, 0.0], "n": 813}},
                        "accuracy": {"value": 0.88, "ci95": [0.85, 0.9], "n": 813}}}


def judged_copy(hier_run, tmp_path, *, calibrated: set) -> Path:
    """The run directory with judge objects in its records: `calibrated` judges have a stored calibration."""
    from booklens.judges import judge_info, load_judge

    run_dir = tmp_path / "judged"
    shutil.copytree(hier_run, run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    lm = run["lm"]
    for judge, record in (("coherence", "coherence.json"), ("verification", "faithfulness.json")):
        program = load_judge(judge)
        store = {}
        if judge in calibrated:
            entry = low_agreement_calibration(judge, lm, program)
            store[entry["key"]] = entry
        data = json.loads((run_dir / record).read_text())
        data["judge"] = judge_info(judge, program, lm, store=store).model_dump(mode="json")
        (run_dir / record).write_text(json.dumps(data))
        run.setdefault("judges", {})[judge] = data["judge"]  # as the run that wrote the record lists it
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


def test_the_judge_cards_name_the_figure_behind_each_warning(hier_run, tmp_path):
    from booklens.reports import load_run, render_report

    dom = Dom(render_report(load_run(judged_copy(hier_run, tmp_path, calibrated={"verification"}))))
    cards = dom.find("li", cls="judge")
    assert [Dom.text(c).split(" judge")[0] for c in cards] == ["Coherence", "Claim verification"]
    coherence, verification = (Dom.text(c) for c in cards)
    assert "not calibrated" in coherence and "was never measured" in coherence
    assert "this judge found 0 of 96 unfaithful claims on FABLES' test split" in verification
    assert "F1 unfaithful 0.00 [0.00, 0.00]" in verification and "default few-shot program" in verification
    warnings = dom.find("p", cls="warning")
    assert len(warnings) == 2 and all(Dom.text(w).startswith("Warning:") for w in warnings)
    score = next(Dom.text(c) for c in dom.find("li", cls="card") if Dom.text(c).startswith("BooookScore"))
    assert "1 of 5 sentences could not be judged: left out of the score" in score


def test_a_judge_card_names_the_lm_its_program_was_compiled_with_when_another_runs_it():
    from booklens.records import JudgeInfo
    from booklens.reports import judge_card

    def card(lm: str, compiled_with):
        return Dom.text(Dom(judge_card("verification", JudgeInfo(
            task="verification", mode="four-way", program="verify.json", program_sha256="0" * 64, demos=2, lm=lm,
            compiled_with=compiled_with))).find("li", cls="judge")[0])

    assert "compiled with openai/gpt-4o, whose answers chose its demos" in card("openai/gpt-4o-mini", "openai/gpt-4o")
    assert "compiled with" not in card("openai/gpt-4o", "openai/gpt-4o")
    assert "compiled with" not in card("openai/gpt-4o", None)


def _verification_judge(evidence=None, failed=0):
    from booklens.records import JudgeInfo

    calibration = {"sample_name": "FABLES' test split (1 book, 40 claims)",
                   "counts": {"claims": 40, "failed": failed, "unfaithful": 4, "unfaithful_found": 2},
                   "figures": {"f1": {"faithful": {"value": 0.9}, "unfaithful": {"value": 0.5}},
                               "accuracy": {"value": 0.8}}}
    return JudgeInfo(task="verification", mode="four-way", program="default", program_sha256="0" * 64, demos=6,
                     lm="openai/x", calibration=calibration, evidence=evidence)


def _card_text(info) -> str:
    from booklens.reports import judge_card

    return Dom.text(Dom(judge_card("verification", info)).find("li", cls="judge")[0])


def test_the_judge_card_says_how_many_calibration_items_got_no_verdict_as_the_judge_line_does():
    from booklens.judges import judge_line

    info = _verification_judge(failed=3)
    note = "3 of 40 claims got no valid verdict: counted as wrong"
    assert note in judge_line(info) and note in _card_text(info)
    assert "no valid verdict" not in judge_line(_verification_judge()) + _card_text(_verification_judge())


def test_the_judge_card_names_the_server_as_the_judge_line_does():
    """A self-hosted server answers to any model name: the line said "on openai/x at URL", the card
    only "on openai/x"."""
    from booklens.judges import judge_line

    info = _verification_judge()
    info.api_base = "http://127.0.0.1:8080/v1"
    where = "on openai/x at http://127.0.0.1:8080/v1"
    assert where in judge_line(info) and where in _card_text(info)
    assert " at " not in _card_text(_verification_judge()).split("; ")[0]


def test_the_judge_line_and_card_say_the_calibration_had_the_annotators_evidence_when_the_run_did_not():
    from booklens.judges import judge_line

    for mode, had in (("bm25", "bm25 evidence"), ("none", "none")):
        info = _verification_judge(evidence=mode)
        clause = f"measured with the annotators' evidence quotes, where the verdicts here had {had}"
        assert clause in judge_line(info) and clause in _card_text(info)
    # The calibration's own setting, or a record that does not say, gets no clause.
    for info in (_verification_judge(evidence="given"), _verification_judge()):
        assert "annotators' evidence" not in judge_line(info) + _card_text(info)


def verification_card_with(run_dir: Path, run_json_judge: dict) -> str:
    """The report's verification judge card once run.json lists `run_json_judge` for it."""
    from booklens.reports import load_run, render_report

    run = json.loads((run_dir / "run.json").read_text())
    run["judges"] = {"verification": run_json_judge}
    (run_dir / "run.json").write_text(json.dumps(run))
    cards = Dom(render_report(load_run(run_dir))).find("li", cls="judge")
    return next(Dom.text(c) for c in cards if Dom.text(c).startswith("Claim verification"))


def test_a_record_kept_from_an_earlier_version_gets_compiled_with_from_run_json(hier_run, tmp_path):
    """A resumed run reuses a step record written before judges named `compiled_with`; run.json, written
    again, names it for the same program, and the report's card follows run.json."""
    run_dir = judged_copy(hier_run, tmp_path, calibrated=set())
    record = json.loads((run_dir / "faithfulness.json").read_text())
    record["judge"].pop("compiled_with")  # as the earlier version wrote it
    (run_dir / "faithfulness.json").write_text(json.dumps(record))

    listed = {**record["judge"], "compiled_with": "openai/gpt-4o"}
    assert "compiled with openai/gpt-4o" in verification_card_with(run_dir, listed)
    another_program = {**listed, "program_sha256": "f" * 64}
    assert "compiled with" not in verification_card_with(run_dir, another_program)


def test_a_reused_record_shows_the_calibration_run_json_has_for_the_same_judge(hier_run, tmp_path):
    """A rerun after `booklens calibrate` reuses the step record (not calibrated when it was made) and
    writes run.json with the calibration; the report's card follows run.json for the same judge."""
    calibrated = json.loads((judged_copy(hier_run, tmp_path / "a", calibrated={"verification"})
                             / "faithfulness.json").read_text())["judge"]
    run_dir = judged_copy(hier_run, tmp_path / "b", calibrated=set())
    assert json.loads((run_dir / "faithfulness.json").read_text())["judge"]["calibration"] is None

    assert "F1 unfaithful 0.00 [0.00, 0.00]" in verification_card_with(run_dir, calibrated)
    another_judge = {**calibrated, "lm": "openai/another"}  # its figures are another judge's
    assert "not calibrated" in verification_card_with(run_dir, another_judge)


def test_a_highlight_is_numbered_as_the_list_of_confusing_sentences_numbers_it(hier_run, tmp_path):
    """An unjudged sentence before a confusing one takes no number: the confusing one is '1', as in
    the list below the summary."""
    from booklens.reports import load_run, render_report

    run_dir = tmp_path / "unjudged-first"
    shutil.copytree(hier_run, run_dir)
    record = json.loads((run_dir / "coherence.json").read_text())
    first = record["sentences"][0]
    assert first["status"] == "ok" and not first["confusing"]
    first.update(status="failed", confusing=None, error="no valid answer")
    record["n_failed"] += 1
    (run_dir / "coherence.json").write_text(json.dumps(record))
    dom = Dom(render_report(load_run(run_dir)))
    assert [Dom.text(f) for f in dom.find("span", cls="flag")] == ["?", "1", "?"]


def test_a_calibrated_judge_with_good_agreement_has_no_warning(hier_run, tmp_path):
    from booklens.judges import judge_info, load_judge

    program = load_judge("coherence")
    entry = low_agreement_calibration("coherence", "scripted", program)
    entry["figures"]["kappa"]["value"] = 0.5
    info = judge_info("coherence", program, "scripted", store={entry["key"]: entry})
    assert info.warning is None and info.calibration["figures"]["kappa"]["value"] == 0.5


def test_judge_card_and_warning_in_chromium(hier_run, tmp_path):
    """The screenshot shows the judge cards and their red warnings (counted by the warning's background)."""
    image = pytest.importorskip("PIL.Image")
    from booklens.reports import write_report

    plain_dir = tmp_path / "plain"  # the records without any judge object
    shutil.copytree(hier_run, plain_dir)
    for name, key in (("coherence.json", "judge"), ("faithfulness.json", "judge"), ("run.json", "judges")):
        record = json.loads((plain_dir / name).read_text())
        record.pop(key, None)
        (plain_dir / name).write_text(json.dumps(record))
    judged = judged_copy(hier_run, tmp_path, calibrated={"coherence", "verification"})
    counts = {}
    for name, run_dir in (("plain", plain_dir), ("judged", judged)):
        page = write_report(run_dir)
        dom, console = load_in_chromium(page, tmp_path / name)
        assert console == []
        shot = tmp_path / f"{name}.png"
        chromium(page, tmp_path / f"profile-{name}", "--window-size=1280,1400", f"--screenshot={shot}",
                 "--hide-scrollbars")
        with image.open(shot) as im:
            rgb = im.convert("RGB")
            pixels = rgb.get_flattened_data() if hasattr(rgb, "get_flattened_data") else rgb.getdata()
            counts[name] = sum(1 for p in pixels if tuple(p) == (253, 236, 234))  # .warning background
        if name == "judged":
            assert len(dom.find("li", cls="judge")) == 2 and len(dom.find("p", cls="warning")) == 2
    assert counts["plain"] == 0
    assert counts["judged"] > 10_000, counts


def test_a_given_summarize_record_keeps_its_merge_tree(hier_run, tmp_path):
    lm = scripted("unused", claims=["Maren Holt is a bookbinder."])
    out = execute(tmp_path, lm, summary_file=hier_run / "summary.json")
    assert not [c for c in lm.backend.calls if c.output_fields == ["summary"]], "the given summary was rewritten"
    run = json.loads((out / "run.json").read_text())
    assert run["summary_source"] == "given" and run["config"]["method"] is None
    # the model that wrote it is the record's, not the judge's that only read it
    written_by = json.loads((hier_run / "summary.json").read_text())["lm"]
    assert run["lm"] == run["config"]["lm"] == written_by
    given_text = tmp_path / "plain.txt"
    given_text.write_text("Maren Holt is a bookbinder.", encoding="utf-8")
    plain = execute(tmp_path / "plain", scripted("unused", claims=["Maren Holt is a bookbinder."]),
                    summary_file=given_text)
    assert json.loads((plain / "run.json").read_text())["lm"] == "unknown (given summary)"
    assert (out / "summary.json").read_bytes() == (hier_run / "summary.json").read_bytes()
    page = (out / "report.html").read_text()
    assert "Hierarchical merging" in page and "Zed hides the key." in page


def test_incremental_summary_shows_its_update_steps(tmp_path):
    lm = scripted("Maren rebinds the ledger. Zed hides the key. The town learns the truth.")
    out = execute(tmp_path, lm, method="inc", chunk_size=1024, max_summary_tokens=200, evidence="none")
    page = (out / "report.html").read_text()
    summary = json.loads((out / "summary.json").read_text())
    dom = Dom(page)
    assert "Incremental updating" in page
    steps = [d for d in dom.find("details") if "level " in Dom.text(d)]
    assert len(steps) == len(summary["nodes"]) >= 2
    assert "No evidence passages were shown" in page  # --evidence none
    # The verifier's judge object, in run.json and in the step's record, keeps the evidence it judged with.
    assert json.loads((out / "run.json").read_text())["judges"]["verification"]["evidence"] == "none"
    assert json.loads((out / "faithfulness.json").read_text())["judge"]["evidence"] == "none"


def test_a_step_whose_input_was_kept_says_so_in_the_merge_tree():
    from booklens.records import SummaryNode
    from booklens.reports import _node_summary

    kept = SummaryNode(id="clean", level=3, kind="clean", text="Mara keeps the light.", tokens=5, fallback=True)
    assert "input kept" in _node_summary(kept)
    assert "input kept" not in _node_summary(kept.model_copy(update={"fallback": False}))
    long = _node_summary(kept.model_copy(update={"dropped_rewrite_tokens": 1234}))
    assert "the rewrite ran to 1,234 tokens, longer than the summary: summary kept" in long
    assert "no answer with words" not in long
    unfinished = _node_summary(kept.model_copy(update={"dropped_rewrite_tokens": 271, "cut_off": True}))
    assert "the rewrite was left unfinished: summary kept" in unfinished and "271" not in unfinished
    # a rewrite that dropped most of the summary's words is no longer one
    dropped = _node_summary(kept.model_copy(update={"dropped_rewrite_tokens": 3}))
    assert "the rewrite kept too little of the summary (3 tokens): summary kept" in dropped
    assert "longer than the summary" not in dropped


def test_the_merge_tree_tells_a_trimmed_answer_from_one_the_token_cap_stopped():
    """`truncated` is booklens trimming an answer to its budget; `cut_off` is the model's answer
    stopping at the token cap; a node kept whole over its budget is the only one 'over budget'."""
    from booklens.records import SummaryNode
    from booklens.reports import _node_summary

    node = SummaryNode(id="L1.0", level=1, kind="chunk", text="Mara keeps the light.", tokens=120, budget=130)
    assert "120 of 130 tokens" in _node_summary(node)
    trimmed = _node_summary(node.model_copy(update={"over_budget": True, "truncated": True}))
    assert "trimmed to the budget" in trimmed and "over budget" not in trimmed and "token cap" not in trimmed
    capped = _node_summary(node.model_copy(update={"cut_off": True}))
    assert "the answer stopped at the token cap" in capped and "trimmed" not in capped
    kept = _node_summary(node.model_copy(update={"tokens": 200, "over_budget": True}))
    assert "200 of 130 tokens" in kept and "over budget" in kept


# ---------------------------------------------------------------------------
# Nothing a book or a model writes becomes markup

EVIL = '<script>document.documentElement.setAttribute("data-pwned","1");console.log("PWNED")</script>'
EVIL_IMG = "<img src=x onerror=\"console.log('PWNED-img')\">"
BOOK = (f"The Harbor Light\n\nMara kept the light at Gull Rock &amp; she wrote &lt;b&gt;every&lt;/b&gt; night "
        f"in her log. {EVIL}\n\nOne night Zed took the key. {EVIL_IMG} The lamp went dark and a ship struck "
        f"the rocks.\n\nIn the morning Mara found the key under the stairs <b>bold</b> & the town forgave her.\n")
SUMMARY = (f"Mara keeps the light {EVIL} at Gull Rock. Zed <i>took</i> the key &amp; ran. "
           f"The lamp went dark {EVIL_IMG}.")
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "a", "header", "h1", "h2", "h3", "p", "nav", "ul",
                "ol", "li", "main", "section", "div", "span", "mark", "br", "blockquote", "details", "summary",
                "table", "caption", "thead", "tbody", "tr", "th", "td", "dl", "dt", "dd", "code", "strong", "b",
                "footer"}


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("evil")
    book = tmp / "x<img src=y onerror=alert(1)>.txt"  # a file name is text too
    book.write_text(BOOK, encoding="utf-8")
    summary = tmp / "summary.txt"
    summary.write_text(SUMMARY, encoding="utf-8")
    lm = scripted(SUMMARY, questions=[f"Who is Zed? {EVIL}", "</span></mark></div><script>alert(2)</script>"],
                  claims=[f"Mara keeps the light {EVIL}", "Zed <i>took</i> the key &amp; ran."],
                  reason=f"Because </details></li>{EVIL_IMG} &lt;b&gt;")
    return execute(tmp, lm, book=book, summary_file=summary, k=2, passage_tokens=64)


def test_book_and_model_text_is_escaped_in_the_page(evil_run):
    page = (evil_run / "report.html").read_text()
    dom = Dom(page)
    tags = {e["tag"] for e in dom.elements}
    assert tags <= ALLOWED_TAGS, tags - ALLOWED_TAGS
    assert not [e for e in dom.elements if any(k.startswith("on") or k in ("src", "srcdoc") for k in e["attrs"])]
    assert "<script" not in page.lower() and "<img" not in page.lower() and "<i>" not in page
    # ...and shown as text: the book's, the summary's and the model's
    assert page.count(html.escape(EVIL)) >= 4  # summary, question, claim, evidence passage
    assert html.escape("</span></mark></div><script>alert(2)</script>") in page
    assert "&amp;amp;" in page and "&amp;lt;b&amp;gt;" in page  # entities in the input stay visible as typed
    assert "booklens report: x&lt;img src=y onerror=alert(1)&gt;.txt</title>" in page
    text = "".join(Dom.text(e) for e in dom.find("main"))
    assert EVIL in text and "Zed <i>took</i> the key &amp; ran." in text


def test_injected_script_does_not_run_in_chromium(evil_run, tmp_path):
    page = evil_run / "report.html"
    # The CSP alone would block inline scripts; load a copy without it too, to show escaping alone holds.
    no_csp = tmp_path / "no_csp.html"
    source = page.read_text()
    start = source.index('<meta http-equiv="Content-Security-Policy"')
    no_csp.write_text(source[:start] + source[source.index(">", start) + 1:])
    for target in (page, no_csp):
        dom, console = load_in_chromium(target, tmp_path)
        assert console == [], console  # no console output at all: no script ran, nothing was blocked
        root = dom.find("html")[0]
        assert "data-pwned" not in root["attrs"]
        assert not dom.find("script") and not dom.find("img") and not dom.find("i")
        assert EVIL in "".join(Dom.text(e) for e in dom.find("main"))


# ---------------------------------------------------------------------------
# Bad run directories: one-line errors


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run_dir, target)
    return target


def _edit(path: Path, **changes) -> Path:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path.parent


def _write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path.parent


def _remove(path: Path) -> Path:
    path.unlink()
    return path.parent


@pytest.mark.parametrize("damage, pattern", [
    (lambda d: d / "run.json", "not a directory"),
    (lambda d: _remove(d / "run.json"), "not a booklens run or sweep directory"),
    (lambda d: _write(d / "run.json", b"{oops"), "not valid JSON"),
    (lambda d: _write(d / "run.json", b"\xff\xfe\x00bad"), "not UTF-8"),
    (lambda d: _edit(d / "run.json", kind="booklens.summary"), "is not a booklens run record"),
    (lambda d: _edit(d / "run.json", format_version=2), "newer booklens (format version 2"),
    (lambda d: _edit(d / "run.json", format_version="1"), "no valid format_version"),
    (lambda d: _edit(d / "coherence.json", format_version=7), "newer booklens (format version 7"),
    (lambda d: _remove(d / "claims.json"), "claims record not found"),
    (lambda d: _edit(d / "faithfulness.json", claims="many"), "not a valid faithfulness record: claims"),
    (lambda d: _edit(d / "run.json", steps={}), "holds no summary yet"),
    (lambda d: _edit(d / "run.json", totals={"calls": "x"}), "holds records this booklens cannot show"),
], ids=["file", "no-run-json", "bad-json", "not-utf8", "wrong-kind", "newer-run", "bad-version",
        "newer-step", "missing-step", "invalid-step", "no-steps", "bad-totals"])
def test_bad_run_directory_is_a_one_line_error(hier_run, tmp_path, damage, pattern):
    from booklens.reports import write_report

    target = damage(_copy(hier_run, tmp_path))
    with pytest.raises(BooklensError) as err:
        write_report(target, tmp_path / "out.html")
    message = str(err.value)
    assert pattern in message and "\n" not in message, message
    assert not (tmp_path / "out.html").exists()


def test_report_on_a_folder_that_is_neither_a_run_nor_a_sweep_names_both_records(tmp_path):
    # report takes a run or a sweep directory: a sweep's folder without its sweep.json (a copy of
    # results.json and cells.jsonl, say) must not be told only that it lacks a run.json.
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "cells.jsonl").write_text("")
    result = run_command(["report", tmp_path])
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"error: {tmp_path} is not a booklens run or sweep directory "
                             "(it has no run.json or sweep.json)\n"), result.stderr


@pytest.mark.parametrize("name", ["run.json", "summary.json", "coherence.json", "claims.json", "faithfulness.json",
                                  "timings.json"])
def test_the_report_never_replaces_a_record_of_its_run(hier_run, tmp_path, name):
    from booklens.reports import write_report

    target = _copy(hier_run, tmp_path)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    for spelling in (target / name, target / "." / name, Path(os.path.relpath(target / name))):
        with pytest.raises(BooklensError) as err:
            write_report(target, spelling)
        assert f"it is the run's {name}" in str(err.value) and "\n" not in str(err.value)
    result = run_command(["report", target, "-o", target / name])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: "), result.stderr
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    # The page's own file in the run directory stays the place to rebuild it, over the page or afresh.
    assert run_command(["report", target, "-o", target / "report.html"]).returncode == 0
    (target / "report.html").unlink()
    assert run_command(["report", target, "-o", target / "report.html"]).returncode == 0
    assert (target / "report.html").read_bytes() == before["report.html"]


def test_the_report_is_not_written_over_the_book_its_run_read(hier_run, tmp_path):
    """`report RUN -o BOOK` is refused as `summarize BOOK -o BOOK` is: one line, the book untouched,
    whichever spelling of it -o gives."""
    target = _copy(hier_run, tmp_path)
    book = tmp_path / "books" / "story.txt"
    book.parent.mkdir()
    shutil.copyfile(STORY, book)
    _edit(target / "run.json", book=str(book))
    for spelling in (book, tmp_path / "books" / "." / "story.txt"):
        result = run_command(["report", target, "-o", spelling])
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0, result.stderr
        assert "is also an input" in result.stderr and str(book) in result.stderr, result.stderr
        assert book.read_bytes() == STORY.read_bytes()
    # so is a given summary's file, which the run read too
    given = tmp_path / "books" / "summary.txt"
    given.write_text(STORY_SUMMARY)
    config = json.loads((target / "run.json").read_text())["config"]
    _edit(target / "run.json", config={**config, "summary_file": str(given)})
    result = run_command(["report", target, "-o", given])
    assert result.returncode == 2 and "is also an input" in result.stderr, result.stderr
    assert given.read_text() == STORY_SUMMARY
    # any other file is written as before
    assert run_command(["report", target, "-o", tmp_path / "page.html"]).returncode == 0


def test_the_report_is_not_written_over_the_book_from_another_folder_than_the_runs(hier_run, tmp_path,
                                                                                    monkeypatch):
    """run.json names the book as `run` was given it: a relative path, resolved against the folder
    `report` runs in, missed the book when that was not the folder `run` ran in. The book's digest,
    which run.json records, tells it wherever it lies."""
    target = _copy(hier_run, tmp_path)
    book = tmp_path / "books" / "story.txt"
    book.parent.mkdir()
    shutil.copyfile(STORY, book)
    _edit(target / "run.json", book="books/story.txt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for spelling in (book, Path("..") / "books" / "story.txt"):
        result = run_command(["report", target, "-o", spelling])
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0, result.stderr
        assert "holds the book" in result.stderr and "books/story.txt" in result.stderr, result.stderr
        assert book.read_bytes() == STORY.read_bytes()
    # another text, or a page written before, is written over as ever
    (tmp_path / "other.txt").write_text("Another story altogether.\n")
    assert run_command(["report", target, "-o", tmp_path / "other.txt"]).returncode == 0
    assert run_command(["report", target, "-o", tmp_path / "other.txt"]).returncode == 0


def test_the_report_is_not_written_over_a_given_summary_from_another_folder_than_the_runs(hier_run, tmp_path,
                                                                                         monkeypatch):
    """run.json names a given summary's file as `run --summary` was given it, often relative to the
    folder `run` ran in: `report -o` from another folder missed it by path. The summary the run judged
    tells the file wherever it lies, a text file or a `booklens summarize` record alike."""
    given = tmp_path / "given"
    given.mkdir()
    (given / "summary.txt").write_text(STORY_SUMMARY + "\n", encoding="utf-8")
    shutil.copyfile(hier_run / "summary.json", given / "record.json")
    monkeypatch.chdir(tmp_path)
    runs = {name: execute(tmp_path, scripted("unused", claims=["Maren Holt is a bookbinder."]), out=f"run-{name}",
                          summary_file=Path("given") / name, evidence="none")
            for name in ("summary.txt", "record.json")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for name, run_dir in runs.items():
        assert json.loads((run_dir / "run.json").read_text())["config"]["summary_file"] == f"given/{name}"
        before = (given / name).read_bytes()
        for spelling in (given / name, Path("..") / "given" / name):
            result = run_command(["report", run_dir, "-o", spelling])
            assert result.returncode == 2, result.stderr
            assert result.stderr.startswith("error: ") and result.stderr.strip().count("\n") == 0, result.stderr
            assert "holds the summary" in result.stderr and f"given/{name}" in result.stderr, result.stderr
            assert (given / name).read_bytes() == before
    # a summary a sweep's cell was handed as text is told alike, named as its record names it
    as_text = execute(tmp_path, scripted("unused", claims=["Maren Holt is a bookbinder."]), out="run-text",
                      summary_text=STORY_SUMMARY, evidence="none")
    result = run_command(["report", as_text, "-o", given / "summary.txt"])
    assert result.returncode == 2 and "holds the summary this run judged (summaries of run)" in result.stderr, \
        result.stderr
    # another summary, or a page written before, is written over as ever
    (tmp_path / "other.txt").write_text("Another summary altogether.\n")
    for _ in range(2):
        assert run_command(["report", runs["summary.txt"], "-o", tmp_path / "other.txt"]).returncode == 0


def test_the_report_is_not_written_over_a_step_record_the_run_has_not_made_yet(hier_run, tmp_path):
    from booklens.reports import write_report

    target = _copy(hier_run, tmp_path)
    (target / "faithfulness.json").unlink()  # a later run would take an HTML page there for the record
    _edit(target / "run.json", steps={k: v for k, v in json.loads((target / "run.json").read_text())["steps"].items()
                                      if k != "faithfulness"})
    with pytest.raises(BooklensError, match="it is the run's faithfulness.json"):
        write_report(target, target / "faithfulness.json")
    assert not (target / "faithfulness.json").exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_run_directory(hier_run, tmp_path):
    from booklens.reports import load_run

    target = _copy(hier_run, tmp_path)
    target.chmod(0)
    try:
        with pytest.raises(BooklensError, match="cannot read"):
            load_run(target)
    finally:
        target.chmod(0o755)


# ---------------------------------------------------------------------------
# `booklens run` on the sample story, and the page in Chromium


def story_answer(body: dict) -> str:
    system, last = body["messages"][0]["content"], body["messages"][-1]["content"]
    if "as plain text" in last:
        return ("Maren Holt, a bookbinder in Harrow's End, is asked by the old keeper Tobias Wren to rebind his "
                "ledger. Zed hides the key. Reading it, she learns why the lamp at Saltmarsh Point went dark in "
                "1987: the keeper gave the fuel away to save a life. The town finally learns the truth.")
    if "[[ ## sentence ## ]]" in last:
        sentence = last.split("[[ ## sentence ## ]]", 1)[1].strip().split("\n\n")[0]
        if "Zed" in sentence:
            return json.dumps({"verdict": "confusion", "questions": ["Who is Zed, and what key is this?"],
                               "error_types": ["entity omission", "discontinuity"]})
        return json.dumps({"verdict": "no confusion", "questions": [], "error_types": []})
    if "`claims`" in system:
        return json.dumps({"claims": ["Maren Holt is a bookbinder in Harrow's End.",
                                      "Tobias Wren asks Maren Holt to rebind his ledger.",
                                      "The lamp at Saltmarsh Point went dark in 1987.",
                                      "Zed hides the key."]})
    claim = last.split("[[ ## claim ## ]]")[-1]
    if "Zed" in claim:
        return json.dumps({"label": "can't verify", "supporting_passages": [], "refuting_passages": [],
                           "reason": "No passage mentions anyone named Zed."})
    return json.dumps({"label": "faithful", "supporting_passages": [1], "refuting_passages": [],
                       "reason": "Passage 1 states this directly."})


@pytest.fixture(scope="module")
def story_run(tmp_path_factory):
    """`booklens run examples/sample_story.txt` (in process, against an OpenAI-compatible fake server)."""
    from typer.testing import CliRunner

    from booklens.cli import app

    tmp = tmp_path_factory.mktemp("story")
    with FakeOpenAIServer(responder=story_answer) as server:
        result = CliRunner().invoke(app, ["run", str(STORY), "--chunk-size", "1024", "--context-window", "3072",
                                          "--max-summary-tokens", "200", "--k", "2", "--lm", "openai/fake-model",
                                          "--api-base", server.url, "--cache-dir", str(tmp / "cache"),
                                          "-o", str(tmp / "run")])
    assert result.exit_code == 0, (result.output, result.exception)
    return tmp / "run"


def check_page_in_chromium(run_dir: Path, tmp_path: Path, *, expect_highlight: bool = True,
                           expect_claims: bool = True, expect_warnings: bool = True,
                           judge_program: str = "default few-shot program") -> Path:
    """Load the report in headless Chromium: no console output, the key parts present; returns a screenshot."""
    page = run_dir / "report.html"
    dom, console = load_in_chromium(page, tmp_path)
    assert console == [], console
    cards = [Dom.text(e) for e in dom.find("li", cls="card")]
    assert any(c.startswith("BooookScore") for c in cards), cards
    if expect_claims:
        assert any(c.startswith(("Faithful", "Unfaithful", "Partial support", "Can't verify")) for c in cards)
    judges = [Dom.text(e) for e in dom.find("li", cls="judge")]
    assert judges and judges[0].startswith("Coherence judge") and judge_program in judges[0]
    if expect_warnings:
        assert len(dom.find("p", cls="warning")) == len(judges)
    if expect_highlight:
        mark = dom.find("mark", tabindex="0")[0]
        tip = dom.by_id(mark["attrs"]["aria-describedby"])
        assert tip["attrs"]["role"] == "tooltip" and "?" in Dom.text(tip)
        assert dom.find("ol", cls="qlist")
    if expect_claims:
        claim = dom.find("li", cls="claim")[0]
        assert dom.find("span", cls="badge")
        assert "characters " in Dom.text(claim) and "into the book" in Dom.text(claim)
    shot = tmp_path / "report.png"
    chromium(page, tmp_path / "profile-shot", "--window-size=1280,2200", f"--screenshot={shot}",
             "--hide-scrollbars")
    assert png_size(shot) == (1280, 2200) and shot.stat().st_size > 50_000  # a page, not a blank
    return shot


def test_sample_story_report_in_chromium(story_run, tmp_path):
    run = json.loads((story_run / "run.json").read_text())
    assert run["complete"] and run["scores"]["confusing_sentences"] == 1
    assert set(run["judges"]) == {"coherence", "verification"}
    assert run["judges"]["coherence"]["program"] == "default" and run["judges"]["coherence"]["demos"] >= 20
    assert run["judges"]["verification"]["calibration"] is None  # a fake model was never calibrated
    page = (story_run / "report.html").read_text()
    assert "Who is Zed, and what key is this?" in page and "Passage 1 states this directly." in page
    check_page_in_chromium(story_run, tmp_path)


def test_keyboard_focus_on_a_highlight_shows_its_questions(story_run, tmp_path):
    """The tooltip is drawn when its sentence has keyboard focus (autofocus stands in for a Tab press)."""
    image = pytest.importorskip("PIL.Image")
    source = (story_run / "report.html").read_text()
    assert source.count('<mark tabindex="0"') == 1
    pages = {"plain": source, "focused": source.replace('<mark tabindex="0"', '<mark autofocus tabindex="0"')}
    tooltip_pixels = {}
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(text)
        shot = tmp_path / f"{name}.png"
        chromium(page, tmp_path / f"profile-{name}", "--window-size=1000,1300", f"--screenshot={shot}",
                 "--hide-scrollbars")
        with image.open(shot) as im:
            rgb = im.convert("RGB")
            # getdata() is deprecated in recent Pillow; use whichever this Pillow has.
            pixels = rgb.get_flattened_data() if hasattr(rgb, "get_flattened_data") else rgb.getdata()
            tooltip_pixels[name] = sum(1 for p in pixels if tuple(p) == (255, 253, 243))  # .tip
    assert tooltip_pixels["plain"] == 0
    assert tooltip_pixels["focused"] > 20_000, tooltip_pixels


@pytest.mark.embedded
def test_embedded_model_run_on_the_sample_story(tmp_path, story_opening):
    """The whole chain with SmolLM2, kept short: the story's first twelve paragraphs (about 540
    tokens, one chunk), a brief summary and two claims with two passages each. The judges run
    zero-shot: the default few-shot coherence prompt is some 6K tokens, two minutes on one core; the
    few-shot verifier runs on the embedded model in test_faithfulness_cli, and `booklens judges`
    shows the shipped calibration of both."""
    book = tmp_path / "beginning.txt"
    book.write_text("\n\n".join(story_opening.read_text(encoding="utf-8").split("\n\n")[:12]), encoding="utf-8")
    out = tmp_path / "run"
    env = {**os.environ, "BOOKLENS_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("BOOKLENS_LM", None)
    # In this process (booklens.testing.run_command): the command as the script runs it, without
    # importing DSPy, LiteLLM and sentence-transformers again.
    proc = run_command(["run", book, "--lm", "local", "--zero-shot", "--max-summary-tokens", "60",
                        "--max-regenerations", "0", "--max-claims", "2", "--k", "2", "--passage-tokens", "128",
                        "-o", out], env=env)
    assert proc.returncode == 0, proc.stderr
    from booklens.reports import load_run

    data = load_run(out)  # every record reads back and validates
    assert data.run.complete and data.run.lm.startswith("local/")
    assert data.summary.summary.strip() and data.coherence.n_sentences >= 1
    assert data.run.totals["calls"] >= 3 and data.run.totals["prompt_tokens"] > 0
    assert len(data.faithfulness.claims) <= 2
    judged = [s for s in data.coherence.sentences if s.status == "ok" and s.confusing]
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        check_page_in_chromium(out, tmp_path, expect_highlight=bool(judged),
                               expect_claims=bool(data.faithfulness.claims), expect_warnings=True,
                               judge_program="zero-shot program")
    # both judges are named, in the records and on the terminal
    assert data.run.judges["coherence"].program == "zero-shot" and data.run.judges["coherence"].demos == 0
    assert data.faithfulness.judge.program == "zero-shot"
    assert proc.stderr.count("judge: zero-shot ") == 2


def test_compiled_programs_are_routed_by_task_and_recorded(tmp_path):
    """`--program` artifacts go to the step of their task; their digests are part of run.json."""
    import dspy

    from booklens.pipeline import route_programs
    from booklens.optimizers.artifacts import save_program
    from booklens.programs.faithfulness import build_verifier

    verifier = build_verifier()
    verifier.verify.demos = [dspy.Example(evidence="[1] The lamp was lit.", claim="The lamp was lit.",
                                          label="faithful", supporting_passages=[1], refuting_passages=[],
                                          reason="Passage 1 says so.")]
    artifact = tmp_path / "verifier.json"
    save_program(verifier, artifact, task="verification")
    routed = route_programs([artifact])
    assert routed == {"verification": artifact}
    with pytest.raises(BooklensError, match="two --program artifacts"):
        route_programs([artifact, artifact])

    lm = scripted("Maren rebinds the ledger. Zed hides the key.", claims=["Maren rebinds the ledger."])
    out = execute(tmp_path, lm, programs=routed, chunk_size=4096, max_summary_tokens=200, k=2)
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["programs"]["verification"]["sha256"]
    verify_prompts = [c for c in lm.backend.calls if c.wants("label")]
    assert verify_prompts and all("The lamp was lit." in json.dumps(c.messages) for c in verify_prompts)


def test_a_binary_judges_run_shows_its_two_labels_on_the_cards_and_the_score_line(tmp_path):
    """The faithful/unfaithful rater gives no other label: the page and `run`'s score line name its two, as
    `booklens faithfulness` does, not two more at 0.0% that it could never have given."""
    from booklens.cli.run import score_line
    from booklens.judges import default_path
    from booklens.reports import load_run

    out = execute(tmp_path, scripted(STORY_SUMMARY), programs={"verification": default_path("binary")},
                  chunk_size=512, context_window=2048, max_summary_tokens=200, k=3)
    dom = Dom((out / "report.html").read_text())
    cards = [Dom.text(card) for card in dom.find("li", cls="card") if "judge" not in card["attrs"]["class"].split()]
    assert cards == ["BooookScore80.04 of 5 judged sentences without confusion",
                     "Faithful50.0%1 of 2 verified claims", "Unfaithful50.0%1 of 2 verified claims"]
    assert "; 2 claims: 50.0% faithful, 50.0% unfaithful; " in score_line(load_run(out).run)


def test_a_new_run_directory_holds_run_json_before_its_first_step(tmp_path):
    """A run killed after its first step record would otherwise leave a directory that no rerun
    can claim as a booklens run (not empty, no run.json)."""
    from booklens.testing import ScriptedLM

    first = scripted(STORY_SUMMARY)
    seen = []

    def respond(call):
        seen.append((tmp_path / "run" / "run.json").is_file())
        return first.backend.responder(call)

    out = execute(tmp_path, ScriptedLM(respond), evidence="none", steps=["coherence"])
    assert seen and seen[0] is True  # there at the first LM call, before any step record
    assert json.loads((out / "run.json").read_text())["complete"] is True


def test_a_book_that_cannot_be_read_has_no_token_count_not_zero(tmp_path):
    """The run of a book that cannot be read recorded it as 0 tokens: its page said 'book of 0 tokens'
    and a sweep's cells.jsonl had 0 in the column a study averages. Its size is unknown: null, '-'."""
    from booklens.lm import FixedLMPool
    from booklens.pipeline import SystemConfig, run_book
    from booklens.sweep.aggregate import cell_row, outcome_of_run
    from booklens.testing import PipelineResponder

    book = tmp_path / "broken.epub"
    book.write_bytes(b"\x00\x01 not a zip archive " * 100)
    lm = ScriptedLM(lambda call: PipelineResponder()({"messages": call.messages}))
    run = run_book(book, tmp_path / "run", SystemConfig(summary_text="Mara keeps the light."), lms=FixedLMPool(lm),
                   notify=lambda _: None)
    assert run.failures and run.book_tokens is None
    record = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert record["book_tokens"] is None
    assert cell_row(outcome_of_run("s", "broken", record))["book_tokens"] is None
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert "book of 0 tokens" not in page and "book of - tokens" in page
    assert run_command(["report", tmp_path / "run"]).returncode == 0


def test_a_long_unbroken_word_wraps_inside_the_page_in_chromium(tmp_path):
    """A summary, a claim or a passage holding a long word without a break (a URL, a run of symbols)
    ran out of its box and made the whole page scroll sideways. Measured in Chromium on a copy of the
    page with a script that records the page's scrolling width (the page itself runs none)."""
    import re

    from booklens.lm import FixedLMPool
    from booklens.pipeline import JudgeConfig, SystemConfig, run_book
    from booklens.testing import PipelineResponder

    chromium_exe()
    word = "https://example.org/" + "x" * 300
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"On day {i} Mara read {word} aloud to the keeper." for i in range(40)), encoding="utf-8")
    lm = ScriptedLM(lambda call: PipelineResponder()({"messages": call.messages}))
    run_book(book, tmp_path / "run", SystemConfig(summary_text=f"Mara reads {word} aloud. The keeper listens."),
             JudgeConfig(k=2), lms=FixedLMPool(lm), notify=lambda _: None)
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert page.count(word) >= 3  # the summary, its claim, a passage
    probe = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page).replace(
        "</body>", "<script>document.body.setAttribute('data-widths', document.documentElement.scrollWidth + ' '"
                   " + document.documentElement.clientWidth)</script></body>")
    (tmp_path / "probe.html").write_text(probe, encoding="utf-8")
    proc = chromium(tmp_path / "probe.html", tmp_path / "profile-wide", "--window-size=800,1200", "--dump-dom")
    scroll, client = map(int, re.search(r'data-widths="(\d+) (\d+)"', proc.stdout).groups())
    assert scroll <= client, (scroll, client)


def test_a_run_without_judging_steps_says_it_judged_nothing_not_that_scores_are_to_come(hier_run, tmp_path):
    """A run made with no judging step (`JudgeConfig(steps=[])`, a manifest's `steps: []`) said
    "No scores yet.", as an unfinished run does: nothing will score it."""
    from booklens.reports import load_run, render_report

    summary_only = tmp_path / "summary-only"
    shutil.copytree(hier_run, summary_only)
    run = json.loads((summary_only / "run.json").read_text())
    run["config"]["judge_steps"] = []
    run["steps"] = {"summary": run["steps"]["summary"]}
    (summary_only / "run.json").write_text(json.dumps(run))
    for name in ("coherence.json", "claims.json", "faithfulness.json"):
        (summary_only / name).unlink()
    page = render_report(load_run(summary_only))
    assert "No scores yet" not in page and "not finished" not in page
    assert page.count("This run judged nothing: it was made without judging steps.") == 1
