"""Break-even acceptance (harness/intake/breakeven.py, harness/analysis/breakeven.py, harness/report/breakeven.py):
a `breakeven:` block checked against the build's rules before anything runs, expanded into synthetic-acceptance
strategies, kept out of every other table, and its curve fitted where it crosses 1."""

from __future__ import annotations

import math
import random

import pytest
import yaml

from harness import LABEL_PREFIX
from harness.analysis import breakeven as be
from harness.analysis.summary import summarize
from harness.intake import manifest as mf
from harness.intake.bounded_yaml import ManifestError
from harness.report import breakeven as breakeven_report
from harness.report import results as rp
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.fake_engine import fake

LENGTHS = [1, 2, 3, 5, 9]


def _raw(block: dict | None = None, **strategy) -> dict:
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")
    raw["confirm_rounds"] = 0
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] in ("code-edit", "json-out")]
    s = {"id": "draft-simple", "spec_type": "draft-simple", "draft": "draft", "args": ["--spec-draft-n-max", "8"],
         "breakeven": block if block is not None else {"lengths": LENGTHS}} | strategy
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"}, s]
    return raw


def _load(tmp_path, raw: dict) -> mf.Manifest:
    return mf.load(write_manifest(tmp_path, yaml.safe_dump(raw)))


def test_a_block_becomes_one_synthetic_strategy_per_value_beside_the_real_one(tmp_path):
    m = _load(tmp_path, _raw())
    ids = [s.id for s in m.strategies]
    assert ids == ["baseline", "draft-simple"] + [f"draft-simple[synth-len={x}]" for x in LENGTHS]
    s = m.strategy("draft-simple[synth-len=2]")
    assert s.synthetic and s.family == "draft-simple" and s.sweep == () and s.args[-2:] == ("--spec-synth-len", "2")
    assert not m.strategy("draft-simple").synthetic and m.baseline_for(s).id == "baseline"
    rates = _load(tmp_path, _raw({"rates": [[0.9, 0.8, 0.5], [1, 1, 1]]}, args=[]))
    assert rates.strategy("draft-simple[synth-rates=0.9,0.8,0.5]").args == ("--spec-synth-rates", "0.9,0.8,0.5")
    # a swept entry's curve at one of its combinations, named after it
    swept = _load(tmp_path, _raw({"lengths": [1, 4], "at": {"--spec-draft-p-min": 0.75}}, args=[],
                                 sweep={"--spec-draft-p-min": [0.5, 0.75]}))
    s = swept.strategy("draft-simple[p-min=0.75,synth-len=4]")
    assert s.args == ("--spec-draft-p-min", "0.75", "--spec-synth-len", "4") and s.sweep == () and s.synthetic


@pytest.mark.parametrize("block, strategy, where, why", [
    ({"lengths": [1, 10]}, {}, "breakeven.lengths[1]", r"outside \[1, 9\] \(n_max 8"),
    ({"lengths": [0.5, 2]}, {}, "breakeven.lengths[0]", "at least 1"),
    ({"lengths": [1, 4.5]}, {"args": []}, "breakeven.lengths[1]", r"outside \[1, 4\]"),  # the build's n_max 3
    ({"lengths": [1, 2], "rates": [[1], [0]]}, {}, "breakeven", "exactly one of lengths or rates"),
    ({"rates": [[0.9, 0.8], [0.5, 0.5]]}, {"args": []}, "breakeven.rates[0]", "exactly n_max = 3"),
    ({"rates": [[0.5, 0.6, 0.1], [0.1, 0, 0]]}, {"args": []}, r"breakeven.rates\[0\]\[1\]", "non-increasing"),
    ({"rates": [[1.5, 0, 0], [0, 0, 0]]}, {"args": []}, "breakeven.rates", "at most 1"),
    ({"lengths": [2, 2.0]}, {}, "breakeven", "given twice"),
    ({"lengths": [1, 2]}, {"sweep": {"--spec-draft-p-min": [0.5, 0.7]}}, "breakeven", "at one combination"),
    ({"lengths": [1, 2], "at": {"--spec-draft-p-min": 0.6}}, {"sweep": {"--spec-draft-p-min": [0.5, 0.7]}},
     "breakeven.at", "not one of the swept values"),
    ({"lengths": [1, 2], "at": {"--spec-draft-p-min": 0.6}}, {}, "breakeven.at", "one value of each swept flag"),
    ({"lengths": [1, 2]}, {"parallel": 2}, "breakeven", "one client"),
])
def test_values_the_build_would_refuse_are_one_line_before_anything_runs(tmp_path, block, strategy, where, why):
    with pytest.raises(ManifestError, match=why) as e:
        _load(tmp_path, _raw(block, **strategy))
    assert "\n" not in str(e.value) and "strategies[1]" in str(e.value)
    assert where.replace("\\", "").split("[")[0] in str(e.value)


