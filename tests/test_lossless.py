"""The sampling study (lossless in distribution at temperature > 0): the manifest's `distribution:` block, the
study's plan (arms, seeds, rounds), its statistics (permutation tests, Holm's family, total variation, the
detectable distance, seeded equality), and a whole study through the fake engine (tests/fake_engine.py): drawn,
interrupted and resumed, reported and compared. The real server's answers are tested in test_run.py's demo run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from harness import ROOT, KitError
from harness.analysis import lossless as ls
from harness.analysis.compare import compare
from harness.analysis.summary import summarize
from harness.intake import manifest as mf
from harness.intake.bounded_yaml import ManifestError
from harness.report import results as rp
from harness.report.compare import text
from harness.run import plan as pl
from harness.run import runner, study
from harness.share import bundle as bu
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.fake_engine import fake

STUDY = {"sampling": {"temperature": 0.8}, "samples": 24, "tokens": 8, "batch": 10, "tasks": ["en-prose"],
         "strategies": ["draft-simple", "ngram-mod"], "control": {"temperature": 1.6}}


def demo_with(tmp_path: Path, block: dict | None, **changes) -> Path:
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution", None)
    if block is not None:
        raw["distribution"] = block
    raw.update(changes)
    return write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))


# ---------------------------------------------------------------- the manifest and the plan


def test_the_block_resolves_prompts_strategies_and_control(tmp_path):
    m = mf.load(demo_with(tmp_path, STUDY))
    d = m.distribution
    assert (d.temperature, d.samples, d.tokens, d.prefix, d.batch, d.seed) == (0.8, 24, 8, 3, 10, 1)
    assert d.prompts == (("en-prose", "en-prose"),) and d.strategies == ("draft-simple", "ngram-mod")
    assert d.control == ("temperature", 1.6)
    # defaults: every task's first prompt, every speculative strategy at one client (a sweep's first combination)
    d = mf.load(demo_with(tmp_path, {"sampling": {"temperature": 0.7, "top_k": 20}})).distribution
    assert [t for t, _ in d.prompts] == [t.id for t in m.tasks] and d.control == ("temperature", 1.1)
    assert "ngram-simple[size-n=2,size-m=8]" in d.strategies and "baseline" not in d.strategies
    assert not any("size-m=48" in s for s in d.strategies) and "mtp" in d.strategies


@pytest.mark.parametrize("change, message", [
    ({"strategies": ["baseline"]}, "distribution.strategies[0]: 'baseline' is not a speculative strategy at one "
                                   "client"),
    ({"strategies": ["ngram-simple"]}, "distribution.strategies[0]: 'ngram-simple' is not a speculative"),
    ({"tasks": ["poetry"]}, "distribution.tasks[0]: 'poetry': no task 'poetry'"),
    ({"tasks": ["en-prose/x"]}, "distribution.tasks[0]: 'en-prose/x': task 'en-prose' has no prompt 'x'"),
    ({"control": {"temperature": 0.8}}, "distribution.control.temperature: 0.8 is the study's own setting"),
    ({"sampling": {"temperature": 0}}, "distribution.sampling.temperature: expected more than 0, got 0"),
    ({"control": {"temperature": 1.0, "top_k": 5}}, "distribution.control: more than 1 entries"),
    ({"samples": 1}, "distribution.samples: expected at least 2, got 1"),
])
def test_a_wrong_block_is_one_line_naming_its_field(tmp_path, change, message):
    with pytest.raises(ManifestError) as e:
        mf.load(demo_with(tmp_path, {**STUDY, **change}))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_study_draws_every_arm_in_rounds_with_paired_and_fresh_seeds(tmp_path):
    m = mf.load(demo_with(tmp_path, STUDY))
    s = study.make_study(m, m.distribution, ["local"], 7)
    assert [(a.id, a.role) for a in s.arms] == [
        ("baseline", "baseline"), ("baseline@reference", "reference"), ("baseline@control", "control"),
        ("draft-simple", "strategy"), ("ngram-mod", "strategy")]
    seeds = {a.id: sorted(x for b in s.batches if b.arm.id == a.id for x in b.seeds) for a in s.arms}
    assert seeds["draft-simple"] == seeds["baseline"] == seeds["baseline@control"] == list(range(1, 25))
    assert seeds["baseline@reference"] == list(range(25, 49))  # independent of every other arm's
    assert s.rounds == 3 and [len(b.seeds) for b in s.batches if b.arm.id == "ngram-mod"] == [10, 10, 4]
    assert [b.round for b in s.batches] == sorted(b.round for b in s.batches)  # round by round
    first = [b.arm.id for b in s.batches if b.round == 1]
    assert first == [b.arm.id for b in study.make_study(m, m.distribution, ["local"], 7).batches if b.round == 1]
    assert first != [b.arm.id for b in study.make_study(m, m.distribution, ["local"], 8).batches if b.round == 1]
    assert [a.n_probs for a in s.arms] == [5, 1, 1, 0, 0]  # no probabilities asked of a drafting server
    assert s.requests == 5 * 24 and len(s.batches) == 15
    control = next(a for a in s.arms if a.role == "control")
    assert (control.temperature, control.top_k) == (1.6, None)
    # a selection that leaves no strategy or no task of the study draws none
    assert study.make_study(m, m.distribution, ["local"], 7, ["draft-simple", "baseline"], None).arms[-1].id == \
        "draft-simple"
    assert study.make_study(m, m.distribution, ["local"], 7, None, ["json-out"]) is None


def test_a_study_across_builds_pairs_each_strategy_with_its_own_builds_baseline(tmp_path):
    """In a manifest of several builds, an entry named without its build samples on every build, each against the
    baseline of its own build (never the first build's)."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["builds"] = {"new": {}, "old": {}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none", "builds": ["new", "old"]},
                         {"id": "ngram-mod", "spec_type": "ngram-mod", "builds": ["new", "old"]}]
    raw["distribution"] = {**STUDY, "strategies": ["ngram-mod"]}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True, sort_keys=False)))
    assert m.distribution.strategies == ("ngram-mod[build=new]", "ngram-mod[build=old]")
    s = study.make_study(m, m.distribution, ["local"], 7)
    assert {a.id: a.baseline for a in s.arms if a.role == "strategy"} == {
        "ngram-mod[build=new]": "baseline[build=new]", "ngram-mod[build=old]": "baseline[build=old]"}
    assert {a.strategy.build for a in s.arms if a.role == "control"} == {"new", "old"}

