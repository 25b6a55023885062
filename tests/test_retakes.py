"""Disturbed measurements are measured again: at the end of their round, in a shuffled order, up to the run's cap,
both records kept and the retake marked. Through the fake engine, whose scripted host makes the kit's own
interference measurement call a chosen measurement disturbed."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import yaml

from harness import ROOT, KitError, schema
from harness.analysis.summary import summarize
from harness.report.results import render_run
from harness.run import plan as pl
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.fake_engine import CELLS, FakeEngine, disturb, fake, records, run_demo

JSON1 = ("ngram-mod", "json-out", 1)
CODE1 = ("baseline", "code-gen", 1)
SIMPLE2 = ("draft-simple", "json-out", 2)


def _id(cell: tuple[str, str, int]) -> str:
    return f"local/{cell[0]}/{cell[1]}/{cell[2]}"


def test_a_disturbed_measurement_is_measured_again_at_the_end_of_its_round(world, models_dir):
    lines: list[str] = []
    out = run_demo(world, models_dir, [fake(disturbed=disturb(JSON1))], lines)
    assert f"{2 * CELLS} ok, 0 failed, 1 measured again" in out
    recs = sorted(records(world), key=lambda r: r["order"])
    first = next(r for r in recs if r["measurement_id"] == _id(JSON1))
    again = next(r for r in recs if r.get("retake_of") == _id(JSON1))
    assert first["interference"]["disturbed"] and "other work used 1." in first["interference"]["reasons"][0]
    assert not again["interference"]["disturbed"] and again["measurement_id"] == _id(JSON1) + "/retake"
    assert (again["strategy"], again["task"], again["run_index"], again["round"]) == ("ngram-mod", "json-out", 1, 1)
    round1 = [r["order"] for r in recs if r["round"] == 1 and "retake_of" not in r]
    round2 = [r["order"] for r in recs if r["round"] == 2]
    assert max(round1) < again["order"] < min(round2)  # after its round, before the next
    assert sum("retake_of" in r for r in recs) == 1 and all(schema.errors("result", r) == [] for r in recs)
    assert any("round 1: 1 measurement(s) do not count (1 disturbed by other work); measuring 1 again to restore 1 "
               "pair(s)" in ln for ln in lines), lines
    assert RunDir.open(world / "r" / "fake").read_meta().plan.retake_cap == math.floor(0.1 * 2 * CELLS) == 1


def test_the_statistics_still_read_a_run_with_retakes(world, models_dir):
    run_demo(world, models_dir, [fake(disturbed=disturb(JSON1))])
    s = summarize(RunDir.open(world / "r" / "fake"))
    cell = next(c for c in s["cells"] if (c["strategy"], c["task"]) == ("ngram-mod", "json-out"))
    assert cell["runs_ok"] >= 2 and cell["speedup"] is not None
    # the report states the cap and how many were retaken
    assert s["measurements"]["retakes"] == 1
    assert "at most 1 in this run (both records kept, the retake marked)" in s["rules"]["interference"]
    rd = RunDir.open(world / "r" / "fake")
    assert "1 measurement retaken, restoring 1 pair)" in render_run(rd, s, world / "RESULTS.md", None)


def test_the_retakes_of_a_round_come_in_an_order_shuffled_with_the_seed(world, models_dir):
    cells = [(s, t, 1) for s in ("baseline", "ngram-mod", "draft-simple") for t in ("json-out", "code-gen")]
    orders = {}
    for seed in range(1, 7):
        run_demo(world, models_dir, [fake(disturbed=disturb(*cells))], run_id=f"s{seed}", seed=seed, retakes=6)
        recs = sorted(records(world, f"s{seed}"), key=lambda r: r["order"])
        first = [r["measurement_id"] for r in recs if r["round"] == 1 and "retake_of" not in r]
        retaken = [r["retake_of"] for r in recs if "retake_of" in r]
        assert sorted(retaken) == sorted(first)  # every disturbed one, once
        assert [r["round"] for r in recs] == [1] * 12 + [2] * 6  # all at the end of round 1
        orders[seed] = (first, retaken)
    assert any(first != retaken for first, retaken in orders.values())  # not simply in the order measured
    run_demo(world, models_dir, [fake(disturbed=disturb(*cells))], run_id="again", seed=3, retakes=6)
    assert [r["retake_of"] for r in sorted(records(world, "again"), key=lambda r: r["order"])
            if "retake_of" in r] == orders[3][1]


def test_the_cap_bounds_the_retakes_of_the_whole_run_and_a_retake_is_not_retaken(world, models_dir):
    busy = disturb(JSON1, CODE1, SIMPLE2, ("baseline", "json-out", 2), every_attempt=True)
    out = run_demo(world, models_dir, [fake(disturbed=busy)], retakes=2)
    assert "2 measured again" in out
    recs = records(world)
    retakes = [r for r in recs if "retake_of" in r]
    assert len(retakes) == 2 and all(r["interference"]["disturbed"] for r in retakes)  # disturbed again: kept
    assert not any(r["measurement_id"].endswith("/retake/retake") for r in recs)
    assert sum(r["interference"]["disturbed"] for r in recs) == 6
    assert RunDir.open(world / "r" / "fake").read_meta().plan.retake_cap == 2


def test_no_retakes_when_the_cap_is_zero_or_the_protocol_reuses_its_server(world, models_dir):
    out = run_demo(world, models_dir, [fake(disturbed=disturb(JSON1))], retakes=0)
    assert "measured again" not in out and not any("retake_of" in r for r in records(world))
    assert RunDir.open(world / "r" / "fake").read_meta().plan.retake_cap == 0
    ngram = lambda labels, attempt: labels["specbench.strategy"] == "ngram-mod"  # noqa: E731 - its one server
    run_demo(world, models_dir, [fake(disturbed=ngram)], run_id="naive", reuse_server=True)
    recs = records(world, "naive")
    assert any(r["interference"]["disturbed"] for r in recs) and not any("retake_of" in r for r in recs)


def _raw(**extra) -> dict:
    raw = yaml.safe_load(DEMO.read_text())
    raw.update(extra)
    return raw


@pytest.mark.parametrize("in_manifest, flag, cap", [(None, None, 13), (3, None, 3), (3, 1, 1), (None, 0, 0)])
def test_the_cap_is_a_tenth_of_the_plan_unless_the_manifest_or_the_flag_says(tmp_path, in_manifest, flag, cap):
    raw = _raw(**({"retakes": in_manifest} if in_manifest is not None else {}))
    m = trusted(write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "r.yaml")).manifest
    p = pl.make_plan(m, ["local"], runs=1, retakes=flag)
    assert len(p.items) == 17 * 8 and p.retake_cap == cap  # at most 10% of 136, rounded down


def test_a_manifest_cannot_ask_for_a_negative_cap(tmp_path):
    path = write_manifest(tmp_path, yaml.safe_dump(_raw(retakes=-1), allow_unicode=True), "r.yaml")
    with pytest.raises(KitError, match=r"r.yaml: retakes: expected at least 0, got -1"):
        trusted(path)


@pytest.mark.parametrize("value, said", [("-1", "--retakes: expected 0 or more, got -1"),
                                         ("some", "--retakes: expected a whole number, got 'some'")])
def test_the_flag_is_checked_before_any_engine(tmp_path, value, said):
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "run", "--retakes", value, "--manifest",
                          str(DEMO)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock",
                              "HOME": str(tmp_path)})
    assert res.returncode == 1 and res.stderr.strip() == f"error: {said}", res.stderr


def _stop_at_retake(of: str):
    def on_start(e: FakeEngine, labels: dict, n: int) -> None:
        key = (labels["specbench.strategy"], labels["specbench.task"], labels["specbench.run-index"])
        if e.attempts[key] and f"local/{'/'.join(key)}" == of:  # the second container of that measurement
            raise KeyboardInterrupt
    return on_start


def test_resume_retakes_what_an_interruption_left_owed_before_the_next_round(world, models_dir):
    with pytest.raises(Exception, match="interrupted"):
        run_demo(world, models_dir, [fake(disturbed=disturb(JSON1), on_start=_stop_at_retake(_id(JSON1)))])
    recs = records(world)
    assert len(recs) == CELLS and not any("retake_of" in r for r in recs)  # round 1 done, its retake owed
    out = run_demo(world, models_dir, [fake(disturbed=disturb(JSON1))], resume="fake")
    assert f"{CELLS} ok, 0 failed, {CELLS} already recorded, 1 measured again" in out
    recs = sorted(records(world), key=lambda r: r["order"])
    assert recs[CELLS].get("retake_of") == _id(JSON1) and all(r["round"] == 2 for r in recs[CELLS + 1:])


def test_resume_does_not_retake_twice_and_counts_earlier_retakes_against_the_cap(world, models_dir):
    def stop_in_round_two(e: FakeEngine, labels: dict, n: int) -> None:
        if n == CELLS + 3:  # round 1 and its one retake done, two of round 2 done
            raise KeyboardInterrupt

    with pytest.raises(Exception, match="interrupted"):
        run_demo(world, models_dir, [fake(disturbed=disturb(JSON1, SIMPLE2), on_start=stop_in_round_two)], retakes=1)
    assert [r["retake_of"] for r in records(world) if "retake_of" in r] == [_id(JSON1)]
    lines: list[str] = []
    out = run_demo(world, models_dir, [fake(disturbed=disturb(SIMPLE2))], lines, resume="fake")
    recs = records(world)
    assert "measured again" not in out and [r["retake_of"] for r in recs if "retake_of" in r] == [_id(JSON1)]
    assert next(r for r in recs if r["measurement_id"] == _id(SIMPLE2))["interference"]["disturbed"]
    assert any("round 2: 1 measurement(s) do not count (1 disturbed by other work); none measured again (1 of at "
               "most 1 retakes in this run, the cap is spent)" in ln for ln in lines), lines
    assert RunDir.open(world / "r" / "fake").read_meta().plan.retake_cap == 1
    # a resume of the finished run with a new cap retakes what is still missing, and nothing twice
    out = run_demo(world, models_dir, [fake()], lines, resume="fake", retakes=5)
    recs = records(world)
    assert "0 ok, 0 failed, 12 already recorded, 1 measured again" in out
    assert [r["retake_of"] for r in recs if "retake_of" in r] == [_id(JSON1), _id(SIMPLE2)]
    assert RunDir.open(world / "r" / "fake").read_meta().plan.retake_cap == 5  # the new cap, recorded
    assert any("resume fake: at most 5 retakes in the run (those already made count)" in ln for ln in lines)


def test_each_host_retakes_its_own_and_the_cap_is_shared(world, models_dir):
    run_demo(world, models_dir, [fake("a", disturbed=disturb(JSON1)), fake("b", disturbed=disturb(CODE1))], retakes=1)
    assert len([r for r in records(world) if "retake_of" in r]) == 1  # one cap for the run, not one per host
    run_demo(world, models_dir, [fake("a", disturbed=disturb(JSON1)), fake("b", disturbed=disturb(CODE1))],
        run_id="both", retakes=5)
    assert sorted(r["retake_of"] for r in records(world, "both") if "retake_of" in r) == \
        ["a/ngram-mod/json-out/1", "b/baseline/code-gen/1"]


def test_a_retake_is_the_same_cell_run_and_round_under_its_own_id():
    m = trusted(DEMO).manifest
    first = pl.make_plan(m, ["local"], runs=2, shuffle_seed=4).items[7]
    again = first.retake()
    assert (again.cell, again.run_index, again.round, again.host) == (first.cell, first.run_index, first.round, "local")
    assert again.measurement_id == first.measurement_id + "/retake" and again.retake_of == first.measurement_id
    assert first.retake_of is None


def test_run_json_keeps_the_cap_and_older_runs_read_as_before(tmp_path):
    old = RunDir.open(ROOT / "results" / "demo-cpu").read_meta()
    assert old.plan.retake_cap is None  # made before retakes: none were taken
    gemma = RunDir.open(ROOT / "results" / "real-gemma3-270m").read_meta()
    assert [t.id for t in gemma.tasks if t.perturbation] == ["en-prose-probe"]  # its run.json says `probe: true`
    rd = RunDir(tmp_path)
    rd.write_meta(dataclasses.replace(old, plan=dataclasses.replace(old.plan, retake_cap=7)))
    again = rd.read_meta()
    assert again.plan.retake_cap == 7 and again.to_json()["plan"]["retake_cap"] == 7
    assert json.loads((tmp_path / "run.json").read_text())["tasks"][0]["perturbation"] is False
