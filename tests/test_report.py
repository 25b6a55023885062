"""invoke report on a real demo run, and on partial, empty and wrong folders."""

from __future__ import annotations

import json
import shutil

import pytest

from harness import KitError, schema
from harness.analysis.summary import summarize
from harness.report import results as rp
from harness.store.rundir import RunDir


@pytest.mark.image
def test_report_of_demo_run_has_every_strategy_and_task_and_matches_summary(demo_run, tmp_path):
    out = tmp_path / "RESULTS.md"
    rp.write([demo_run], out)
    text = out.read_text()
    summary = json.loads((demo_run / "summary.json").read_text())
    assert schema.errors("summary", summary) == []
    for s in ("baseline", "draft-simple", "dflash2", "dspark", "eagle3", "mtp", "ngram-map-k4v", "ngram-cache"):
        assert s in text
    for t in ("zh-prose", "en-prose", "code-gen", "code-edit", "json-out", "reasoning", "translate", "long-ctx"):
        assert f"| {t} " in text
    # every median in the throughput table is the summary's; a cell whose every run other work disturbed (a busy
    # machine: they are set aside) says so instead
    for c in summary["cells"]:
        if c["decode_tok_s"]["median"] is None:
            assert c["runs_ok"] and not c["runs_used"] and f"⚠ all {c['runs_ok']} runs disturbed" in text, c
            continue
        assert f"{c['decode_tok_s']['median']:,.2f} ±" in text
        # two rounds: estimates without intervals or verdicts, said so (the sweep's best two and their baseline
        # have the confirmation rounds too: those are judged)
        if c["baseline"] is not None and len(c["paired_rounds"]) < 3:
            assert c["speedup"] is not None and c["verdict"]["kind"] == "too few rounds"
            assert f"{c['speedup']:.2f}x ? too few rounds (" in text
    # the family is the cells with the 3 paired rounds a verdict needs: at 2 rounds there are none (the sweep's
    # confirmation rounds have their own section), and the report says so instead of printing marks
    judged = [c for c in summary["cells"] if c["baseline"] is not None and c["verdict"]["kind"] != "too few rounds"]
    assert judged == [] and summary["family"]["cells"] == 0
    assert "No cell has the 3 paired rounds a verdict needs: estimates only, no marks." in text
    rows = [ln for ln in text.split("### Speedup")[1].split("###")[0].splitlines() if ln.startswith("| ")]
    assert len(rows) > 10 and not any("▲" in r or "▼" in r for r in rows)
    assert "95% interval" in text and "### Interference" in text and "### Stability warnings" in text
    assert "one fresh container per measurement" in text
    assert "| of roofline " in text
    for c in summary["cells"]:
        if c["baseline"] is None and c["decode_tok_s"]["median"] is not None:  # a figure the physics can judge
            frac = c["checks"]["physics"]["data"]["fraction"]
            assert f"| {frac:.0%} " in text
    assert "tasks byte-identical to the baseline" in text
    assert "Acceptance is not comparable across drafter architectures" in text
    assert (demo_run / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot.png)" in text
    # why: every speculative cell's speedup decomposed, and acceptance by draft position beside the speedup plot
    assert len(summary["decomposition"]) == sum(1 for c in summary["cells"] if c["spec_type"] != "none"
                                                and c["speedup"] is not None)
    assert "### Why: speedup = tokens per pass × pass rate" in text and "plot.png) ![acceptance by draft" in text
    assert (demo_run / "positions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.image
def test_regenerating_gives_the_same_bytes(demo_run, tmp_path):
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    rp.write([demo_run], a)
    s1, p1 = (demo_run / "summary.json").read_bytes(), (demo_run / "plot.png").read_bytes()
    rp.write([demo_run], b)
    assert a.read_bytes() == b.read_bytes()
    assert (demo_run / "summary.json").read_bytes() == s1 and (demo_run / "plot.png").read_bytes() == p1


@pytest.mark.image
def test_partial_run_names_missing_cells(demo_run, tmp_path):
    part = tmp_path / "partial"
    shutil.copytree(demo_run, part)
    lines = (part / "measurements.jsonl").read_text().splitlines()
    # an interrupted run: the records up to its first ngram-mod/code-gen measurement (the kit appends in order)
    first = next(i for i, ln in enumerate(lines)
                 if (json.loads(ln)["strategy"], json.loads(ln)["task"]) == ("ngram-mod", "code-gen"))
    kept = lines[:first]
    (part / "measurements.jsonl").write_text("\n".join(kept) + "\n")
    summary = summarize(RunDir.open(part))
    missing = {(m["strategy"], m["task"]) for m in summary["missing"]}
    assert ("ngram-mod", "code-gen") in missing
    out = tmp_path / "R.md"
    rp.write([part], out)
    text = out.read_text()
    assert "### Missing cells" in text and "ngram-mod / code-gen: 0 of 2 runs recorded" in text
    # empty run folder: a report of nothing, every cell missing
    (part / "measurements.jsonl").write_text("")
    rp.write([part], out)
    plan = json.loads((part / "run.json").read_text())["plan"]  # the planned rounds and the confirmation's cells
    planned = plan["measurements"] + sum(len(x["cells"]) for x in plan["extra_rounds"])
    assert f"0 ok, 0 failed of {planned} planned" in out.read_text()


def test_not_a_run_folder(tmp_path):
    with pytest.raises(KitError, match=r"not a run folder \(no run.json\)"):
        rp.write([tmp_path], tmp_path / "R.md")
    with pytest.raises(KitError, match="no such run folder"):
        rp.write([tmp_path / "nope"], tmp_path / "R.md")
    with pytest.raises(KitError, match="no run folders under"):
        rp.latest_run(tmp_path)