def test_validate_counts_the_sampling_requests(tmp_path, models_dir):
    m = mf.load(demo_with(tmp_path, STUDY))
    out = pl.render(m, models_dir)
    assert ("sampling study at temperature 0.8 (control: temperature 1.6): 2 strategies and 3 baseline arms x 1 "
            "prompt x 24 samples of 8 tokens = 120 requests in 15 batches (3 rounds), one fresh server per batch, its "
            "samples one after another on it") in out
    demo = pl.render(mf.load(DEMO), models_dir)  # the demo's own study: every speculative type of the pinned build
    assert "sampling study at temperature 0.8 (control: top-k 1): 10 strategies and 6 baseline arms" in demo


# ---------------------------------------------------------------- the statistics


def test_the_statistics_are_the_textbook_ones():
    rng = np.random.default_rng(3)
    x, y = list(np.round(rng.normal(size=30), 1)), list(np.round(rng.normal(0.4, size=25), 1))
    m = ls.permutations(30, 25, rng, 10)
    assert ls.kolmogorov_smirnov(x + y)(m)[0] == pytest.approx(sps.ks_2samp(x, y).statistic)
    codes, k, kept = ls.pooled_codes(list("aaaaabbbbbbcd"), list("aaabbbbbcccccdddd"))
    assert (k, kept) == (4, 4) and sorted(set(codes.tolist())) == [0, 1, 2, 3]
    table = np.array([np.bincount(codes[:13], minlength=k), np.bincount(codes[13:], minlength=k)])
    m = ls.permutations(13, 17, rng, 10)
    assert ls.chi_square(codes, k)(m)[0] == pytest.approx(sps.chi2_contingency(table, correction=False)[0])
    codes, k, kept = ls.pooled_codes(list("aaaaabc"), list("aaaaade"))  # b, c, d, e seen once: one category
    assert (k, kept) == (2, 1)
    assert all(m.sum(axis=1) == 13)  # every relabelling keeps the sample sizes


