"""Output length and context depth as dimensions: expansion, names, bounds, the plan, the filler prefix, the speedup
curves and the crossover sentence on numbers whose answer is known."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

from harness import LABEL_PREFIX, ROOT, schema
from harness.analysis import dimensions as ad
from harness.hosts.engine import Endpoint
from harness.intake import dimensions as dm
from harness.intake import manifest as mf
from harness.report import dimensions as dimensions_report
from harness.report import results
from harness.run import client, filler, runner
from harness.run import plan as pl
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.fake_engine import fake
from tests.fakeserver import FakeLlamaServer

DEMO_M = mf.load(DEMO)
TASK = DEMO_M.task("code-gen")


def _with(tmp_path, change, name="m.yaml"):
    raw = yaml.safe_load(DEMO.read_text())
    change(raw)
    return write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True, sort_keys=False), name)


def _task(raw, tid):
    return next(t for t in raw["tasks"] if t["id"] == tid)


def _bad(tmp_path, change) -> str:
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_with(tmp_path, change))
    msg = str(e.value)
    assert "\n" not in msg and "m.yaml: " in msg
    return msg


# -- expansion ----------------------------------------------------------------------------------------------


def test_lists_of_lengths_and_depths_expand_into_tasks_named_by_their_values():
    ps = dm.points("code-gen", [128, 512], [0, 4096])
    assert [p.id for p in ps] == ["code-gen[n_predict=128,depth=0]", "code-gen[n_predict=128,depth=4096]",
                                  "code-gen[n_predict=512,depth=0]", "code-gen[n_predict=512,depth=4096]"]
    assert [(p.n_predict, p.depth) for p in ps] == [(128, 0), (128, 4096), (512, 0), (512, 4096)]
    assert [p.id for p in dm.points("t", [64, 256])] == ["t[n_predict=64]", "t[n_predict=256]"]
    assert [p.id for p in dm.points("t", 64, [0, 1024])] == ["t[depth=0]", "t[depth=1024]"]
    assert dm.family("t[depth=1024]", (("depth", 1024),)) == "t"


def test_a_scalar_or_a_list_of_one_keeps_the_plain_task():
    assert dm.points("t", 128) == [dm.Point("t", 128, 0, ())]
    assert dm.points("t", [128], 2048) == [dm.Point("t", 128, 2048, ())]


@pytest.mark.parametrize(("n", "d", "field", "words"), [
    ([512, 128], None, "n_predict[1]", "increasing"),
    ([128, 128], None, "n_predict[1]", "increasing"),
    ([0], None, "n_predict[0]", "1 to 65536"),
    (128, [-1], "depth[0]", "0 to 131072"),
    (128, [True], "depth[0]", "whole number"),
    (list(range(1, 6)), list(range(0, 4)), "n_predict", "at most 16"),
])
def test_bad_dimensions_are_one_line_naming_the_field(n, d, field, words):
    with pytest.raises(dm.DimensionError) as e:
        dm.points("t", n, d)
    assert e.value.field == field and words in e.value.message


def test_a_manifest_with_dimensions_plans_one_task_per_value_and_leaves_scalar_tasks_as_they_were(tmp_path):
    plain = mf.load(DEMO)

    def change(raw):
        _task(raw, "code-gen")["n_predict"] = [64, 128]
        _task(raw, "code-gen")["depth"] = [0, 1024]
    m = mf.load(_with(tmp_path, change))
    ids = [t.id for t in m.tasks]
    assert ids[:2] == [t.id for t in plain.tasks][:2]
    fam = [t for t in m.tasks if t.family == "code-gen"]
    assert [t.id for t in fam] == ["code-gen[n_predict=64,depth=0]", "code-gen[n_predict=64,depth=1024]",
                                   "code-gen[n_predict=128,depth=0]", "code-gen[n_predict=128,depth=1024]"]
    pin = plain.task("code-gen").prompts[0].sha256
    assert {tuple((p.id, p.sha256) for p in t.prompts) for t in fam} == {(("code-gen", pin),)}
    assert len(m.tasks) == len(plain.tasks) + 3
    p = pl.make_plan(m, ["local"], tasks=["code-gen"], shuffle_seed=1)
    assert {c.task.id for c in p.cells} == {t.id for t in fam}  # the entry's id selects every length and depth
    # the demo's plan is untouched by the hooks
    assert [(t.id, t.n_predict, t.depth, t.dims) for t in plain.tasks] == [
        (t.id, t.n_predict, 0, ()) for t in plain.tasks]


def test_a_depth_must_fit_every_strategys_context_before_anything_starts(tmp_path):
    def deep(raw):
        _task(raw, "code-gen")["depth"] = [0, 4096]  # the demo: -c 12288, the baseline at 4 slots: 3072 each
    msg = _bad(tmp_path, deep)
    assert "tasks[2].depth: code-gen[depth=4096] on baseline[parallel=4]" in msg and "3072 tokens" in msg

    def no_ctx(raw):
        raw["server_args"] = [a for a in raw["server_args"] if a not in ("-c", "12288")]
        _task(raw, "code-gen")["depth"] = 512
    assert "give -c" in _bad(tmp_path, no_ctx)

    def fits(raw):
        _task(raw, "code-gen")["depth"] = [0, 2048]
    assert any(t.depth == 2048 for t in mf.load(_with(tmp_path, fits)).tasks)


def test_a_list_entry_in_the_schema_is_bounded(tmp_path):
    def long(raw):
        _task(raw, "code-gen")["n_predict"] = list(range(1, 18))
    assert "tasks[2].n_predict" in _bad(tmp_path, long)


# -- the filler -----------------------------------------------------------------------------------------------


def test_the_filler_is_the_same_text_everywhere_and_repeats_no_word_triple():
    a, b = filler.words(4096), filler.words(4096)
    assert a == b and filler.words(100) != filler.words(101)
    w = [x.strip(".").lower() for x in a.split()]
    assert len(w) == 4096 and all(x in filler.WORDS for x in w)
    assert all(w[i] != w[i + 1] for i in range(len(w) - 1))
    triples = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
    assert len(set(triples)) == len(triples)
    assert filler.sha256(filler.words(64)) == filler.sha256(filler.words(64))


def test_a_task_with_a_depth_reads_exactly_that_many_filler_tokens_first_and_records_them():
    task = dataclasses.replace(TASK, depth=300)
    with FakeLlamaServer(timings={"prompt_n": 305, "predicted_n": 5, "predicted_per_second": 400.0}) as srv:
        out = client.run_request(DEMO_M, task, Endpoint(srv.port), "the question", with_probs=False)
        tok = next(b for p, b in srv.requests if p == "/tokenize")
        sent = next(b for p, b in srv.requests if p == "/completion")["prompt"]
    assert tok["add_special"] is False
    text, question = sent.rsplit("\n\n", 1)
    assert question == "the question" and len(text.split()) == 300  # one fake token per word
    assert out["context"] == {"depth": 300, "filler_tokens": 300, "filler_sha256": filler.sha256(text),
                              "filler_chars": len(text), "source": filler.SOURCE}
    assert out["server"]["prompt_n"] == 305  # the prompt's real count, as the server counted it
    recorded = json.loads((ROOT / "results" / "demo-cpu" / "measurements.jsonl").open().readline())
    schema.check("result", {**recorded, "context": out["context"]}, "m.jsonl")


def test_a_task_without_depth_sends_the_prompt_alone():
    with FakeLlamaServer() as srv:
        out = client.run_request(DEMO_M, TASK, Endpoint(srv.port), "hi", with_probs=False)
        assert [p for p, _ in srv.requests] == ["/completion"]
    assert "context" not in out



# -- the curves and the crossover ---------------------------------------------------------------------------


def _pts(*triples):
    return [ad.Point(v, None if s is None else math.log(s), m) for v, s, m in triples]


@pytest.mark.parametrize(("points", "kind", "bracket", "rising"), [
    (_pts((64, 0.8, -1), (256, 1.0, 0), (1024, 1.3, 1)), "one", (64, 1024), True),
    (_pts((64, 0.8, -1), (256, 0.9, -1), (1024, 1.3, 1)), "one", (256, 1024), True),
    (_pts((0, 1.5, 1), (4096, 0.7, -1)), "one", (0, 4096), False),
    (_pts((64, 0.8, 0), (256, 1.0, 0), (1024, 1.3, 1)), "none", None, None),  # an estimate below 1 is no mark
    (_pts((64, 1.2, 1), (256, 1.3, 1)), "none", None, None),
    (_pts((64, 1.2, 1), (256, 0.8, -1), (1024, 1.3, 1)), "several", None, None),
])
def test_a_crossover_is_named_only_between_points_marked_on_both_sides(points, kind, bracket, rising):
    c = ad.crossover(points)
    assert c.kind == kind
    if bracket:
        assert (c.low, c.high) == bracket and c.rising is rising
        assert c.low <= c.estimate <= c.high


def test_the_crossover_estimate_interpolates_in_log_length():
    c = ad.crossover(_pts((100, 0.5, -1), (10000, 2.0, 1)))
    assert c.estimate == pytest.approx(1000)  # log speedup -log2 .. +log2: the midpoint in log length


def _curve(points, kind="none", low=None, high=None, est=None, rising=None, dim="n_predict"):
    return {"host": "local", "strategy": "s", "task": "t", "dimension": dim, "fixed": {},
            "points": [{"value": v, "task": f"t[{dim}={v}]", "speedup": s, "low": s * 0.9, "high": s * 1.1, "mark": m,
                        "verdict": {1: "faster", -1: "slower", 0: "not significant"}[m], "rounds": 3}
                       for v, s, m in points],
            "crossover": {"kind": kind, "low": low, "high": high, "estimate": est, "rising": rising}}


def test_the_sentence_says_only_what_the_marks_show():
    assert dimensions_report.sentence(_curve([(64, 0.8, -1), (1024, 1.3, 1)], "one", 64, 1024, 300.4, True)) == (
        "crosses 1 between 64 and 1,024 output tokens (estimate ≈ 300): slower below, faster above (the bracket "
        "between the marked points is its uncertainty)")
    assert dimensions_report.sentence(_curve([(0, 1.2, 1), (4096, 1.3, 1)], dim="depth")) == (
        "no crossover within the range measured (0–4,096 tokens of context): faster at every value measured")
    assert dimensions_report.sentence(_curve([(64, 0.9, 0), (256, 1.3, 1)])) == (
        "no crossover within the range measured (64–256 output tokens)")


def test_a_length_and_depth_run_on_the_fake_engine_reports_its_curves_crossover_and_filler(world, models_dir):
    def change(raw):
        _task(raw, "code-gen")["n_predict"] = [32, 128]
        _task(raw, "code-gen")["depth"] = [0, 256]
    path = _with(world / "m", change)
    gain = {32: 0.4, 128: 2.5}  # the strategy loses at 32 tokens, gains at 128 (beyond timing noise)

    def speed(labels):
        task = labels.get(f"{LABEL_PREFIX}.task", "")
        n = int(task.split("n_predict=")[1].split(",")[0])
        return 1000.0 * (gain[n] if labels.get(f"{LABEL_PREFIX}.strategy") == "ngram-mod" else 1.0)

    runner.run(trusted(path), results_dir=world / "r", models_dir=models_dir, run_id="dims", progress=False,
               log=[].append, engines=[fake(speed=speed)], strategies=["baseline", "ngram-mod"], tasks=["code-gen"],
               runs=3, seed=1)
    run = RunDir.open(world / "r" / "dims")
    meta = run.read_meta()
    assert [t.dims for t in meta.planned_tasks()][:2] == [(("n_predict", 32), ("depth", 0)),
                                                          (("n_predict", 32), ("depth", 256))]
    deep = [r for r in run.measurements() if r["task"].endswith("depth=256]")]
    assert deep and all(r["context"]["filler_tokens"] == 256 and r["context"]["filler_sha256"] ==
                        deep[0]["context"]["filler_sha256"] for r in deep)
    assert not any("context" in r for r in run.measurements() if r["task"].endswith("depth=0]"))
    out = world / "RESULTS.md"
    results.write([run.path], out)
    summary = json.loads((run.path / "summary.json").read_text())
    by = {(c["dimension"], tuple(c["fixed"].items())): c for c in summary["dimensions"]
          if c["strategy"] == "ngram-mod"}
    length = by[("n_predict", (("depth", 0),))]
    assert [p["value"] for p in length["points"]] == [32, 128]
    assert length["crossover"]["kind"] == "one" and length["crossover"]["rising"] is True, length["points"]
    assert (length["crossover"]["low"], length["crossover"]["high"]) == (32, 128)
    assert by[("depth", (("n_predict", 32),))]["crossover"]["kind"] == "none"
    text = out.read_text()
    assert "### Speedup against output length and context depth" in text
    assert "- ngram-mod: crosses 1 between 32 and 128 output tokens" in text
    assert "slower at every value measured" in text  # 32 tokens at both depths
    assert (run.path / "dimensions.png").is_file()


def test_the_lengths_manifest_measures_three_lengths_and_three_depths():
    m = mf.load(ROOT / "manifests" / "lengths-gemma3-270m.yaml")
    assert [(t.family, t.n_predict, t.depth) for t in m.tasks] == [
        ("code-edit-length", 64, 0), ("code-edit-length", 256, 0), ("code-edit-length", 1024, 0),
        ("code-edit-depth", 64, 0), ("code-edit-depth", 64, 1024), ("code-edit-depth", 64, 4096)]
    assert len(pl.make_plan(m, ["local"], shuffle_seed=1).items) == 54


def test_the_context_size_is_read_as_llama_server_reads_it():
    assert dm.context_size(["-c", "4096", "--ctx-size=8192"]) == 8192
    assert dm.context_size(["-t", "2"]) is None
    assert dm.check_context(1024, 64, 4096, 1) is None
    assert "2048 tokens of -c 4096 over 2 slots" in dm.check_context(2000, 64, 4096, 2)
