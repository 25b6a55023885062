"""A forged run folder cannot move a verdict without a line saying why: retakes against the plan's cap, build
pairs of one strategy, sampling batches whose lists match their tokens, study arms that match their settings,
records in the order they were made, server-log figures within their range. Each crafted folder is a copy of a
committed run, edited as someone handed it would edit it, and gets one line naming its file and field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError
from harness.analysis import compare as cmp
from harness.intake import manifest as mf
from harness.report import compare as compare_words
from harness.report import results as rp
from tests.conftest import DEMO as DEMO_MANIFEST
from tests.conftest import write_manifest
from tests.crafted import DEMO_RUN, one_line

BUILDS_RUN = ROOT / "results" / "builds-gemma3-270m"
STUDY_RUN = ROOT / "results" / "real-gemma3-270m-distribution"

Edit = Callable[[dict, list[dict], list[dict]], None]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def forged(folder: Path, source: Path, edit: Edit, name: str = "forged") -> Path:
    """A copy of a committed run with run.json, its measurements and its samples edited."""
    run = folder / name
    shutil.copytree(source, run)
    meta = json.loads((run / "run.json").read_text())
    recs, batches = _lines(run / "measurements.jsonl"), _lines(run / "samples.jsonl")
    edit(meta, recs, batches)
    (run / "run.json").write_text(json.dumps(meta))
    for file, rows in (("measurements.jsonl", recs), ("samples.jsonl", batches)):
        if (run / file).exists():
            (run / file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def refused(folder: Path, source: Path, edit: Edit, *parts: str) -> str:
    run = forged(folder, source, edit)
    with pytest.raises(KitError) as e:
        rp.write([run], folder / "RESULTS.md", plot=False)
    assert not (folder / "RESULTS.md").exists()
    msg = one_line(e, *parts)
    assert "summary.json" not in msg, msg  # the input is named, never the kit's own output
    return msg


# ---------------------------------------------------------------- retakes against the cap

def _retakes_over_cap(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    """40 'retakes' in a run planned with retake_cap 0: disturbed records again, the decode rate doubled."""
    assert meta["plan"]["retake_cap"] == 0
    for r in [r for r in recs if r["status"] == "ok" and r["strategy"].startswith("ngram-mod")][:40]:
        r["interference"] = {**(r.get("interference") or {}), "disturbed": True}
        again = json.loads(json.dumps(r))
        again["client"]["decode_tok_s"] *= 2
        again["retake_of"], again["measurement_id"] = r["measurement_id"], r["measurement_id"] + "/retake"
        recs.append(again)
    for k, r in enumerate(recs):
        r["order"] = k


def test_retakes_beyond_the_plans_cap_are_one_line(sandbox):
    refused(sandbox.work, BUILDS_RUN, _retakes_over_cap, "measurements.jsonl: line 109: retake 1 of the run",
            "run.json plan.retake_cap allows 0")


def test_a_retake_of_a_retake_counts_against_the_cap_too(sandbox):
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        meta["plan"]["retake_cap"] = 1
        first = next(r for r in recs if r["status"] == "ok" and r["strategy"] == "ngram-mod[build=b10502]")
        first["interference"] = {**(first.get("interference") or {}), "disturbed": True}
        again = {**json.loads(json.dumps(first)), "retake_of": first["measurement_id"],
                 "measurement_id": first["measurement_id"] + "/retake"}
        twice = {**json.loads(json.dumps(again)), "retake_of": again["measurement_id"],
                 "measurement_id": again["measurement_id"] + "/retake"}
        recs += [again, twice]
        for k, r in enumerate(recs):
            r["order"] = k
    refused(sandbox.work, BUILDS_RUN, edit, "line 110: retake 2 of the run", "allows 1")


# ---------------------------------------------------------------- build pairs

def _rename(old: str, new: str) -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        for obj in (meta, *recs):
            text = json.dumps(obj).replace(json.dumps(old)[:-1], json.dumps(new)[:-1]).replace(f"/{old}/", f"/{new}/")
            obj.clear()
            obj.update(json.loads(text))
    return edit


def test_a_build_pair_of_two_strategies_is_one_line(sandbox):
    refused(sandbox.work, BUILDS_RUN, _rename("ngram-simple[build=b10502]", "ngram-mod"),
            "run.json: strategies[5].id: 'ngram-mod[build=b10502]' is a second strategy named 'ngram-mod' on build "
            "'b10502'")


def test_a_build_pair_of_two_spec_types_is_one_line(sandbox):
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        # the real ngram-mod of b10502 dropped, ngram-simple's measurements under its name
        gone = "ngram-mod[build=b10502]"
        meta["strategies"] = [s for s in meta["strategies"] if s["id"] != gone]
        meta["plan"]["strategies"].remove(gone)
        recs[:] = [r for r in recs if r["strategy"] != gone]
        _rename("ngram-simple[build=b10502]", "ngram-mod")(meta, recs, batches)
        meta["plan"]["measurements"] = len(recs)
        for k, r in enumerate(recs):
            r["order"] = k
    refused(sandbox.work, BUILDS_RUN, edit, "run.json: strategies[4].spec_type: 'ngram-mod', but 'ngram-mod' "
            "(strategies[3]), the same strategy 'ngram-mod' on build 'b10502', has 'ngram-simple'")


# ---------------------------------------------------------------- the sampling study

def _double_reference_logprobs(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    for b in batches:
        if b["role"] == "reference":
            for s in b["samples"]:
                s["logprobs"] = s["logprobs"] * 2


def _arm_settings(**settings) -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        meta["plan"]["distribution"].update(settings)
    return edit


def _reference_first(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    arms = meta["plan"]["distribution"]["arms"]
    arms.insert(0, arms.pop(1))


def _no_reference(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    d = meta["plan"]["distribution"]
    d["arms"] = [a for a in d["arms"] if a["role"] != "reference"]
    batches[:] = [b for b in batches if b["role"] != "reference"]
    d.pop("batches", None)
    d.pop("requests", None)


@pytest.mark.parametrize("edit,parts", [
    (_double_reference_logprobs, ("samples.jsonl: line", "samples[0].logprobs: 96 entries for its 48 tokens")),
    (_arm_settings(temperature=0.5), ("run.json: plan.distribution.arms[0].temperature: 0.8, but the study's "
                                      "settings", "make 0.5",)),
    (_arm_settings(control={"temperature": 0.81}), ("run.json: plan.distribution.arms[2].temperature: 0.8",
                                                    "make 0.81")),
    (_reference_first, ("run.json: plan.distribution.arms[0].id: 'baseline@reference'", "make 'baseline'")),
    (_no_reference, ("run.json: plan.distribution.arms[1].id: 'baseline@control'", "make 'baseline@reference'")),
])
def test_a_forged_sampling_study_is_one_line(sandbox, edit, parts):
    refused(sandbox.work, STUDY_RUN, edit, *parts)


def test_accepted_drafts_above_drafted_name_the_samples_line(sandbox):
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        s = next(b for b in batches if b["role"] == "strategy")["samples"][0]
        s["draft_n_accepted"] = s["draft_n"] + 1
    refused(sandbox.work, STUDY_RUN, edit, "samples.jsonl: line", "samples[0].draft_n_accepted")


# ---------------------------------------------------------------- order, counts and ranges of the records

def _reverse_order(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    for r in recs:
        r["order"] = len(recs) - 1 - r["order"]


def _last_round_first(meta: dict, recs: list[dict], batches: list[dict]) -> None:
    recs.sort(key=lambda r: -r["round"])
    for k, r in enumerate(recs):
        r["order"] = k


def _server(key: str, value: object, strategy: str = "baseline") -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        next(r for r in recs if r["strategy"] == strategy and r["status"] == "ok")["server"][key] = value
    return edit


def _log(key: str, value: object) -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        next(r for r in recs if r.get("server_log"))["server_log"][key] = value
    return edit


def _statistics(**changes) -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        rec = next(r for r in recs if (r.get("server_log") or {}).get("statistics"))
        stats = next(iter(rec["server_log"]["statistics"].values()))
        stats.update(changes)
    return edit


@pytest.mark.parametrize("edit,parts", [
    (_reverse_order, ("measurements.jsonl: line 1: order 287, expected 0",)),
    (_last_round_first, ("measurements.jsonl: line", "round 2 recorded after a measurement of round 3",)),
    (_server("predicted_n", -5), ("measurements.jsonl: line", "server.predicted_n")),
    (_server("predicted_ms", -40.0), ("measurements.jsonl: line", "server.predicted_ms")),
    (_server("draft_n_accepted", 99, "ngram-mod"), ("measurements.jsonl: line",
                                                    "server.draft_n_accepted 99 is above server.draft_n")),
])
def test_a_record_out_of_order_or_range_is_one_line(sandbox, edit, parts):
    refused(sandbox.work, DEMO_RUN, edit, *parts)


VULKAN_RUN = ROOT / "results" / "demo-vulkan"


@pytest.mark.parametrize("edit,field", [
    (_log("acc_per_pos", [5, -3, 1e15]), "server_log.acc_per_pos"),
    (_log("acc_per_pos", [0.5] * 1_000_000), "server_log.acc_per_pos"),
    (_log("statistics", ["ngram-mod"]), "server_log.statistics"),
    (_log("implementations", [{"x": 1}]), "server_log.implementations"),
    (_log("draft_acceptance", {"rate": 1.5, "accepted": 3, "generated": 2, "mean_len": "4"}),
     "server_log.draft_acceptance"),
    (_statistics(dur_ms={"begin": -1.0, "draft": 0.1, "accept": 0.0}), "dur_ms"),
    (_statistics(dur_ms={"begin": "1 ms", "draft": 0.1, "accept": 0.0}), "dur_ms"),
    (_statistics(mean_acc_len="long"), "mean_acc_len"),
    (_statistics(acc_rate_per_pos=[2.0]), "acc_rate_per_pos"),
])
def test_server_log_figures_outside_their_range_or_type_are_one_line(sandbox, edit, field):
    refused(sandbox.work, VULKAN_RUN, edit, "measurements.jsonl: line", field)


# ---------------------------------------------------------------- compare of two sampling studies

def _without_arm(arm: str) -> Edit:
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        d = meta["plan"]["distribution"]
        d["arms"] = [a for a in d["arms"] if a["id"] != arm]
        batches[:] = [b for b in batches if b["arm"] != arm]
        d["batches"] = d["batches"] // 6 * 5
        d["requests"] = d["requests"] // 6 * 5
    return edit


def test_compare_of_two_studies_names_the_rows_only_one_has(sandbox):
    a = forged(sandbox.work, STUDY_RUN, lambda m, r, b: None, "a")
    b = forged(sandbox.work, STUDY_RUN, _without_arm("ngram-mod"), "b")
    res = cmp.compare(a, b)
    d = res.distribution
    assert d is not None and d["changed"] == 0
    assert sorted((r["side"], r["arm"], r["task"]) for r in d["missing"]) == [
        ("A", "ngram-mod", "en-prose"), ("A", "ngram-mod", "zh-prose")]
    text = compare_words.text(res)
    assert "2 rows only one run has, not compared" in text and "only in A: ngram-mod / en-prose / en-prose" in text
    assert "2 distribution verdicts only one run has" in res.verdict


def test_a_renamed_strategy_arm_is_one_line(sandbox):
    def edit(meta: dict, recs: list[dict], batches: list[dict]) -> None:
        next(a for a in meta["plan"]["distribution"]["arms"] if a["id"] == "ngram-mod")["id"] = "ngram-mod2"
    a = forged(sandbox.work, STUDY_RUN, lambda m, r, b: None, "a")
    b = forged(sandbox.work, STUDY_RUN, edit, "b")
    with pytest.raises(KitError) as e:
        cmp.compare(a, b)
    one_line(e, "b/run.json: plan.distribution.arms[4].id: 'ngram-mod2'", "make 'ngram-mod'")
    with pytest.raises(KitError) as e:
        cmp.compare(a, forged(sandbox.work, STUDY_RUN, _no_reference, "c"))  # no StopIteration
    one_line(e, "c/run.json: plan.distribution.arms[1].id")


# ---------------------------------------------------------------- a server log the kit cannot read

MALFORMED = [
    "srv  log_server_r: draft acceptance = 0.5.1 ( 3 accepted /  6 generated), mean len = 1.5",
    "srv  log_server_r: draft acceptance = 0.5 ( 3 accepted /  6 generated), mean len = 1..5",
    "srv  log_server_r: draft acceptance = 7.0 ( 3 accepted /  6 generated), mean len = 1.5",
    "srv  log_server_r: acc per pos = (0.5, x, 0.1)",
    "srv  log_server_r: acc per pos = (5, -3, 1e15)",
    "srv  log_server_r: acc per pos = (" + ", ".join(["0.5"] * 5000) + ")",
    "srv  log_server_r: statistics ngram-mod: #calls(b,g,a) = 1 2 1, #gen drafts = 1, #acc drafts = 1, "
    "#gen tokens = 3, #acc tokens = 3, #mean acc len = 1.2.3, #acc rate/pos = (1.0)",
    "srv  log_server_r: statistics ngram-mod: #calls(b,g,a) = 1 2 1, #gen drafts = 1, #acc drafts = 1, "
    "#gen tokens = 3, #acc tokens = 3, dur(b,g,a) = 0.1.1, 0.2, 0.3 ms",
    "slot print_timing: id  0 | task 0 | prompt eval time =     1.2.3 ms /    10 tokens",
    "slot print_timing: id  0 | task 0 |        eval time =     .. ms /    10 tokens",
    "slot print_timing: id  0 | task 0 |        eval time =     1.0 ms /    " + "9" * 5000 + " tokens",
    "srv  log_server_r: statistics " + "x" * 100 + ": #calls(b,g,a) = 1 2 1, #gen drafts = 1, #acc drafts = 1, "
    "#gen tokens = 3, #acc tokens = 3",
]


@pytest.mark.parametrize("line", MALFORMED)
def test_a_malformed_server_log_line_fails_the_measurement_with_the_line(line):
    from types import SimpleNamespace

    from harness.run import protocol, serverlog
    from harness.run.client import MeasurementFailed
    log = "adding speculative implementation 'ngram-mod'\n" + line + "\n"
    parsed = serverlog.parse(log)  # never raises
    assert parsed.malformed is not None and line.strip()[:40] in parsed.malformed
    item = SimpleNamespace(cell=SimpleNamespace(task=SimpleNamespace(n_predict=8),
                                                strategy=SimpleNamespace(parallel=1)))
    with pytest.raises(MeasurementFailed) as e:
        protocol.server_statistics(SimpleNamespace(log=lambda tail: log), item, set())
    assert "server log: a line the kit cannot read" in e.value.reason and line.strip()[:40] in e.value.reason
    assert len(e.value.reason) < 600


def test_a_malformed_load_line_is_named_and_the_rest_still_read():
    from harness.run import serverlog
    log = ("load_tensors: using device Vulkan0 (llvmpipe) (unknown id) - 2048 MiB free\n"
           "load_tensors:      Vulkan0 model buffer size =   1.2.3 MiB\n")
    bad: list[str] = []
    used = serverlog.devices(log, bad)
    assert used is not None and used["models"][0]["device"] == "Vulkan0"
    assert len(bad) == 1 and "1.2.3" in bad[0]


def test_an_honest_server_log_reads_as_before():
    from harness.run import serverlog
    log = ("srv  log_server_r: draft acceptance = 0.50000 (    3 accepted /     6 generated), mean len = 1.50\n"
           "srv  log_server_r: acc per pos = (1.0, 0.5, 0.0)\n")
    parsed = serverlog.parse(log)
    assert parsed.malformed is None
    assert parsed.draft_acceptance == {"rate": 0.5, "accepted": 3, "generated": 6, "mean_len": 1.5}
    assert parsed.acc_per_pos == [1.0, 0.5, 0.0]


# ---------------------------------------------------------------- the newest run, read bounded

def test_the_newest_run_is_found_beside_a_deep_or_huge_run_json(sandbox):
    results = sandbox.work / "results"
    honest = forged(results, DEMO_RUN, lambda m, r, b: None, "honest")
    deep = results / "deep"
    deep.mkdir()
    (deep / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    huge = results / "huge"
    huge.mkdir()
    with open(huge / "run.json", "wb") as f:
        f.truncate(40 << 20)  # sparse: 40 MB of zeros, never read
    assert rp.latest_run(results) == honest


# ---------------------------------------------------------------- samples.jsonl read by report as by compare

def test_report_refuses_a_samples_file_of_a_run_that_planned_no_study_as_compare_does(sandbox):
    run = forged(sandbox.work, DEMO_RUN, lambda m, r, b: None)
    shutil.copy(STUDY_RUN / "samples.jsonl", run / "samples.jsonl")
    with pytest.raises(KitError) as e:
        rp.write([run], sandbox.work / "RESULTS.md", plot=False)
    one_line(e, "samples.jsonl: the run planned no sampling study (run.json: plan.distribution)")
    with pytest.raises(KitError) as e:
        cmp.compare(run, run)
    one_line(e, "samples.jsonl: the run planned no sampling study")


def test_a_torn_last_samples_line_is_noted(sandbox):
    run = forged(sandbox.work, STUDY_RUN, lambda m, r, b: None)
    text = (run / "samples.jsonl").read_text()
    (run / "samples.jsonl").write_text(text[: text.rstrip("\n").rfind("\n") + 60])
    rp.write([run], sandbox.work / "RESULTS.md", plot=False)
    assert json.loads((run / "summary.json").read_text())["measurements"]["torn_samples_line"] is True
    assert "the last line of samples.jsonl was cut short" in (sandbox.work / "RESULTS.md").read_text()


# ---------------------------------------------------------------- bounds before any engine is asked

def _invoke(*args: str) -> subprocess.CompletedProcess:
    # an engine that does not exist: a flag checked after reaching it would say so instead
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"})


@pytest.mark.parametrize("flag,value,expected", [
    ("--distribution", "1000000000000", "--distribution: expected 2 to 500 samples per arm"),
    ("--quiet-wait", "99999999999m", "--quiet-wait: expected 0 to 3600 seconds"),
    ("--strategy", "no-such-strategy", "--strategies: no-such-strategy not in the manifest"),
])
def test_run_flags_are_bounded_before_any_engine_is_asked(sandbox, flag, value, expected):
    res = _invoke("run", flag, value, "--manifest", str(DEMO_MANIFEST), "--results", str(sandbox.work))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1 and expected in lines[0], res.stderr
    assert not any(sandbox.work.iterdir())  # no run folder was made


@pytest.mark.parametrize("parse,value,expected", [
    ("distribution", 501, "--distribution: expected 2 to 500 samples per arm"),
    ("distribution", 1, "--distribution: expected 2 to 500 samples per arm"),
    ("seconds", "inf", "--quiet-wait: expected a duration such as 30s or 2m"),
    ("seconds", "٣٠s", "--quiet-wait: expected a duration such as 30s or 2m"),
    ("until", "1_0%", "--until: expected a percentage between 0 and 100%"),
    ("until", "١٠%", "--until: expected a percentage between 0 and 100%"),
])
def test_a_flag_spelt_oddly_or_beyond_its_bound_is_one_line(parse, value, expected):
    import tasks
    from harness.run import study
    check = {"distribution": study.check_samples, "seconds": lambda v: tasks._seconds("--quiet-wait", v),
             "until": tasks._until}[parse]
    with pytest.raises(KitError) as e:
        check(value)
    one_line(e, expected)
    assert tasks._seconds("--quiet-wait", "30s") == 30 and tasks._until("10%") == pytest.approx(0.1)


def test_slots_times_the_context_are_bounded_in_the_manifest(sandbox):
    raw = yaml.safe_load(DEMO_MANIFEST.read_text())
    next(s for s in raw["strategies"] if s["id"] == "baseline")["parallel"] = [1, 64]
    with pytest.raises(KitError) as e:
        mf.load(write_manifest(sandbox.work, yaml.safe_dump(raw, sort_keys=False), "m.yaml"))
    one_line(e, "m.yaml: strategies[0].parallel: 64 slots of server_args' -c 12288 ask llama-server for a context "
                "of 786,432 tokens; at most 262,144")


def test_the_default_control_of_a_hot_study_stays_within_the_temperatures_a_run_accepts(sandbox):
    raw = yaml.safe_load(DEMO_MANIFEST.read_text())
    raw["distribution"] = {"sampling": {"temperature": 9.9}, "samples": 4}
    m = mf.load(write_manifest(sandbox.work, yaml.safe_dump(raw, sort_keys=False), "m.yaml"))
    assert m.distribution is not None and m.distribution.control == ("temperature", 9.5)


# ---------------------------------------------------------------- the sampling table's cost

def test_few_samples_are_tested_over_every_distinct_relabelling():
    import numpy as np

    from harness.analysis import lossless
    m = lossless.permutations(2, 2, np.random.default_rng(0))
    assert m.shape == (6, 4) and m[0].tolist() == [True, True, False, False]
    assert len({tuple(r) for r in m.tolist()}) == 6 and all(r.sum() == 2 for r in m)
    assert lossless.permutations(30, 30, np.random.default_rng(0)).shape == (lossless.PERMUTATIONS + 1, 60)


def test_a_large_study_draws_fewer_relabellings_and_its_report_says_so():
    from harness.analysis import lossless
    from harness.report import lossless as lossless_report
    assert lossless.permutation_count([120] * 12) == lossless.PERMUTATIONS  # the committed study's size
    capped = lossless.permutation_count([1000] * 200)  # 500 samples against 500, 200 rows: the plan's largest
    assert lossless.MIN_PERMUTATIONS <= capped < lossless.PERMUTATIONS
    assert capped * 200 * 1000 ** 2 <= lossless.PERMUTATION_WORK
    study = {"family": {"permutations": capped}, "rows": [{"samples": 500, "reference_samples": 500, "tests": [1]}]}
    assert f"no p-value is below 1/{capped + 1:,}" in lossless_report._relabellings(study)


@pytest.mark.parametrize("n", [30, 100])  # counted pair by pair, and sparsely
def test_the_kernel_test_counts_shared_positions_as_before(n):
    import random

    import numpy as np

    from harness.analysis import lossless
    rng = random.Random(3)
    tokens = [[rng.randrange(5) for _ in range(rng.randrange(0, 9))] for _ in range(n)]
    length = max(len(t) for t in tokens)
    kernel = np.array([[sum(a[j] == b[j] for j in range(min(len(a), len(b)))) / length for b in tokens]
                       for a in tokens])
    m = lossless.permutations(n // 2, n // 2, np.random.default_rng(1), 200)
    s = np.where(m, 2 / n, -2 / n)
    assert np.allclose(lossless.hamming_mmd(tokens)(m), ((s @ kernel) * s).sum(axis=1), rtol=0, atol=1e-12)


def _baseline_batch() -> dict:
    """A batch of the committed study's baseline arm: its samples keep their candidates (`top`)."""
    return next(b for b in _lines(STUDY_RUN / "samples.jsonl") if b["role"] == "baseline")