def _draws(rng: np.random.Generator, n: int, temperature: float, length: int = 8) -> list[ls.Sample]:
    """n samples of a small Markov chain at a temperature, with their log-probabilities at temperature 1."""
    logits = np.random.default_rng(0).normal(0, 2.5, (30, 30))
    out = []
    for i in range(n):
        t, toks, lps = 0, [], []
        for _ in range(length):
            p = np.exp(logits[t] / temperature)
            q = np.exp(logits[t])
            t = int(rng.choice(30, p=p / p.sum()))
            toks.append(t)
            lps.append(float(np.log(q[t] / q.sum())))
        out.append(ls.Sample(i, tuple(toks), tuple(lps), None, 0))
    return out


def test_a_a_comparisons_rarely_differ_and_a_hotter_sampler_is_told_apart():
    rng = np.random.default_rng(11)
    ps = []
    for r in range(40):
        c = ls.two_sample(_draws(rng, 30, 0.8), _draws(rng, 30, 0.8), 3, np.random.default_rng(r))
        ps += [t["p"] for t in c.tests]
    assert np.mean(np.array(ps) <= 0.05) < 0.12 and 0.35 < np.mean(ps) < 0.65  # p-values near uniform
    c = ls.two_sample(_draws(rng, 60, 1.6), _draws(rng, 60, 0.8), 3, np.random.default_rng(1))
    assert min(t["p"] for t in c.tests) < 0.001 and c.tv["estimate"] > c.tv["low"] > 0

def test_the_detectable_distance_is_found_at_the_distance_stated_and_not_far_below_it():
    """The figure beside "no difference detected": a departure of that distance (the least detectable shapes, at the
    first token and at later ones) is found by the kit's own permutation tests at the family's strictest level in
    about 80% of draws; one at 0.6 of it far less often; more samples state less, a larger family more."""
    ref = _draws(np.random.default_rng(5), 60, 0.8)
    outcomes = tuple(s.tokens[:3] for s in ref)
    tv = ls.detectable_tv(outcomes, 60, 10)
    assert ls.detectable_tv(outcomes, 30, 10) > tv > ls.detectable_tv(outcomes, 120, 10)
    assert ls.detectable_tv(outcomes, 60, 40) > tv and tv == ls.detectable_tv(outcomes, 60, 10)
    assert ls.detectable_tv(((1, 2, 3),) * 20, 20, 5) == ls._two_halves_tv(20, 20, 5)  # all alike: no halves
    rng = np.random.default_rng(3)
    checked = []
    for where in ("first", "later"):
        found = {}
        for scale in (1.0, 0.6):
            w, reach = ls.departure(outcomes, tv * scale, where, 120)
            if w is None:  # no departure of this shape reaches that far among these outcomes
                assert reach < tv * scale
                break
            hits = 0
            for _ in range(40):
                a = [ref[i] for i in rng.choice(60, 60, p=w)]
                b = [ref[i] for i in rng.integers(0, 60, 60)]
                tests = ls.two_sample(a, b, 3, rng, count=999).tests
                hits += min(t["p"] for t in tests if t["p"] is not None) <= ls.ALPHA / 10
            found[scale] = hits / 40
        else:
            assert found[1.0] >= 0.65 and found[0.6] < 0.6, (where, tv, found)
            checked.append(where)
    assert "first" in checked


def test_the_same_samples_give_the_same_p_values_every_time():
    a, b = _draws(np.random.default_rng(1), 20, 0.8), _draws(np.random.default_rng(2), 20, 0.8)
    once = ls.two_sample(a, b, 3, ls.row_rng("h", "x")).tests
    assert once == ls.two_sample(a, b, 3, ls.row_rng("h", "x")).tests
    assert once != ls.two_sample(a, b, 3, ls.row_rng("h", "y")).tests


def test_seeded_equality_names_where_a_sample_left_the_baseline():
    top = ((7, -0.1), (8, -2.0), (9, -2.1))
    base = {1: ls.Sample(1, (7, 7, 7), (-0.1, -0.1, -0.1), (top, top, top), 0),
            2: ls.Sample(2, (7, 7, 7), (-0.1, -0.1, -0.1), (top, top, top), 0)}
    other = {1: ls.Sample(1, (7, 7, 7), None, None, 4), 2: ls.Sample(2, (7, 9, 7), None, None, 4)}
    s = ls.seeded_equality(base, other)
    assert (s["paired"], s["identical"]) == (2, 1)
    assert s["divergent"] == [{"seed": 2, "position": 1, "baseline_token": 7, "baseline_rank": 1, "token": 9,
                               "rank": 3, "baseline_logprob": -0.1, "logprob": -2.1}]
    assert ls.verification("draft-simple", ["--spec-draft-sampling", "probabilistic"]) == "rejection"
    assert ls.verification("draft-simple", ["--spec-draft-sampling=probabilistic"]) == "rejection"
    assert ls.verification("draft-dflash", ["--spec-draft-sampling", "probabilistic"]) == "exact match"
    assert ls.verification("draft-mtp", []) == "exact match"


