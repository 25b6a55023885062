"""Every speculative type for real: a real llama-server container per type on the generated files, one request,
drafts made and accepted in part, output compared with `--spec-type none` on the same target; and the
pre-flight rules against what the real server does with the same bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import MANIFESTS
from harness.models import drafters as dr
from harness.models import gguf_facts as gf
from harness.models import preflight as pf
from tests.conftest import trusted
from tests.llama_server import Outcome, run_once

pytestmark = [pytest.mark.docker, pytest.mark.image]

PROMPT = (MANIFESTS / "tasks" / "json-out.md").read_text()
N_PREDICT = 128
ALL = {f: True for f in pf.FLAVOURS}
#: spec type -> (target file, draft file or None); every draft is built for its target.
TYPES = {
    "draft-dflash": ("tiny-target.gguf", "tiny-dflash2.gguf"),
    "draft-dspark": ("tiny-target.gguf", "tiny-dspark.gguf"),
    "draft-eagle3": ("tiny-target.gguf", "tiny-eagle3.gguf"),
    "draft-mtp": ("tiny-mtp-target.gguf", None),
    "ngram-map-k": ("tiny-target.gguf", None),
    "ngram-map-k4v": ("tiny-target.gguf", None),
    "ngram-cache": ("tiny-target.gguf", None),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("spec-models")
    for name, kind, alpha in (("tiny-target", "tiny-target", 0.1), ("tiny-dflash2", "tiny-dflash2", 0.1),
                              ("tiny-dspark", "tiny-dspark", 0.1), ("tiny-eagle3", "tiny-eagle3", 0.1),
                              ("tiny-mtp-target", "tiny-mtp-target", 0.3)):
        dr.write_generated(d / f"{name}.gguf", kind, 7, alpha)
    return d


@pytest.fixture(scope="module")
def image(demo_image) -> str:
    return demo_image.tag


@pytest.fixture(scope="module")
def baselines(docker_client, image, models) -> dict[str, Outcome]:
    out = {}
    for target in sorted({t for t, _ in TYPES.values()}):
        out[target] = run_once(docker_client, image, models, ["-m", f"/models/{target}", "--spec-type", "none"],
                               PROMPT, N_PREDICT)
        assert out[target].content is not None, out[target].parsed.failure
        assert out[target].draft_n == 0
    return out


@pytest.mark.parametrize("spec", list(TYPES))
def test_type_drafts_and_matches_the_baseline(docker_client, image, models, baselines, spec):
    target, draft = TYPES[spec]
    args = ["-m", f"/models/{target}", *(["-md", f"/models/{draft}"] if draft else []), "--spec-type", spec]
    # the file passes the pre-flight for its type
    assert pf.check(spec, gf.read_facts(models / target), gf.read_facts(models / draft) if draft else None,
                    ALL) == []
    o = run_once(docker_client, image, models, args, PROMPT, N_PREDICT)
    assert o.content is not None, f"{spec}: {o.parsed.failure} (exit {o.exit_code})"
    assert o.draft_n > 0
    assert o.content == baselines[target].content  # temperature 0: speculation must not change the text here
    if draft or spec == "draft-mtp":
        assert 0 < o.accepted < o.draft_n  # the drafter agrees with its target in part
    # the server's own account matches the response's timings
    assert o.parsed.draft_acceptance["accepted"] == o.accepted
    assert o.parsed.draft_acceptance["generated"] == o.draft_n


def test_types_differ_in_how_far_they_agree(docker_client, image, models):
    """DFlash2's drafter knows only the first mask's token; EAGLE3 runs the target's first block autoregressively."""
    per_pos = {}
    for spec in ("draft-dflash", "draft-eagle3"):
        target, draft = TYPES[spec]
        o = run_once(docker_client, image, models, ["-m", f"/models/{target}", "-md", f"/models/{draft}",
                                                    "--spec-type", spec, "-lv", "4"], PROMPT, 64)
        per_pos[spec] = o.parsed.acc_per_pos
        assert o.parsed.statistics[spec]["acc_tokens"] == o.accepted
    assert per_pos["draft-dflash"][0] > 0.8 and per_pos["draft-dflash"][1:] == [0.0, 0.0]
    assert min(per_pos["draft-eagle3"]) > 0.5