def _sample_variants() -> list[object]:
    first = _baseline_batch()["samples"][0]
    edits = [
        lambda s: None, lambda s: s.pop("top"), lambda s: s.update(logprobs=None), lambda s: s.update(stop_type=None),
        lambda s: s.update(seed=-1), lambda s: s.update(seed=True), lambda s: s.update(seed=1.0),
        lambda s: s.update(seed=2**63), lambda s: s.pop("draft_n"), lambda s: s.update(extra=1),
        lambda s: s.update(tokens=[1, -2]), lambda s: s.update(tokens=[1, 2.0]), lambda s: s.update(tokens=[0] * 4097),
        lambda s: s.update(tokens="123"), lambda s: s.update(stop_type="x" * 65), lambda s: s.update(stop_type=3),
        lambda s: s.update(logprobs=[0.1]), lambda s: s.update(logprobs=[-1e16]), lambda s: s.update(logprobs=[False]),
        lambda s: s.update(logprobs=[float("nan")]), lambda s: s.update(logprobs=[-3, -0.5]),
        lambda s: s.update(top=[[[1, -0.5], [2, None]]]), lambda s: s.update(top=[[[1, -0.5, 3]]]),
        lambda s: s.update(top=[[[1, 0.5]]]), lambda s: s.update(top=[[[-1, -0.5]]]), lambda s: s.update(top=[[1]]),
        lambda s: s.update(top=[[[1, -0.1]] * 65]), lambda s: s.update(top=None), lambda s: s.update(draft_n="1"),
    ]
    out: list[object] = []
    for edit in edits:
        s = json.loads(json.dumps(first))
        edit(s)
        out.append(s)
    return out + [5, None, "x"]


def test_the_fast_check_of_a_batchs_samples_agrees_with_the_schema():
    from harness import schema
    from harness.store import batch_shape
    batch = _baseline_batch()
    fits = []
    for s in _sample_variants():
        rec = {**batch, "samples": [s]}
        valid = not schema.errors("samples", rec)
        assert batch_shape.samples_fit(rec["samples"]) == valid, s
        fits.append(valid)
    assert 3 < sum(fits) < len(fits)  # both kinds were tried
    assert not batch_shape.samples_fit([batch["samples"][0]] * 10_001)