# ---------------------------------------------------------------- a whole study through the fake engine


def _run(world, models_dir, manifest: Path, run_id: str = "s", **kwargs) -> str:
    kwargs = {"engines": [fake()], "seed": 3, **kwargs}
    return runner.run(trusted(manifest), results_dir=world / "r", models_dir=models_dir, run_id=run_id,
                      progress=False, log=lambda s: None, **kwargs)


def test_a_study_drawn_alone_is_recorded_judged_and_reported(world, models_dir):
    eng = fake()
    out = _run(world, models_dir, demo_with(world, STUDY), engines=[eng], distribution=30)
    rd = RunDir.open(world / "r" / "s")
    meta = rd.read_meta()
    assert meta.plan.runs == 0 and meta.plan.measurements == 0 and rd.measurements() == []
    assert meta.plan.distribution.settings.samples == 30 and meta.status == "complete"
    batches = rd.samples()
    assert len(batches) == 5 * 3 and all(b["status"] == "ok" for b in batches)
    assert "sampling study: 15 batches (150 samples) drawn, 0 failed" in out
    assert len(eng.started) == 15 and eng.containers == []  # one fresh server per batch, none left
    assert all(len(s["tokens"]) == 8 for b in batches for s in b["samples"])
    assert all((s.get("logprobs") is None) == (b["role"] == "strategy") for b in batches for s in b["samples"])
    summary = summarize(rd)
    d = summary["distribution"]
    rows = {r["arm"]: r for r in d["rows"]}
    assert rows["draft-simple"]["stage1"] == {"paired": 30, "identical": 30, "divergent": []}
    assert rows["draft-simple"]["verification"] == "exact match" and rows["draft-simple"]["drafted"] > 0
    assert rows["baseline@control"]["verdict"] == "differs" and d["power"] is True
    assert rows["baseline"]["kind"] == "aa" and rows["baseline"]["verdict"] == "no difference detected"
    # identical samples: the strategy's log-probabilities are the baseline's, so every test runs
    assert all(t["p"] is not None for t in rows["draft-simple"]["tests"])
    assert d["family"]["tests"] == 2 * 4 and d["samples"] == 150  # the strategies' rows run the A/A row's tests
    rp.write([rd.path], world / "R.md", plot=False)
    md = (world / "R.md").read_text()
    assert "### Lossless in distribution at temperature 0.8" in md and "### Speedup" not in md
    assert "identical 30/30" in md and "| detected (p " in md and "the sampling study alone" in md
    # no timed round was planned: nothing for a resume to add, and neither the run nor the report suggests one
    assert "### To complete this run" not in md and "have no verdict" not in out
    # identical samples, the same reference and relabellings: the strategies' rows are the A/A row's
    assert rows["draft-simple"]["tests"] == rows["ngram-mod"]["tests"] == rows["baseline"]["tests"]


def test_a_study_after_the_timed_rounds_and_its_resume(world, models_dir):
    manifest = demo_with(world, STUDY)
    calls = []

    def stop_in_the_study(engine, labels, n):
        calls.append(n)
        if len(calls) == 2 + 3:  # the 2 timed measurements (draft-simple and its baseline), then the third batch
            raise KeyboardInterrupt

    with pytest.raises(KitError, match="interrupted; .* resume with `invoke run --resume s`"):
        _run(world, models_dir, manifest, engines=[fake(on_start=stop_in_the_study)], strategies=["draft-simple"],
             tasks=["en-prose"], runs=1)
    rd = RunDir.open(world / "r" / "s")
    assert rd.read_meta().status == "interrupted" and len(rd.samples()) == 2 and len(rd.measurements()) == 2
    eng = fake()
    out = _run(world, models_dir, manifest, engines=[eng], resume="s")
    assert "sampling study: 10 batches (" in out and "drawn, 0 failed, 2 already recorded" in out
    assert len(eng.started) == 10  # the timed measurements were done: only the batches left are drawn
    assert len(rd.samples()) == 4 * 3 and len({b["batch_id"] for b in rd.samples()}) == 12
    assert sum(len(b["samples"]) for b in rd.samples()) == 4 * 24
    assert rd.read_meta().status == "complete" and "distribution" in summarize(rd)


