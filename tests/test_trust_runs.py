"""A forged run folder cannot move a verdict: it is checked against its own plan before any figure (rounds,
confirmation, retakes, stream counts), read once and bounded, and what it brings is drawn as plain text with
nothing of it reaching the terminal. Each crafted folder gets its one line (or the correct result)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import ROOT, KitError
from harness.analysis import compare as cmp
from harness.analysis.summary import summarize
from harness.report import compare as compare_words
from harness.report import results as rp
from harness.store.rundir import RunDir
from harness.store.runmeta import AddedRound
from tests.crafted import DEMO_RUN, one_line

SWEEP_RUN = ROOT / "results" / "real-gemma3-270m-sweep"

Edit = Callable[[dict, list[dict]], None]


def _forged(folder: Path, edit: Edit, source: Path = SWEEP_RUN, name: str = "forged") -> Path:
    """A copy of a committed run with run.json and the records edited (written back as the kit writes them)."""
    run = folder / name
    shutil.copytree(source, run)
    meta = RunDir(run).read_meta().to_json()
    records = [json.loads(x) for x in (run / "measurements.jsonl").read_text().splitlines() if x.strip()]
    edit(meta, records)
    (run / "run.json").write_text(json.dumps(meta))
    (run / "measurements.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _refused(folder: Path, edit: Edit, *parts: str, source: Path = SWEEP_RUN) -> str:
    run = _forged(folder, edit, source)
    with pytest.raises(KitError) as e:
        rp.write([run], folder / "RESULTS.md", plot=False)
    assert not (folder / "RESULTS.md").exists()
    assert (run / "summary.json").read_bytes() == (source / "summary.json").read_bytes()  # no figure was written
    return one_line(e, *parts)


def _again(rec: dict, **changes) -> dict:
    """A copy of a record as another measurement: its id follows its cell, prompt and round."""
    out = {**json.loads(json.dumps(rec)), **changes}
    out["measurement_id"] = f"{out['host']}/{out['strategy']}/{out['task']}/{out['prompt']}/{out['round']}"
    out["run_index"] = out["round"]
    return out


def _confirm_cells(meta: dict) -> list:
    return [x for x in meta["plan"]["extra_rounds"] if x.get("purpose") == "confirm"]


def _add_rounds(meta: dict, recs: list[dict]) -> None:
    """Records of rounds 8 and 9, nobody planned: copies of the confirmation's records (they narrowed the
    confirmed interval from [1.40, 1.79] to [1.59, 1.67])."""
    recs += [_again(r, round=r["round"] + 3) for r in recs if r["round"] in (5, 6)]


def _retake_other_cell(meta: dict, recs: list[dict]) -> None:
    victim = next(r for r in recs if r["strategy"] == "baseline" and r["round"] == 2)
    mine = next(r for r in recs if r["strategy"].startswith("ngram-simple") and r["round"] == 2)
    meta["plan"]["retake_cap"] = 10
    victim["interference"]["disturbed"] = True
    recs.append({**_again(mine), "retake_of": victim["measurement_id"],
                 "measurement_id": victim["measurement_id"] + "/retake"})


def _retake_undisturbed(meta: dict, recs: list[dict]) -> None:
    first = next(r for r in recs if r["strategy"] == "baseline" and r["round"] == 2)
    meta["plan"]["retake_cap"] = 10
    recs.append({**_again(first), "retake_of": first["measurement_id"],
                 "measurement_id": first["measurement_id"] + "/retake"})


def _confirm_in_round_1(meta: dict, recs: list[dict]) -> None:
    for k, x in enumerate(_confirm_cells(meta)):
        x["round"] = 1 + k


def _purpose_removed(meta: dict, recs: list[dict]) -> None:
    for x in meta["plan"]["extra_rounds"]:
        x.pop("purpose")
        x.pop("combinations")


def _purpose_unknown(meta: dict, recs: list[dict]) -> None:
    _confirm_cells(meta)[0]["purpose"] = ["confirm"]


def _combinations_not_ids(meta: dict, recs: list[dict]) -> None:
    _confirm_cells(meta)[0]["combinations"] = 5


def _confirmation_read_as_until(meta: dict, recs: list[dict]) -> None:
    _purpose_removed(meta, recs)
    meta["plan"]["max_rounds"] = 20  # now they read as rounds --until added


def _level_changed(meta: dict, recs: list[dict]) -> None:
    next(s for s in meta["strategies"] if s["id"] == "baseline[parallel=4]")["parallel"] = 1


def _slots_changed(meta: dict, recs: list[dict]) -> None:
    rec = next(r for r in recs if r["strategy"] == "ngram-mod")
    cmd = rec["server_command"]
    cmd[cmd.index("--parallel") + 1] = "4"


def _duplicate(meta: dict, recs: list[dict]) -> None:
    recs.append(dict(recs[0]))


def _confirm_other(meta: dict, recs: list[dict]) -> None:
    for x in _confirm_cells(meta):
        x["cells"].append(["local", "ngram-mod", "en-prose"])


def _many_cells(meta: dict, recs: list[dict]) -> None:
    """A 13 MB run.json: 1,000 added rounds of 200 cells."""
    cells = [["local", s, t] for s in meta["plan"]["strategies"] for t in meta["plan"]["tasks"]] * 6
    meta["plan"]["extra_rounds"] = [{"round": 4 + k, "cells": cells[:200]} for k in range(1000)]
    meta["plan"]["max_rounds"] = 2000


@pytest.mark.parametrize("edit,expected", [
    (_add_rounds, "measurements.jsonl: line 406: round 8 is not one the run planned (rounds 1 to 3 and the added "
                  "rounds 4 to 6)"),
    (_retake_other_cell, "names a measurement of another cell, prompt or round"),
    (_retake_undisturbed, "names a measurement that counts (ok, not disturbed)"),
    (_confirm_in_round_1, "run.json: plan.extra_rounds[0].round: 1, expected 4"),
    (_purpose_removed, "plan.extra_rounds[0]: a round added after the planned ones, but the run could add none"),
    (_purpose_unknown, "run.json: plan.extra_rounds[0].purpose: ['confirm'], expected 'confirm' or none"),
    (_combinations_not_ids, "run.json: plan.extra_rounds[0].combinations: expected a list of strategy ids"),
    (_confirmation_read_as_until, "plan.extra_rounds: a complete run of a sweep whose added rounds include no "
                                  "confirmation round (purpose: confirm), though plan.confirm_rounds is 3"),
    (_level_changed, "strategy 'baseline[parallel=4]' is measured at 1"),
    (_slots_changed, "its server ran 4 slot(s), but strategy 'ngram-mod' is measured at 1"),
    (_duplicate, "appears twice"),
    (_confirm_other, "'ngram-mod' is neither a confirmed combination (at a level of its entry) nor a baseline"),
    (_many_cells, "plan.extra_rounds: 200,000 cells; a run measures at most 100,000 times in all"),
])
def test_a_forged_run_folder_that_does_not_fit_its_plan_is_one_line(sandbox, edit, expected):
    _refused(sandbox.work, edit, expected)


def test_the_confirmed_winner_does_not_follow_the_order_run_json_lists(sandbox):
    def reorder(meta: dict, recs: list[dict]) -> None:
        for x in _confirm_cells(meta):
            x["cells"].reverse()
            x["combinations"].reverse()
    honest = summarize(RunDir(_forged(sandbox.work, lambda m, r: None, name="honest")))["sweeps"][0]
    forged = summarize(RunDir(_forged(sandbox.work, reorder)))["sweeps"][0]
    assert forged["confirmation"]["winner"] == honest["confirmation"]["winner"]
    assert forged["confirmation"] == honest["confirmation"]


def test_a_plan_that_lost_its_confirmation_says_so_in_the_header(sandbox):
    def lost(meta: dict, recs: list[dict]) -> None:
        # the confirmation rounds gone with their records (read as rounds --until added, they are refused above)
        meta["plan"]["extra_rounds"] = []
        recs[:] = [r for r in recs if r["round"] <= meta["plan"]["runs"]]
    run = _forged(sandbox.work, lost)
    rp.write([run], sandbox.work / "RESULTS.md", plot=False)
    assert "**3 confirmation round(s) planned after the sweep, none listed in run.json**" in \
        (sandbox.work / "RESULTS.md").read_text()


def test_a_forged_sweep_value_is_drawn_as_text_and_nothing_reaches_the_terminal(sandbox):
    value = "$\\undefinedmacro{x}$\x1b]0;pwned\x07\x1b[31m"

    def forge(meta: dict, recs: list[dict]) -> None:
        s = next(s for s in meta["strategies"] if s["sweep"])
        s["sweep"][0][1] = value
        s["args"][s["args"].index(s["sweep"][0][0]) + 1] = value
    run = _forged(sandbox.work, forge)
    res = subprocess.run([sys.executable, "-W", "default", "-m", "invoke", "-r", str(ROOT), "report", str(run),
                          "--out", str(sandbox.work / "RESULTS.md")], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "default"})
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout + res.stderr and "\x07" not in res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "Glyph" not in res.stderr
    assert any(p.name.startswith("sweep-") for p in run.iterdir())


def test_compare_names_a_cut_off_last_line_as_report_does(sandbox):
    a = _forged(sandbox.work, lambda m, r: None, DEMO_RUN, "a")
    b = _forged(sandbox.work, lambda m, r: None, DEMO_RUN, "b")
    text = (b / "measurements.jsonl").read_text()
    (b / "measurements.jsonl").write_text(text[: text.rstrip("\n").rfind("\n") + 40])  # the last line cut short
    res = cmp.compare(a, b)
    assert res.torn_last_line == ("B",) and res.as_dict()["torn_last_line"] == ["B"]
    assert "B: the last line of measurements.jsonl was cut short (a crash mid-write): that measurement is not " \
           "counted" in compare_words.text(res)
    rp.write([b], sandbox.work / "RESULTS.md", plot=False)
    assert "the last line of measurements.jsonl was cut short" in (sandbox.work / "RESULTS.md").read_text()


def test_run_json_is_read_once_however_often_it_is_asked(sandbox, monkeypatch):
    run = _forged(sandbox.work, lambda m, r: None, DEMO_RUN)
    rd = RunDir(run)
    reads: list[Path] = []
    original = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "run.json":
            reads.append(self)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(Path, "read_text", counting)
    summarize(rd)
    rd.read_meta()
    assert len(reads) == 1
    meta = rd.read_meta()
    meta.plan.extra_rounds.append(AddedRound(99, ()))  # a caller's copy: the next read is unchanged
    assert rd.read_meta().plan.extra_rounds == []
