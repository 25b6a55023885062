"""Sweeps and concurrency levels in a manifest: expansion, names, bounds, the plan `invoke validate` prints; the
winner's statistics (Holm, confirmation) and the serving crossover on numbers whose answer is known."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import yaml

from harness import ROOT
from harness.analysis import serving, sweep
from harness.analysis.records import CellIndex
from harness.analysis.tuning import summary
from harness.intake import manifest as mf
from harness.intake import sweep as expansion
from harness.run import plan as pl
from harness.run.client import percentiles
from harness.run.server import server_command
from harness.store.rundir import RunDir
from tests.conftest import DEMO, SPARK, write_manifest

DEMO_RAW = yaml.safe_load(DEMO.read_text())
REAL = ROOT / "manifests" / "real-gemma3-270m.yaml"


def _with(tmp_path, change, name="m.yaml"):
    raw = yaml.safe_load(DEMO.read_text())
    change(raw)
    return write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), name)


def _bad(tmp_path, change) -> str:
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_with(tmp_path, change))
    msg = str(e.value)
    assert "\n" not in msg and "m.yaml: " in msg
    return msg


def _entry(raw, sid):
    return next(s for s in raw["strategies"] if s["id"] == sid)


# -- expansion ----------------------------------------------------------------------------------------------


def test_a_sweep_expands_into_one_strategy_per_combination_named_by_its_values(tmp_path):
    def change(raw):
        _entry(raw, "draft-simple").pop("args")
        _entry(raw, "draft-simple")["sweep"] = {"--spec-draft-p-min": [0.5, 0.75, 0.9], "--spec-draft-n-max": [4, 8]}
    m = mf.load(_with(tmp_path, change))
    fam = [s for s in m.strategies if s.family_id == "draft-simple"]
    assert [s.id for s in fam] == ["draft-simple[p-min=0.5,n-max=4]", "draft-simple[p-min=0.5,n-max=8]",
                                   "draft-simple[p-min=0.75,n-max=4]", "draft-simple[p-min=0.75,n-max=8]",
                                   "draft-simple[p-min=0.9,n-max=4]", "draft-simple[p-min=0.9,n-max=8]"]
    s = m.strategy("draft-simple[p-min=0.75,n-max=8]")
    assert s.args == ("--spec-draft-p-min", "0.75", "--spec-draft-n-max", "8") and s.draft == "draft"
    assert s.sweep == (("--spec-draft-p-min", "0.75"), ("--spec-draft-n-max", "8"))
    assert m.baseline_for(s).id == "baseline"
    cmd = server_command(m, s, {k: ROOT / f"{k}.gguf" for k in m.models}, 8080)
    assert cmd[cmd.index("--spec-draft-p-min") + 1] == "0.75" and cmd[cmd.index("--spec-draft-n-max") + 1] == "8"


def test_parallel_levels_keep_the_single_stream_id_and_pair_each_level_with_its_own_baseline(tmp_path):
    def change(raw):
        _entry(raw, "ngram-mod")["parallel"] = [1, 4]
    m = mf.load(_with(tmp_path, change))
    assert [s.id for s in m.strategies[:3]] == ["baseline", "baseline[parallel=2]", "baseline[parallel=4]"]
    assert m.baseline_for(m.strategy("ngram-mod")).id == "baseline"
    assert m.baseline_for(m.strategy("ngram-mod[parallel=4]")).id == "baseline[parallel=4]"
    assert m.baseline_for(m.strategy("baseline[parallel=4]")).id == "baseline[parallel=4]"
    paths = {k: ROOT / f"{k}.gguf" for k in m.models}
    cmd = server_command(m, m.strategy("ngram-mod[parallel=4]"), paths, 8080)
    # the slot count replaces the manifest's, and each of the 4 clients keeps the manifest's context
    assert cmd.count("--parallel") == 1 and cmd[cmd.index("--parallel") + 1] == "4"
    assert cmd.count("-c") == 1 and cmd[cmd.index("-c") + 1] == str(12288 * 4)
    # the one-int form stays valid, and keeps its name
    def one(raw):
        _entry(raw, "ngram-mod")["parallel"] = 2
    assert mf.load(_with(tmp_path, one, "one.yaml")).strategy("ngram-mod").parallel == 2


def test_short_names_fall_back_to_the_whole_flag_when_two_would_clash():
    assert expansion.short_names(["--spec-draft-n-max", "--spec-ngram-mod-n-max", "-c"]) == {
        "--spec-draft-n-max": "spec-draft-n-max", "--spec-ngram-mod-n-max": "spec-ngram-mod-n-max", "-c": "c"}


@pytest.mark.parametrize("change, field, words", [
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--model": ["x"]}), "strategies[8].sweep.--model",
     "the kit sets the target model"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--log-file": ["x"]}), "strategies[8].sweep.--log-file",
     "not an allowed llama-server flag"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--parallel": [1, 2]}), "strategies[8].sweep.--parallel",
     "parallel: [1, 2, 4]"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--no-warmup": [1]}), "strategies[8].sweep.--no-warmup",
     "takes no value"),
    (lambda r: _entry(r, "draft-simple").update(sweep={"--spec-draft-n-max": [2, 4]}),
     "strategies[1].sweep.--spec-draft-n-max", "also given in args"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"-t": [1, 2]}), "strategies[8].sweep.-t",
     "also given in server_args"),
    (lambda r: _entry(r, "baseline").update(sweep={"--spec-draft-n-max": [2, 4]}), "strategies[0].sweep",
     "sweep a speculative strategy"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={f"--spec-ngram-mod-n-{k}": list(range(1, 7))
                                                  for k in ("min", "max")}), "strategies[8].sweep",
     "6 x 6 = 36 combinations; at most 32"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--spec-ngram-mod-n-max": list(range(9))}),
     "strategies[8].sweep.--spec-ngram-mod-n-max", "more than 8 items"),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--spec-ngram-mod-n-max": ["-x"]}),
     "strategies[8].sweep.--spec-ngram-mod-n-max[0]", ""),
    (lambda r: _entry(r, "ngram-mod").update(sweep={"--spec-ngram-mod-n-max": [8, 8.0]}),
     "strategies[8].sweep.--spec-ngram-mod-n-max", "non-unique"),
    (lambda r: _entry(r, "ngram-mod").update(parallel=[1, 2, 2]), "strategies[8].parallel", "not valid"),
    (lambda r: _entry(r, "ngram-mod").update(parallel=[1, 128]), "strategies[8].parallel", "not valid"),
    (lambda r: _entry(r, "ngram-mod").update(parallel=[2], args=["--parallel", "2"]), "strategies[8].args",
     "give the number of slots with parallel"),
])
def test_bad_sweeps_and_levels_are_one_line_naming_the_field(tmp_path, change, field, words):
    msg = _bad(tmp_path, change)
    assert f": {field}" in msg and words in msg, msg


def test_expanded_ids_must_stay_unique_and_the_expansion_is_bounded(tmp_path):
    def clash(raw):
        raw["strategies"].append({"id": "ngram-mod", "spec_type": "ngram-mod", "parallel": [2]})
    assert "strategies[12].id: duplicate id 'ngram-mod' (also strategies[8])" in _bad(tmp_path, clash)

    def brackets(raw):  # a manifest cannot name a strategy as a combination is named
        raw["strategies"].append({"id": "ngram-mod[parallel=2]", "spec_type": "ngram-mod"})
    assert "strategies[12].id: 'ngram-mod[parallel=2]' does not match" in _bad(tmp_path, brackets)

    def huge(raw):
        for i in range(9):
            raw["strategies"].append({"id": f"n{i}", "spec_type": "ngram-mod", "parallel": list(range(1, 9)),
                                      "sweep": {"--spec-ngram-mod-n-max": [1, 2, 3, 4]}})
    assert "strategies[19].id: 273 strategies once sweeps and levels are expanded; at most 256" in _bad(tmp_path, huge)


# -- the plan -----------------------------------------------------------------------------------------------


def test_validate_prints_the_expanded_plan_and_its_measurement_count():
    m = mf.load(DEMO)
    p = pl.make_plan(m, ["local"], shuffle_seed=0)
    assert len(p.strategies) == 17 and len(p.items) == 17 * 8 * 3
    out = pl.render(m, ROOT / "no-models-here")
    assert "plan: 17 strategies x 8 tasks x 3 runs = 408 measurements" in out
    assert "sweep ngram-simple: 4 combinations (--spec-ngram-simple-size-n 2, 4 x --spec-ngram-simple-size-m 8, 48)" \
        in out
    assert "serving baseline: 1, 2, 4 concurrent clients" in out
    # 2 confirmation rounds x (the best two combinations + their baseline at its 3 levels) x 8 tasks
    assert "+80 measurements, 488 in all" in out
    assert "ngram-simple[size-n=2,size-m=48] --spec-type ngram-simple --spec-ngram-simple-size-n 2" in out
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "validate", "--manifest", str(REAL)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "sweep ngram-simple: 6 combinations" in res.stdout and "serving baseline: 1, 2, 4" in res.stdout


def test_a_sweep_is_selected_by_its_entry_id_and_a_combination_in_full():
    m = mf.load(DEMO)
    strats, _ = pl.select(m, ["ngram-simple"], None)
    assert [s.id for s in strats] == ["baseline", "ngram-simple[size-n=2,size-m=8]", "ngram-simple[size-n=2,size-m=48]",
                                      "ngram-simple[size-n=4,size-m=8]", "ngram-simple[size-n=4,size-m=48]"]
    strats, _ = pl.select(m, ["ngram-simple[size-n=4,size-m=8]"], None)
    assert [s.id for s in strats] == ["baseline", "ngram-simple[size-n=4,size-m=8]"]
    strats, _ = pl.select(m, ["baseline"], None)  # an id is that strategy: the single-stream baseline
    assert [s.id for s in strats] == ["baseline"]
    strats, _ = pl.select(m, ["baseline[*]", "ngram-mod"], None)
    assert [s.id for s in strats] == ["baseline", "baseline[parallel=2]", "baseline[parallel=4]", "ngram-mod"]
    with pytest.raises(Exception, match="known: baseline, baseline-mtp, dflash2"):
        pl.select(m, ["ngram-simple[size-n=3]"], None)


def test_the_strategy_flag_keeps_a_combinations_commas():
    import tasks

    assert tasks._split(["baseline,ngram-simple[size-n=3,size-m=16]", "ngram-mod"]) == [
        "baseline", "ngram-simple[size-n=3,size-m=16]", "ngram-mod"]


def test_the_spark_manifest_sweeps_p_min_for_the_2b_draft_and_has_the_serving_curve():
    m = mf.load(SPARK)
    assert [s.id for s in m.strategies if s.family_id == "draft-2b" and not s.synthetic] == [
        "draft-2b[p-min=0.5]", "draft-2b[p-min=0.75]", "draft-2b[p-min=0.9]"]
    # and its break-even curve at the study's p-min, as DSpark's and DFlash2's (synthetic acceptance)
    for f, name in (("draft-2b", "draft-2b[p-min=0.75,synth-len={}]"), ("dspark", "dspark[synth-len={}]"),
                    ("dflash2", "dflash2[synth-len={}]")):
        assert [s.id for s in m.strategies if s.family_id == f and s.synthetic] == [
            name.format(x) for x in ("1", "1.5", "2", "3", "4")]
    assert [s.parallel for s in m.strategies if s.family_id == "baseline"] == [1, 2, 4, 8]


# -- the winner ---------------------------------------------------------------------------------------------


def test_holm_matches_the_textbook_step_down():
    # m = 4: 0.01*4, 0.02*3, 0.03*2, 0.04*1 -> 0.04, 0.06, 0.06 (kept monotone), 0.06
    assert sweep.holm([0.03, 0.01, None, 0.04, 0.02]) == pytest.approx([0.06, 0.04, None, 0.06, 0.06])
    assert sweep.holm([0.5, 0.9]) == [1.0, 1.0]


def _ratios(truth: dict[str, float], tasks=("a", "b"), rounds=range(1, 6), noise=0.05, own=0.01, seed=1):
    rng = np.random.default_rng(seed)
    shared = {r: rng.normal(0, noise) for r in rounds}  # what the machine did to the round: shared by all
    return {c: {t: {r: math.exp(math.log(v) + shared[r] + rng.normal(0, own)) for r in rounds}
                for t in tasks} for c, v in truth.items()}


def _figures(ratios) -> sweep.Figures:
    """Plain figures for plain numbers (the report passes its speedup table's): geometric means, no intervals."""
    out = {}
    for c, per in ratios.items():
        logs = {t: [math.log(v) for v in rr.values()] for t, rr in per.items() if rr}
        figs = {t: sweep.Figure(math.exp(np.mean(x)), None, None, len(x)) for t, x in logs.items()}
        if logs:
            figs[None] = sweep.Figure(math.exp(np.mean([np.mean(x) for x in logs.values()])), None, None,
                                      min(len(x) for x in logs.values()))
        out[c] = figs
    return out


def test_select_names_the_best_and_keeps_only_the_clearly_worse_out_of_its_tie():
    ratios = _ratios({"x[n=1]": 1.50, "x[n=2]": 1.50, "x[n=4]": 1.10})
    sel = sweep.select(ratios, _figures(ratios))
    assert sel.best in ("x[n=1]", "x[n=2]")
    worse = {c.combination: c for c in sel.candidates}["x[n=4]"]
    assert worse.distinguishable and worse.p_holm < 0.05 and worse.vs_best.high < 1
    assert sel.tied == [sel.best, next(c for c in ("x[n=1]", "x[n=2]") if c != sel.best)]
    # the round's shared disturbance cancels in the pairing: the interval vs the best is narrow
    assert worse.vs_best.high / worse.vs_best.low < 1.06
    one = sweep.select(ratios, _figures(ratios), "a")
    assert one.task == "a" and one.best in ("x[n=1]", "x[n=2]")
    # the figures decide the order, whatever the rounds say: the report's table ranks, the rounds compare
    flipped = {c: dict(f) for c, f in _figures(ratios).items()}
    flipped["x[n=4]"][None] = sweep.Figure(9.0, None, None, 5)
    assert sweep.select(ratios, flipped).best == "x[n=4]"


def _confirmed_sweep(confirm_truth: dict[str, float]) -> sweep.SweepResult:
    sweep_part = _ratios({"w": 1.8, "r": 1.2}, rounds=range(1, 4))
    confirm_part = _ratios(confirm_truth, rounds=range(4, 7), seed=2)
    ratios = {c: {t: {**sweep_part[c][t], **confirm_part[c][t]} for t in ("a", "b")} for c in ("w", "r")}
    return sweep.analyse("x", "local", ratios, ["a", "b"], 4, _figures(sweep_part), _figures(confirm_part),
                         confirmed=["w", "r"])


def test_confirmation_uses_only_the_rounds_after_the_sweep():
    res = _confirmed_sweep({"w": 1.3, "r": 1.25})
    assert res.overall.best == "w" and res.overall.candidates[0].figure.estimate == pytest.approx(1.8, rel=0.03)
    conf = res.confirmation
    assert conf.rounds == (4, 5, 6) and conf.winner == "w" and conf.runner_up == "r"
    assert conf.winner_figure.estimate == pytest.approx(1.3, rel=0.03)  # the winner's curse, measured away
    assert conf.winner_figure.rounds == 3 and res.overall.candidates[0].figure.rounds == 3
    assert conf.winner_vs_runner_up.estimate == pytest.approx(1.3 / 1.25, rel=0.03)
    assert set(conf.winner_tasks) == {"a", "b"}
    sweep_part = _ratios({"w": 1.8, "r": 1.2}, rounds=range(1, 4))
    assert sweep.analyse("x", "local", sweep_part, ["a", "b"], None, _figures(sweep_part)).confirmation is None


def test_a_winner_is_named_only_when_the_best_two_are_distinguishable():
    """1.3x against 1.29x in three confirmation rounds: not distinguishable, no winner; 1.6x against 1.2x: the
    winner; the sweep's runner-up ahead in the confirmation: it wins. Without confirmation rounds the selection
    rounds decide, by the sweep's Holm comparison of the runner-up with the best."""
    close = _confirmed_sweep({"w": 1.3, "r": 1.29})
    assert close.winner is None and close.decided_by is None and close.best_two == ("w", "r")
    assert close.confirmation.winner_vs_runner_up.low < 1 < close.confirmation.winner_vs_runner_up.high
    clear = _confirmed_sweep({"w": 1.6, "r": 1.2})
    assert clear.winner == "w" and clear.decided_by == "confirmation"
    flipped = _confirmed_sweep({"w": 1.1, "r": 1.5})
    assert flipped.winner == "r" and flipped.as_dict()["winner"] == "r"
    apart = _ratios({"x[n=1]": 1.8, "x[n=2]": 1.2})
    alone = sweep.analyse("x", "local", apart, ["a", "b"], None, _figures(apart))
    assert alone.winner == "x[n=1]" and alone.decided_by == "selection"
    tied = _ratios({"x[n=1]": 1.5, "x[n=2]": 1.49})
    assert sweep.analyse("x", "local", tied, ["a", "b"], None, _figures(tied)).winner is None


def test_a_sweep_of_two_rounds_is_ordered_by_point_figures_without_intervals():
    """Two rounds give no cell an interval and the table no geometric mean: the sweep still has an order, from
    the mean of the tasks' log estimates, and prints no interval the table does not have."""
    from harness.analysis import speedups as sp
    from harness.analysis import tuning
    from tests.test_stats import matrix

    truth = {("baseline", "a"): 100.0, ("baseline", "b"): 50.0, ("x[n=1]", "a"): 150.0, ("x[n=1]", "b"): 60.0,
             ("x[n=2]", "a"): 120.0, ("x[n=2]", "b"): 55.0}
    index = CellIndex(matrix(truth, 2, noise=0.01, seed=3))
    bases = {"baseline": None, "x[n=1]": "baseline", "x[n=2]": "baseline"}
    table = sp.table(index, bases)
    assert all(g.estimate is None for g in table.geomeans)
    figs = tuning.figures(table, "local")
    one = figs["x[n=1]"][None]
    assert one.estimate == pytest.approx(math.sqrt(1.5 * 1.2), rel=0.02) and one.low is None and one.rounds == 2
    ratios = tuning.sweep_ratios(index, "local", [("x[n=1]", "baseline"), ("x[n=2]", "baseline")], ["a", "b"])
    assert sweep.select(ratios, figs).best == "x[n=1]"


# -- serving ------------------------------------------------------------------------------------------------


def _samples(name, n, agg, rounds=range(1, 5), spec=None, noise=0.03):
    rng = np.random.default_rng([n, len(name)])  # each strategy and level its own noise
    return [serving.Sample(name, n, r, "t/p", agg * math.exp(rng.normal(0, noise)), (agg / n,), (0.1,), 0.02, 0.05,
                           spec) for r in rounds]


def test_batching_overtakes_speculation_where_the_paired_interval_falls_below_one():
    base = {n: _samples("baseline", n, a) for n, a in ((1, 50.0), (2, 85.0), (4, 130.0))}
    spec = {1: _samples("ngram", 1, 100.0, spec=True)}  # speculation on one slot only
    c = serving.crossover("ngram", "baseline", spec, base)
    assert [(lv.streams, lv.speculative_streams) for lv in c.levels] == [(1, 1), (2, 1), (4, 1)]
    assert c.levels[0].ratio.low > 1 and c.overtaken_at == 4 and c.estimate_below_at == 4
    # speculation measured at 4 slots, but the server said it did not speculate there: the level does not count
    spec[4] = _samples("ngram", 4, 200.0, spec=False)
    assert serving.crossover("ngram", "baseline", spec, base).levels[2].speculative_streams == 1
    spec[4] = _samples("ngram", 4, 200.0, spec=True)
    assert serving.crossover("ngram", "baseline", spec, base).overtaken_at is None


def test_a_curve_point_carries_throughput_latency_and_the_servers_word():
    p = serving.point(_samples("ngram", 2, 80.0, spec=True))
    assert p.streams == 2 and p.speculating is True and p.measurements == 4
    assert p.tpot_ms == pytest.approx(25.0) and p.itl_p50_ms == pytest.approx(20.0)
    assert p.aggregate.low < p.aggregate.estimate < p.aggregate.high


def test_inter_token_percentiles():
    assert percentiles([]) == {"itl_p50_s": None, "itl_p99_s": None}
    gaps = [0.0, 0.0, 0.0, 0.1] * 25  # bursts of accepted drafts: median 0, the pass itself at p99
    out = percentiles(gaps)
    assert out["itl_p50_s"] == 0.0 and out["itl_p99_s"] == pytest.approx(0.1)


# -- the committed real-text sweep ------------------------------------------------------------------------------


def test_committed_real_text_sweep_has_a_confirmed_winner_and_a_serving_curve():
    """results/real-gemma3-270m-sweep (gemma-3-270m on this machine's CPU): six combinations, the winner and the
    runner-up confirmed in rounds of their own, the baseline at three levels, and RESULTS.md says so."""
    rd = RunDir.open(ROOT / "results" / "real-gemma3-270m-sweep")
    meta = rd.read_meta()
    part = summary(meta, CellIndex(rd.measurements()))
    res = part["sweeps"][0]
    assert res["family"] == "ngram-simple" and len(res["combinations"]) == 6
    conf = res["confirmation"]
    first = meta.plan.confirm_from()
    assert first == meta.plan.runs + 1 and conf["rounds"] == list(range(first, first + meta.plan.confirm_rounds))
    assert {conf["winner"], conf["runner_up"]} <= set(res["combinations"])
    assert conf["winner_figure"]["estimate"] and conf["winner_figure"]["rounds"] >= 2
    curves = part["serving"][0]["curves"]
    assert [p["streams"] for p in curves["baseline"]] == [1, 2, 4]
    assert [p["streams"] for p in curves["ngram-mod"]] == [1, 2, 4]
    assert all(p["speculating"] for p in curves["ngram-mod"])  # the server said so, slot by slot
    assert {c["strategy"] for c in part["serving"][0]["crossovers"]} == {conf["winner"], "ngram-mod"}
    text = (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    assert "## Run real-gemma3-270m-sweep" in text and "### Sweeps: which setting" in text
    assert "### Serving: throughput against per-stream latency" in text


def test_the_committed_sweep_keeps_selection_and_confirmation_apart_with_one_interval_per_figure(tmp_path):
    """results/real-gemma3-270m-sweep: the run's table holds the selection rounds alone (3 per cell, also for the
    two combinations confirmed in rounds 4-6), the sweep section prints the table's own figure for each
    combination, the confirmed figures come from those rounds alone, and with the best two at 1.01x [0.86, 1.19]
    in the confirmation no winner is named."""
    import shutil

    from harness.analysis.summary import summarize
    from harness.report import results as rp

    run = tmp_path / "real-gemma3-270m-sweep"
    shutil.copytree(ROOT / "results" / "real-gemma3-270m-sweep", run)
    s = summarize(RunDir.open(run))
    res = s["sweeps"][0]
    conf = res["confirmation"]
    assert s["confirmation_rounds"] == conf["rounds"] == [4, 5, 6] and s["selection_rounds"] == [1, 2, 3]
    geo = {g["strategy"]: g for g in s["geomeans"]}
    for c in res["overall"]["candidates"]:
        g = geo[c["combination"]]
        assert (c["figure"]["estimate"], c["figure"]["low"], c["figure"]["high"]) == pytest.approx(
            (g["estimate"], g["interval"]["low"], g["interval"]["high"]), abs=6e-4), c["combination"]
    cells = [c for c in s["cells"] if c["strategy"] in (conf["winner"], conf["runner_up"])]
    assert cells and all(c["speedup_interval"]["n"] == 3 for c in cells)  # not 6: the confirmation is apart
    assert conf["winner_figure"]["rounds"] == 3
    assert conf["winner_figure"]["estimate"] != pytest.approx(geo[conf["winner"]]["estimate"], abs=0.01)
    vs = conf["winner_vs_runner_up"]
    assert vs["low"] < 1 < vs["high"] and res["winner"] is None and res["best_two"] == [conf["winner"],
                                                                                       conf["runner_up"]]
    rp.write([run], tmp_path / "R.md", plot=False)
    text = (tmp_path / "R.md").read_text(encoding="utf-8")
    assert "**Best two not distinguishable: ngram-simple\\[size-n=3,size-m=16\\] and" in text
    assert "**Winner" not in text and "rounds 4-6 confirm the sweep's best two" in text
    w = geo[conf["winner"]]
    figure = f"{w['estimate']:.2f}x [{w['interval']['low']:.2f}, {w['interval']['high']:.2f}]"
    assert text.count(figure) >= 3  # the run's table, the sweep's headline and its table: one figure, one interval