def test_a_selection_without_the_studys_tasks_draws_no_study(world, models_dir):
    _run(world, models_dir, demo_with(world, STUDY), strategies=["draft-simple"], tasks=["json-out"], runs=1)
    rd = RunDir.open(world / "r" / "s")
    assert rd.read_meta().plan.distribution is None and rd.samples() == []
    assert "distribution" not in summarize(rd)
    with pytest.raises(KitError, match="--distribution: the selected strategies and tasks leave the sampling study"):
        _run(world, models_dir, demo_with(world, STUDY), run_id="t", tasks=["json-out"], distribution=10)


def test_compare_carries_the_distribution_verdicts_over(world, models_dir, tmp_path):
    _run(world, models_dir, demo_with(world, STUDY), distribution=20)
    a = world / "r" / "s"
    b = tmp_path / "b"
    shutil.copytree(a, b)
    same = compare(a, b)
    assert same.distribution["changed"] == 0 and "none changed" in text(same)
    # B's control drawn like its baseline: the verdict that changed is named, and the headline says so
    lines = (b / "samples.jsonl").read_text().splitlines()
    ref = {json.loads(x)["batch_id"].split("/")[-1]: json.loads(x) for x in lines
           if json.loads(x)["arm"] == "baseline@reference"}
    forged = []
    for x in lines:
        rec = json.loads(x)
        if rec["arm"] == "baseline@control":
            rec["samples"] = [{**r, "seed": x["seed"]} for x, r in  # the control's seeds, the reference's tokens
                              zip(rec["samples"], ref[rec["batch_id"].split("/")[-1]]["samples"], strict=True)]
        forged.append(json.dumps(rec))
    (b / "samples.jsonl").write_text("\n".join(forged) + "\n")
    changed = compare(a, b)
    assert changed.distribution["changed"] >= 1
    assert "changed: baseline@control / en-prose: A differs -> B no difference detected" in text(changed)
    assert "distribution verdict" in changed.verdict


def test_a_bundle_of_a_study_drawn_alone_carries_its_samples(world, models_dir, tmp_path):
    manifest = demo_with(world, STUDY)
    _run(world, models_dir, manifest, distribution=10)
    out = bu.make(world / "r" / "s", tmp_path / "s.bundle.tar.gz", manifest.parent)
    _, run = bu.open_bundle(out, tmp_path / "opened")
    assert RunDir.open(run).samples() == RunDir.open(world / "r" / "s").samples()
    assert RunDir.open(run).measurements() == [] and (run / "samples.jsonl").is_file()
    assert "### Lossless in distribution at temperature 0.8" in (run.parent / "RESULTS.md").read_text()


def test_a_samples_line_of_an_arm_the_run_did_not_plan_is_refused(world, models_dir):
    _run(world, models_dir, demo_with(world, STUDY), distribution=10)
    rd = RunDir.open(world / "r" / "s")
    rec = rd.samples()[0]
    rec["arm"] = "eagle3"
    with rd.samples_file.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    with pytest.raises(KitError, match=r"samples.jsonl: line 6: arm 'eagle3' is not one the run planned"):
        rd.samples()


def _forge(rec: dict, change: str) -> dict:
    if change == "seeds":
        rec["samples"][0]["seed"] += 1000
    elif change == "round":
        rec["round"] = 9
    elif change == "id":
        rec["batch_id"] = rec["batch_id"].rsplit("/", 1)[0] + "/2"
    elif change == "temperature":
        rec["temperature"] = 1.3
    elif change == "tokens":
        rec["samples"][0]["tokens"] = rec["samples"][0]["tokens"] * 3
    elif change == "spec_type":
        rec["spec_type"] = "ngram-cache"
    return rec