def test_a_manifest_cannot_pass_the_synthetic_flags_itself(tmp_path):
    raw = _raw()
    raw["strategies"][1].pop("breakeven")
    raw["strategies"][1]["args"] += ["--spec-synth-len", "2"]
    with pytest.raises(ManifestError, match="breakeven block"):
        _load(tmp_path, raw)


def test_the_crossing_and_its_interval_on_known_lines():
    # speedup = 0.6 L exactly in every round but for a small round-to-round wobble: crosses 1 at 1/0.6
    rng = random.Random(3)
    by_round = {r: {x: 0.6 * x * math.exp(rng.gauss(0, 0.02)) for x in LENGTHS} for r in range(1, 6)}
    c = be.crossing(by_round)
    assert c.length == pytest.approx(1 / 0.6, rel=0.05) and c.lo < 1 / 0.6 < c.hi and c.hi - c.lo < 0.3
    assert be.verdict(c, 8) == be.NEEDS
    assert be.verdict(be.crossing({r: {x: 1.5 + 0.1 * x for x in LENGTHS} for r in (1, 2)}), 8) == be.PAYS
    never = {r: {x: 0.5 + 0.01 * x + 0.001 * r for x in LENGTHS} for r in (1, 2, 3)}
    assert be.verdict(be.crossing(never), 8) == be.NEVER
    flat = {r: {x: 1 + 0.02 * (-1) ** (r + x) for x in LENGTHS} for r in (1, 2, 3)}  # no slope: unbounded
    assert be.crossing(flat).lo is None and be.crossing(flat).hi is None
    assert be.crossing({1: {1: 1.0, 2: 1.2}}) is None  # one round: no interval over rounds


def test_a_run_measures_the_curve_keeps_it_out_of_other_tables_and_says_what_the_strategy_needs(
        tmp_path, world, models_dir):
    m = _load(tmp_path, _raw())

    def speed(labels: dict[str, str]) -> float:  # tok/s: the baseline 100, length L 60 L, the real one 50
        s = labels[f"{LABEL_PREFIX}.strategy"]
        if s == "baseline":
            return 100.0
        return 60.0 * float(s.split("=")[1].rstrip("]")) if "synth-len" in s else 150.0

    eng = fake(speed=speed)
    runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="be", progress=False,
               log=lambda s: None, engines=[eng], runs=3, seed=1)
    synth = [c for c in eng.started if "--spec-synth-len" in c.command]
    assert len(synth) == len(LENGTHS) * 2 * 3  # one fresh container each, every round, both tasks
    s = summarize(RunDir.open(world / "r" / "be"))
    assert {c["strategy"] for c in s["cells"]} == {"baseline", "draft-simple"}  # nowhere else
    assert [g["strategy"] for g in s["geomeans"]] == ["draft-simple"]
    part = s["breakeven"]
    assert part["label"] == "synthetic acceptance (benchmarking only)"
    assert {(c["strategy"], c["task"]) for c in part["curves"]} == {("draft-simple", "code-edit"),
                                                                    ("draft-simple", "json-out")}
    for c in part["curves"]:
        assert [p["length"] for p in c["points"]] == LENGTHS
        assert c["verdict"] == be.NEEDS and c["n_max"] == 8
        assert c["breakeven"]["length"] == pytest.approx(100 / 60, rel=0.1)
        assert c["ceiling"] == {"length": 9, "measured": True, "speedup": c["points"][-1]["speedup"]}
        assert c["ceiling"]["speedup"] == pytest.approx(5.4, rel=0.1)
        assert c["real"] == "draft-simple"
        assert c["achieved"]["sources"] == [be.COUNTERS] and c["achieved"]["length"] > 1
    text = "\n".join(breakeven_report.section(s))
    assert "draft-simple on code-edit needs a mean acceptance length ≥ 1.6" in text
    # the whole report: the section beside the roofline, no synthetic strategy in any other table
    out = tmp_path / "RESULTS.md"
    rp.write([world / "r" / "be"], out, plot=False)
    report = out.read_text()
    head, _, rest = report.partition("### Break-even acceptance: synthetic acceptance (benchmarking only)")
    assert rest and "synth-len" not in head and "### Physics" in head
    assert "synth-len" not in rest.partition("\n### ")[2].partition("\n## ")[0]  # nor in the sections after it
    # the decomposition's "what decides" says what the strategy needs beside what it achieves
    assert report.count("; needs a mean acceptance length ≥ 1.6") == 2  # both tasks