def test_passes_every_rule_and_still_aborts_at_start(docker_client, image, models, monkeypatch, tmp_path):
    """A DFlash2 file with a 16-tap convolution: valid metadata and tensors, but its block graph outgrows the
    node budget llama.cpp reserves for DFlash2 (12 per tensor) and the draft context aborts at creation."""
    monkeypatch.setattr(dr, "DFLASH2_CONV_KERNEL", 16)
    path = dr.write_gguf(models / "dflash2-k16.gguf", dr.drafter_parts("tiny-dflash2"))
    facts = gf.read_facts(path)
    assert facts.arch_key("conv_kernel_size") == 16
    assert pf.check("draft-dflash", gf.read_facts(models / "tiny-target.gguf"), facts, ALL) == []
    o = run_once(docker_client, image, models, ["-m", "/models/tiny-target.gguf", "-md", "/models/dflash2-k16.gguf",
                                                "--spec-type", "draft-dflash"], PROMPT, 16)
    assert o.content is None and o.exit_code not in (None, 0)
    assert o.parsed.failure == "ggml.c:1814: GGML_ASSERT(obj_new) failed"
    assert o.parsed.failure_detail.startswith("ggml_new_object: not enough space in the context's memory pool")


def _extra_tensor(p):
    p.tensors["blk.0.extra_gate.weight"] = np.zeros(256, np.float32)


def _layer7(p):
    p.keys["target_layers"] = [7]


def _no_mask(p):
    p.mask_token = False


@pytest.mark.parametrize("edit, rule_says, server_says", [
    (_extra_tensor, "'wrong number of tensors; expected 37, got 36'",
     "error loading model: done_getting_tensors: wrong number of tensors; expected 37, got 36"),
    (_layer7, "dflash.target_layers [7]", "GGML_ASSERT(lid <= model.hparams.n_layer()) failed"),
    (_no_mask, "no tokenizer.ggml.mask_token_id", "get_sub_batch: failed to add embedding"),
])
def test_rule_catches_what_the_server_aborts_on(docker_client, image, models, edit, rule_says, server_says):
    parts = dr.drafter_parts("tiny-dflash2")
    edit(parts)
    name = f"bad-{edit.__name__.strip('_')}.gguf"
    dr.write_gguf(models / name, parts)
    problems = pf.check("draft-dflash", gf.read_facts(models / "tiny-target.gguf"), gf.read_facts(models / name),
                        ALL)
    assert len(problems) == 1 and rule_says in problems[0]
    o = run_once(docker_client, image, models, ["-m", "/models/tiny-target.gguf", "-md", f"/models/{name}",
                                                "--spec-type", "draft-dflash"], PROMPT, 16)
    assert o.content is None
    assert server_says in o.parsed.failure


def test_rule_catches_what_the_server_runs_silently_as_something_else(docker_client, image, models):
    """A DSpark file under draft-dflash loads and drafts (the row would say DFlash); the pre-flight says so."""
    t, d = gf.read_facts(models / "tiny-target.gguf"), gf.read_facts(models / "tiny-dspark.gguf")
    assert pf.check("draft-dflash", t, d, ALL) != []
    o = run_once(docker_client, image, models, ["-m", "/models/tiny-target.gguf", "-md", "/models/tiny-dspark.gguf",
                                                "--spec-type", "draft-dflash"], PROMPT, 32)
    assert o.content is not None and o.parsed.failure is None and o.draft_n > 0
    assert o.parsed.implementations == ["draft-dflash"]


# ---------------------------------------------------------------- the same, through the kit