@pytest.mark.parametrize("change, message", [
    ("seeds", r"line 2: seeds \[1001, 2, 3\]\.\.\. \(10\), but round 1 of arm '[^']+' draws seeds 1 to 10"),
    ("round", r"line 2: round 9 is not one the study planned \(rounds 1 to 1\)"),
    ("id", r"line 2: batch id '[^']+/2', expected '[^']+/1' for its arm, prompt and round"),
    ("temperature", r"line 2: temperature 1.3, but arm '[^']+' is sampled with (0.8|1.6)"),
    ("tokens", r"line 2: samples\[0\]: 24 tokens, more than the 8 asked for"),
    ("spec_type", r"line 2: strategy '[^']+' has spec type 'ngram-cache' here and '[^']+' in run.json"),
    ("twice", r"line 6: batch id '[^']+' appears twice"),
])
def test_a_forged_batch_is_refused_in_one_line_before_any_figure(world, models_dir, change, message):
    """A batch of samples.jsonl is checked against the study's plan as a record is against the run's: its id,
    round, seeds, sampling settings and length are the ones the plan gives it, each batch recorded once."""
    _run(world, models_dir, demo_with(world, STUDY), distribution=10)
    rd = RunDir.open(world / "r" / "s")
    lines = rd.samples_file.read_text().splitlines()
    if change == "twice":
        lines.append(lines[0])
    else:
        lines[1] = json.dumps(_forge(json.loads(lines[1]), change))
    rd.samples_file.write_text("\n".join(lines) + "\n")
    with pytest.raises(KitError, match="samples.jsonl: " + message) as e:
        summarize(RunDir.open(rd.path))
    assert "\n" not in str(e.value) and "this record is not of this run as planned" in str(e.value)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(requests=d["requests"] + 1), r"plan.distribution.requests: 151, but its arms, prompts, "
                                                      r"samples and hosts make 150"),
    (lambda d: d.update(samples=500, prompts=d["prompts"] * 50), r"plan.distribution: 125,000 requests; a run draws "
                                                                 r"at most 100,000 samples"),
    (lambda d: d["arms"][1].update(baseline="draft-simple"), r"plan.distribution.arms\[1\].baseline: "
                                                             r"'draft-simple' is not a baseline arm"),
    (lambda d: d["arms"][2].update(strategy="draft-simple"), r"plan.distribution.arms\[2\].strategy: a control "
                                                             r"arm samples its baseline's server"),
])
def test_a_forged_study_plan_is_refused_in_one_line(world, models_dir, change, message):
    """run.json's study is one the kit makes: its counts follow from its settings, bounded like the measurements,
    and its arms compare with a baseline arm of the same server."""
    _run(world, models_dir, demo_with(world, STUDY), distribution=30)
    run = world / "r" / "s" / "run.json"
    obj = json.loads(run.read_text())
    change(obj["plan"]["distribution"])
    run.write_text(json.dumps(obj))
    with pytest.raises(KitError, match=r"run.json: " + message) as e:
        RunDir.open(run.parent).read_meta()
    assert "\n" not in str(e.value)


def test_a_samples_file_larger_than_the_bound_is_refused_unread(world, models_dir):
    _run(world, models_dir, demo_with(world, STUDY), distribution=10)
    rd = RunDir.open(world / "r" / "s")
    os.truncate(rd.samples_file, (1 << 30) + 1)  # sparse: nothing is written
    with pytest.raises(KitError, match=r"samples.jsonl: larger than 1 GB"):
        rd.samples()


def test_the_calibration_bench_resamples_a_study_into_a_a_tables_and_control_tables(world, models_dir):
    _run(world, models_dir, demo_with(world, STUDY), distribution=30)
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "distribution_calibration.py"), str(world / "r" / "s"),
                          "--tables", "6"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"A/A: 4 rows, \d+ tests per table; at least one false \"differs\" in \d+\.\d% of tables",
                     res.stdout)
    assert re.search(r"control: detected on every prompt in \d+\.\d% of tables; each: baseline on en-prose/en-prose",
                     res.stdout)


