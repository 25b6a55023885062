"""Output length and context depth as dimensions: expansion, names, bounds, the plan, the filler prefix, the speedup
curves and the crossover sentence on numbers whose answer is known."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from harness import ROOT, schema
from harness.hosts.engine import Endpoint
from harness.intake import dimensions as dm
from harness.intake import manifest as mf
from harness.run import client, filler
from harness.run import plan as pl
from tests.conftest import DEMO, write_manifest
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