def test_every_type_through_the_kit(tmp_path, demo_image, models_dir):
    """The demo's strategies (every spec type of the pinned build) on one task, one fresh container each:
    every speculative strategy drafts, its record is schema-valid, and it is compared with the baseline of its
    own target (the MTP row with the MTP target's baseline)."""
    import yaml

    from harness import schema
    from harness.analysis.summary import summarize
    from harness.run import runner
    from harness.store.rundir import RunDir
    from tests.conftest import DEMO, single_stream, write_manifest

    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream(raw["strategies"])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] == "code-gen"]
    raw["runs"] = 1
    path = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "types.yaml")
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="types", seed=3,
                     progress=False, log=lambda s: None)
    assert "12 ok, 0 failed" in out
    recs = {r["strategy"]: r for r in RunDir.open(tmp_path / "r" / "types").measurements()}
    types = {s["id"]: s["spec_type"] for s in raw["strategies"]}
    assert set(types.values()) == {"none", "draft-simple", "draft-dflash", "draft-dspark", "draft-eagle3",
                                   "draft-mtp", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                                   "ngram-cache"}
    for sid, r in recs.items():
        assert schema.errors("result", r) == []
        if types[sid] != "none":
            assert r["server"]["draft_n"] > 0, (sid, r["server"])
            assert r["server_log"]["draft_acceptance"]["generated"] == r["server"]["draft_n"], (sid, r)
            # each draft call's line (LLAMA_TRACE): they add up to the server's own counts of this request
            calls = r["server_log"]["draft_calls"]
            assert sum(i * n for i, n in enumerate(calls["accepted"])) == r["server"]["draft_n_accepted"], (sid, r)
            assert sum(i * n for i, n in enumerate(calls["drafted"])) == r["server"]["draft_n"], (sid, r)
            assert calls["calls"] == sum(calls["accepted"]) == sum(calls["drafted"]) > 0
        else:
            assert "draft_calls" not in r["server_log"]
    assert recs["mtp"]["server_command"][2].endswith("tiny-mtp-target.gguf")
    s = summarize(RunDir.open(tmp_path / "r" / "types"))
    cells = {c["strategy"]: c for c in s["cells"]}
    assert cells["mtp"]["checks"]["determinism"]["data"]["baseline"] == "baseline-mtp"
    assert cells["dflash2"]["checks"]["determinism"]["data"]["baseline"] == "baseline"
    assert cells["mtp"]["baseline"] == "baseline-mtp" and cells["eagle3"]["baseline"] == "baseline"
    assert not any(c["checks"]["speculation"]["flagged"] for c in s["cells"] if "speculation" in c["checks"])
    # acceptance by draft position for every speculative type, from the server's own counters (GET /metrics)
    pos = {p["strategy"]: p for p in s["positions"]["strategies"]}
    assert {k for k, v in types.items() if v != "none"} == set(pos) and s["positions"]["requests_without"] == 0
    assert all(p["sources"] == ["server's counters"] and p["calls"] == recs[k]["spec_counters"]["drafts"] > 0
               and 0 <= p["shares"][0] <= 1 for k, p in pos.items()), pos
    # the physics of each row follows its own target's bytes
    assert cells["mtp"]["checks"]["physics"]["data"]["weight_bytes"] != \
        cells["eagle3"]["checks"]["physics"]["data"]["weight_bytes"]


def test_preflight_refuses_before_any_container(tmp_path, demo_image, models_dir, docker_client):
    import yaml

    from harness import KitError
    from harness.run import runner
    from tests.conftest import DEMO, write_manifest

    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "mislabelled", "spec_type": "draft-dflash", "draft": "dspark"}]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = raw["tasks"][:1]
    path = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "bad.yaml")
    before = {c.id for c in docker_client.containers.list(all=True)}
    with pytest.raises(KitError, match=r"strategies mislabelled: models\.dspark .*a dspark file under spec type "
                                       r"draft-dflash"):
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="bad", progress=False,
                   log=lambda s: None)
    assert {c.id for c in docker_client.containers.list(all=True)} == before
    assert not (tmp_path / "r" / "bad").exists()


def test_abort_at_start_is_a_recorded_failure_with_the_abort_line(tmp_path, demo_image, models_dir, monkeypatch):
    import shutil

    import yaml

    from harness.run import runner
    from harness.store.rundir import RunDir
    from tests.conftest import DEMO, write_manifest

    monkeypatch.setattr(dr, "DFLASH2_CONV_KERNEL", 16)
    (tmp_path / "m").mkdir()
    dr.write_gguf(tmp_path / "m" / "k16.gguf", dr.drafter_parts("tiny-dflash2"))
    shutil.copy(models_dir / "tiny-target.gguf", tmp_path / "m" / "tiny-target.gguf")
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"] = {"target": {"file": "m/tiny-target.gguf"}, "k16": {"file": "m/k16.gguf"}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "k16", "spec_type": "draft-dflash", "draft": "k16"}]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = raw["tasks"][:1]
    raw["runs"] = 1
    path = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "k16.yaml")
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="k16", progress=False,
                     log=lambda s: None)
    assert "1 ok, 1 failed" in out
    rec = next(r for r in RunDir.open(tmp_path / "r" / "k16").measurements() if r["strategy"] == "k16")
    assert rec["failure"]["phase"] == "load"
    assert "GGML_ASSERT(obj_new) failed" in rec["failure"]["reason"], rec["failure"]