def test_the_committed_real_text_study_shows_both_stages_the_control_and_the_detectable_distance(tmp_path):
    """results/real-gemma3-270m-distribution (gemma-3-270m on this machine's CPU, the sampling study alone): every
    strategy's seeded equality and distribution verdict, the control (the baseline at top-k 1) detected on each
    prompt, and the smallest distance the samples could detect beside each "no difference detected"."""
    run = tmp_path / "real-gemma3-270m-distribution"
    shutil.copytree(ROOT / "results" / run.name, run)
    rd = RunDir.open(run)
    meta = rd.read_meta()
    assert meta.plan.runs == 0 and meta.plan.distribution.settings.samples == 60 and meta.status == "complete"
    d = summarize(rd)["distribution"]
    strategies = [r for r in d["rows"] if r["kind"] == "strategy"]
    assert {r["arm"] for r in strategies} == {"ngram-simple[size-n=3,size-m=16]", "ngram-mod", "layer-skip-15"}
    assert {(r["task"], r["prompt"]) for r in strategies} == {("en-prose", "en-prose"), ("zh-prose", "zh-prose")}
    for r in strategies:
        assert r["stage1"]["paired"] == 60 and r["verification"] == "exact match" and r["drafted"] > 0
        assert r["verdict"] in ("no difference detected", "differs") and 0 < r["detectable_tv"] < 1
    controls = {r["task"]: r for r in d["rows"] if r["kind"] == "control"}
    assert {t: c["verdict"] for t, c in controls.items()} == {"en-prose": "differs", "zh-prose": "differs"}
    assert d["power"] is True
    # zh-prose's control moved the first tokens beyond what the samples could detect; en-prose's less, and a test
    # over all the tokens still told it apart
    assert controls["zh-prose"]["tv"]["estimate"] > controls["zh-prose"]["detectable_tv"]
    rp.write([run], tmp_path / "R.md", plot=False)
    text_ = (tmp_path / "R.md").read_text()
    assert "### Lossless in distribution at temperature 0.8" in text_ and "the sampling study alone" in text_
    assert "The control (the baseline at top-k 1) was detected on every prompt" in text_
    assert "**The study had no power**" not in text_ and "could detect TV ≥" in text_


# ---------------------------------------------------------------- the demo's own study, on the real server


def test_the_demo_run_draws_its_sampling_study_on_every_speculative_type(demo_run):
    """The demo manifest's study in the session's demo run: every speculative type of the pinned build against its
    baseline at temperature 0.8 with the same seeds and with others, and the control the tests must tell apart."""
    rd = RunDir.open(demo_run)
    meta = rd.read_meta()
    study_ = meta.plan.distribution
    batches = rd.samples()
    assert len(batches) == study_.batches and all(b["status"] == "ok" for b in batches), \
        [b.get("failure") for b in batches if b["status"] != "ok"]
    assert len({b["container_id"] for b in batches}) == len(batches)  # a fresh server each
    assert all(len(s["tokens"]) == study_.settings.tokens for b in batches for s in b["samples"])
    # the server gives log-probabilities where nothing is drafted; a drafting server's are not asked for
    assert all((s.get("logprobs") is not None) == (b["role"] != "strategy") for b in batches for s in b["samples"])
    d = summarize(rd)["distribution"]
    rows = {r["arm"]: r for r in d["rows"]}
    speculative = {s.id for s in meta.planned_strategies() if s.speculative and s.parallel == 1 and
                   (not s.sweep or s.id == "ngram-simple[size-n=2,size-m=8]")}
    assert {a for a, r in rows.items() if r["kind"] == "strategy"} == speculative
    for sid in ("draft-simple", "dflash2", "dspark", "eagle3", "mtp", "ngram-cache"):
        assert rows[sid]["drafted"] > 0, sid  # drafting happened in the samples compared
    for r in rows.values():
        s = r["stage1"]
        if s is not None:  # a sample's first token is sampled before any draft exists: it never differs
            assert s["paired"] == study_.settings.samples and s["identical"] + len(s["divergent"]) == s["paired"]
            assert all(x["position"] >= 1 for x in s["divergent"]), (r["arm"], s["divergent"])
            assert r["verification"] == "exact match"
    # the control (each baseline at top-k 1) is told apart on both targets: the study had power
    assert [r["verdict"] for r in d["rows"] if r["kind"] == "control"] == ["differs", "differs"] and d["power"]
    md = (demo_run.parent / "RESULTS-lossless.md")
    rp.write([demo_run], md, plot=False)
    text_ = md.read_text()
    assert "### Lossless in distribution at temperature 0.8" in text_ and "control: the baseline at top-k 1" in text_
