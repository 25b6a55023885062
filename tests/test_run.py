"""invoke run against the real engine: real containers, real llama-server, tiny real models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from harness import ROOT, schema
from harness.hosts.engine import LocalEngine
from harness.intake import manifest as mf
from harness.run import runner
from harness.run.plan import confirm_rounds, make_plan
from harness.store.rundir import RunDir
from tests.conftest import DEMO, first_takes, single_stream, trusted, write_manifest

pytestmark = pytest.mark.image


def _records(run_dir):
    return RunDir.open(run_dir).measurements()


def _demo_plan(demo_manifest):
    """The demo's plan at 2 runs and what its confirmation rounds add (the sweep's best two and their baseline at
    each of its levels)."""
    plan = make_plan(demo_manifest, ["local"], runs=2, shuffle_seed=0)
    baselines = {s.id: (b.id if (b := demo_manifest.baseline_for(s)) else None) for s in plan.strategies}
    return plan, plan.confirm_measurements(confirm_rounds(demo_manifest, 2), baselines)


def test_full_demo_run_is_complete_and_schema_valid(demo_run, demo_manifest):
    recs = _records(demo_run)
    plan, confirm = _demo_plan(demo_manifest)
    planned = len(plan.items) + confirm
    assert len(first_takes(recs)) == planned == 17 * 8 * 2 + 2 * 5 * 8
    assert len(recs) - planned <= RunDir.open(demo_run).read_meta().plan.retake_cap == 17 * 8 * 2 // 10
    for r in recs:
        assert schema.errors("result", r) == []
        assert r["status"] == "ok", r.get("failure")
        assert r["client"]["decode_tok_s"] > 0 and r["server"]["predicted_per_second"] > 0
        assert r["server"]["predicted_n"] == demo_manifest.task(r["task"]).n_predict
        assert r["protocol"] == "fresh-container"
        assert r["server_command"][r["server_command"].index("--host") + 1] == "127.0.0.1"
    for s in {r["strategy"] for r in recs if r["spec_type"] != "none"}:
        drafted = sum(r["server"]["draft_n"] for r in recs if r["strategy"] == s)
        assert drafted > 0, f"{s} drafted nothing"
    assert sum(r["server"]["draft_n_accepted"] for r in recs if r["strategy"] == "draft-simple") > 0
    # the server's own counters (GET /metrics around the request) agree with its timings, request by request
    for r in recs:
        if r["spec_type"] != "none" and "concurrency" not in r:
            c = r["spec_counters"]
            assert (c["draft_tokens"], c["accepted"]) == (r["server"]["draft_n"], r["server"]["draft_n_accepted"]), c
            # an n-gram drafter that finds no match in a request drafts nothing: then every count is 0
            assert (c["drafts"] > 0) == (c["draft_tokens"] > 0) and sum(c["accepted_per_pos"]) == c["accepted"], c
            assert c["drafts"] <= c["draft_tokens"] and c["accepted"] <= c["draft_tokens"], c
    base = [r for r in recs if r["spec_type"] == "none" and "concurrency" not in r]
    assert {r["strategy"] for r in base} == {"baseline", "baseline-mtp"}
    assert all(len(r["probs"]["positions"]) == r["server"]["predicted_n"] for r in base)
    # the baseline at 2 and 4 clients: as many slots and streams, each client with the manifest's context
    for n in (2, 4):
        batch = [r for r in recs if r["strategy"] == f"baseline[parallel={n}]"]
        assert batch and all(r["concurrency"]["streams"] == n == r["slots"]["total"] for r in batch)
        assert all(r["slots"]["n_ctx"] == 12288 and "probs" not in r for r in batch)
    assert all("probs" not in r for r in recs if r["spec_type"] != "none")
    assert all(r["interference"]["window_s"] > 0 for r in recs)
    meta = RunDir.open(demo_run).read_meta()
    assert meta.status == "complete" and isinstance(meta.plan.shuffle_seed, int)  # drawn, recorded
    assert json.loads((demo_run / "build.json").read_text())["image_id"] == meta.build.image_id
    assert meta.manifest.sha256 == demo_manifest.sha256
    assert meta.environment["local"].docker_version
    # run.json carries the normalised manifest: strategies with their baseline, tasks with their prompts
    assert meta.strategy("draft-simple").baseline == "baseline" and meta.strategy("baseline").baseline is None
    assert [p.id for p in meta.task("code-gen").prompts] == ["code-gen"]


def test_every_measurement_in_its_own_container_and_none_left(demo_run, docker_client):
    recs = _records(demo_run)
    ids = [r["container_id"] for r in recs]
    assert len(set(ids)) == len(ids)
    left = docker_client.containers.list(all=True, filters={"label": f"specbench.run={demo_run.name}"})
    assert left == []


def test_rounds_are_shuffled_and_each_round_runs_every_cell(demo_run):
    recs = sorted(_records(demo_run), key=lambda r: r["order"])
    rounds = {}
    for r in first_takes(recs):
        rounds.setdefault(r["round"], []).append(f"{r['strategy']}/{r['task']}")
    # the planned rounds, then the confirmation rounds of the sweep's best two and their baseline at every level
    assert set(rounds) == {1, 2, 3, 4}
    assert sorted(rounds[1]) == sorted(rounds[2]) and len(rounds[1]) == 17 * 8
    assert rounds[1] != rounds[2]
    assert sorted(rounds[3]) == sorted(rounds[4]) and len(rounds[3]) == 5 * 8
    confirmed = {x.split("/")[0] for x in rounds[3]} - {"baseline", "baseline[parallel=2]", "baseline[parallel=4]"}
    assert len(confirmed) == 2 and all(c.startswith("ngram-simple[") for c in confirmed)
    # a round finishes before the next begins
    assert [r["round"] for r in recs] == sorted(r["round"] for r in recs)


def _trap_manifest(tmp_path, runs=3):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = [s for s in raw["strategies"] if s["id"] in ("ngram-mod", "ngram-cache")]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [{"id": "code-edit", "prompt_file": "tasks/code-edit.md", "n_predict": 256}]
    raw["runs"] = runs
    return write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "trap.yaml")


def test_cache_trap_reuse_server_climbs_fresh_containers_do_not(tmp_path, demo_image, models_dir):
    path = _trap_manifest(tmp_path)
    runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="naive", reuse_server=True,
                seed=1, progress=False, log=lambda s: None)
    runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="fresh", seed=1, progress=False,
                log=lambda s: None)
    naive_all = sorted(_records(tmp_path / "r" / "naive"), key=lambda r: r["order"])
    fresh_all = sorted(_records(tmp_path / "r" / "fresh"), key=lambda r: r["order"])
    # ngram-cache (llama.cpp #27852 says it carries state too): one server for all its runs, flagged naive with
    # its counts as evidence; in fresh containers its counts are the first request's every time
    cache_naive = [r for r in naive_all if r["strategy"] == "ngram-cache"]
    cache_fresh = [r for r in fresh_all if r["strategy"] == "ngram-cache"]
    assert len({r["container_id"] for r in cache_naive}) == 1 and len({r["container_id"] for r in cache_fresh}) == 3
    assert {(r["server"]["draft_n"], r["server"]["draft_n_accepted"]) for r in cache_fresh} == \
        {(cache_naive[0]["server"]["draft_n"], cache_naive[0]["server"]["draft_n_accepted"])}
    naive = [r for r in naive_all if r["strategy"] == "ngram-mod"]
    fresh = [r for r in fresh_all if r["strategy"] == "ngram-mod"]
    assert len({r["container_id"] for r in naive}) == 1 and len({r["container_id"] for r in fresh}) == 3
    nd = [r["server"]["draft_n"] for r in naive]
    fd = [r["server"]["draft_n"] for r in fresh]
    na = [r["server"]["draft_n_accepted"] for r in naive]
    # the server's n-gram table carries over: the second identical request drafts and accepts far more
    assert nd[1] > 1.4 * nd[0] and na[1] > 1.3 * na[0], (nd, na)
    # fresh containers: every run starts cold, the draft counts are the same each time
    assert len(set(fd)) == 1 and fd[0] == nd[0], (fd, nd)
    # each request's draft calls are its own, in one server as in fresh containers: they add up to its counts
    for r in naive + fresh:
        calls = r["server_log"]["draft_calls"]
        assert (sum(i * n for i, n in enumerate(calls["accepted"])), calls["tasks"]) == \
            (r["server"]["draft_n_accepted"], 1), r["server_log"]
    assert all(r["protocol"] == "reuse-server" for r in naive)
    from harness.analysis.summary import summarize

    naive_cell = next(c for c in summarize(RunDir.open(tmp_path / "r" / "naive"))["cells"]
                      if c["strategy"] == "ngram-mod")
    fresh_cell = next(c for c in summarize(RunDir.open(tmp_path / "r" / "fresh"))["cells"]
                      if c["strategy"] == "ngram-mod")
    naive_check = naive_cell["checks"]["contamination"]
    assert naive_check["flagged"] and naive_check["data"]["kind"] == "naive"
    # the evidence the kit holds is in the sentence: every run's drafted/accepted, and where the output changed
    assert f"drafted/accepted {nd[0]}/{na[0]}, {nd[1]}/{na[1]}" in naive_check["sentence"], naive_check
    # fresh containers may drift with the machine, but identical draft counts and outputs are never a cache
    fresh_check = fresh_cell["checks"]["contamination"]
    assert fresh_check["data"]["kind"] in ("none", "drift", "unstable"), fresh_check
    assert fresh_check["data"]["fingerprint"]["identical"], fresh_check
    # request by request: the naive server's second ngram-mod request drafted beyond what any fresh one did
    from harness.report import explanation as why_report

    naive_summary, fresh_summary = (summarize(RunDir.open(tmp_path / "r" / x)) for x in ("naive", "fresh"))
    rows = [r for r in naive_summary["requests"]["servers"] if r["strategy"] == "ngram-mod"]
    assert [r["drafted"] for r in rows] == nd
    table, sentence = why_report.requests_table(naive_summary, why_report.fresh_peer(naive_summary, [fresh_summary]))
    assert "≠" in table and not sentence.startswith("0 of")
    cache_cell = next(c for c in summarize(RunDir.open(tmp_path / "r" / "naive"))["cells"]
                      if c["strategy"] == "ngram-cache")
    assert cache_cell["checks"]["contamination"]["data"]["kind"] == "naive"
    assert "drafted/accepted" in cache_cell["checks"]["contamination"]["sentence"]


def test_server_that_cannot_start_is_a_recorded_failure(tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    (tmp_path / "broken").mkdir()
    whole = (models_dir / "tiny-draft.gguf").read_bytes()  # a sound header whose tensor data is cut off:
    (tmp_path / "broken" / "broken.gguf").write_bytes(whole[: len(whole) // 2])  # the kit reads it, the server not
    raw["models"]["broken"] = {"file": "broken/broken.gguf"}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "broken", "spec_type": "draft-simple", "draft": "broken"}]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = raw["tasks"][:1]
    raw["runs"] = 1
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "broken.yaml")
    t0 = time.monotonic()
    out = runner.run(trusted(p), results_dir=tmp_path / "r", models_dir=models_dir, run_id="broken", progress=False,
                      log=lambda s: None)
    assert time.monotonic() - t0 < 60
    recs = {r["strategy"]: r for r in _records(tmp_path / "r" / "broken")}
    assert recs["baseline"]["status"] == "ok"
    f = recs["broken"]
    assert f["status"] == "failed" and f["failure"]["phase"] == "load", f
    assert "server exited during load" in f["failure"]["reason"] and f["failure"]["log_tail"]
    assert "1 ok, 1 failed" in out
    assert LocalEngine().kit_containers("broken") == []


def test_sigint_mid_run_then_resume(tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = raw["tasks"][:3]
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "draft-simple",
                                                                                      "ngram-simple", "ngram-mod")])
    raw["runs"] = 2
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "int.yaml")
    env = dict(os.environ, SPECBENCH_MODELS=str(models_dir), PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "invoke", "-r", str(ROOT), "run", "--manifest", str(p), "--results",
            str(tmp_path / "r"), "--models-dir", str(models_dir), "--run-id", "int", "--no-progress"]
    # Ctrl-C as at a terminal, also where this suite was started in the background (which ignores SIGINT, and
    # a child would inherit that)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    mfile = tmp_path / "r" / "int" / "measurements.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if mfile.exists() and len(mfile.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, out
    assert "resume with `invoke run --resume int`" in out
    first = _records(tmp_path / "r" / "int")
    assert 5 <= len(first) < 24
    assert LocalEngine().kit_containers("int") == []
    assert RunDir.open(tmp_path / "r" / "int").read_meta().status == "interrupted"
    res = subprocess.run([*args[:-3], "--resume", "int", "--no-progress"], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(first_takes(first))} already recorded" in res.stdout
    final = _records(tmp_path / "r" / "int")
    ids = [r["measurement_id"] for r in final]
    assert len(first_takes(final)) == 4 * 3 * 2 and len(ids) == len(set(ids))
    assert [r["measurement_id"] for r in final[: len(first)]] == [r["measurement_id"] for r in first]
    assert sorted(r["order"] for r in final) == list(range(len(final)))
    assert LocalEngine().kit_containers("int") == []
    assert json.loads((tmp_path / "r" / "int" / "run.json").read_text())["status"] == "complete"


def test_run_without_image_or_with_unknown_names(tmp_path, models_dir):
    from harness import KitError

    with pytest.raises(KitError, match="--strategies: nope not in the manifest"):
        from harness.run.runner import make_plan

        make_plan(mf.load(DEMO), ["local"], strategies=["nope"])


def test_parallel_clients_report_aggregate_and_per_stream(tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "baseline-x3", "spec_type": "none", "parallel": 3},
                         {"id": "ngram-mod-x3", "spec_type": "ngram-mod", "parallel": 3}]
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] == "json-out"]
    raw["runs"] = 1
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "par.yaml")
    runner.run(trusted(p), results_dir=tmp_path / "r", models_dir=models_dir, run_id="par", progress=False,
                log=lambda s: None)
    recs = {r["strategy"]: r for r in _records(tmp_path / "r" / "par")}
    for sid in ("baseline-x3", "ngram-mod-x3"):
        r = recs[sid]
        assert r["status"] == "ok", r.get("failure")
        cmd = r["server_command"]
        assert cmd.count("--parallel") == 1 and cmd[cmd.index("--parallel") + 1] == "3"
        c = r["concurrency"]
        assert c["streams"] == 3 and len(c["per_stream_tok_s"]) == 3 and c["tokens"] == 3 * 128
        assert c["aggregate_tok_s"] > 0 and all(x > 0 for x in c["per_stream_tok_s"])
    assert "concurrency" not in recs["baseline"] and "probs" in recs["baseline"]
    from harness.report import results as rp

    rp.write([tmp_path / "r" / "par"], tmp_path / "R.md", plot=False)
    assert "### Concurrency" in (tmp_path / "R.md").read_text()


def test_invoke_clean_removes_labelled_leftovers(demo_image, docker_client):
    left = docker_client.containers.create(demo_image.tag, ["llama-server", "--version"],
                                           labels={"specbench.run": "leftover", "specbench.strategy": "baseline"})
    other = docker_client.containers.create(demo_image.tag, ["true"], labels={"unrelated": "1"})
    try:
        res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "clean", "--run-id", "leftover"],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and "1 container(s) removed" in res.stdout, res.stdout + res.stderr
        assert docker_client.containers.list(all=True, filters={"id": left.id}) == []
        assert docker_client.containers.list(all=True, filters={"id": other.id}) != []
    finally:
        other.remove(force=True)


def test_kit_containers_while_another_run_on_the_engine_removes_its_own(demo_image):
    """Two runs (or two hosts) on one engine: a container the other removes between the listing and its inspection
    is left out of the listing, never a 404 that ends this run."""
    import threading

    import docker

    engine = LocalEngine()
    run_id = f"race-{os.getpid()}"
    stop = threading.Event()
    churned = []

    def churn() -> None:  # the other run: create and remove its containers, by id, as fast as the engine lets it
        while not stop.is_set():
            c = engine.client.containers.create(demo_image.image_id, command=["true"],
                                                labels={"specbench.run": run_id})
            c.remove(force=True)
            churned.append(c.id)

    other = threading.Thread(target=churn)
    other.start()
    lost: list[str] = []
    listings = 0
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            listings += 1
            try:
                engine.kit_containers(run_id)
            except docker.errors.NotFound as e:
                lost.append(str(e))
    finally:
        stop.set()
        other.join(timeout=30)
    assert len(churned) > 20 and listings > 200, (len(churned), listings)
    assert lost == [], f"{len(lost)} of {listings} listings failed: {lost[0]}"
    assert engine.kit_containers(run_id) == []


def test_a_tiny_load_study_on_real_servers_reads_their_counters(tmp_path, demo_image, models_dir):
    """The load study end to end on the demo's real llama-server: one fresh container per strategy, level and round,
    open-loop sends, and the server's own /metrics counters after the warm-up and after the level."""
    from harness.report import results as rp
    from harness.store import load as store

    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"}, {"id": "ngram-mod", "spec_type": "ngram-mod"}]
    raw["load"] = {"rates": [4], "requests": 3, "warmup": 1, "rounds": 2, "slots": [2], "tasks": ["json-out"],
                   "slo": {"ttft_ms": 5000}}
    p = write_manifest(tmp_path, yaml.safe_dump(raw, allow_unicode=True), "load.yaml")
    out = runner.run(trusted(p), results_dir=tmp_path / "r", models_dir=models_dir, run_id="ld", progress=False,
                     log=lambda s: None, load=True)
    assert "load study: 4 levels measured, 0 failed" in out, out
    levels = store.read(tmp_path / "r" / "ld")
    assert sorted((x["strategy"], x["round"]) for x in levels) == [
        ("baseline", 1), ("baseline", 2), ("ngram-mod", 1), ("ngram-mod", 2)]  # one slot count: no @2
    assert len({x["container_id"] for x in levels}) == 4  # a fresh server each
    for x in levels:
        assert x["status"] == "ok" and "--metrics" in x["server_command"], x.get("failure")
        assert all(r["error"] is None and r["output_tokens"] > 0 for r in x["requests"]), x["requests"]
    drafted = [x["spec_counters"] for x in levels if x["speculative"]]
    assert all("drafts" in c for c in drafted), drafted  # the real server's counters, after minus before
    assert any(c["draft_tokens"] > 0 and 0 <= c["accepted"] <= c["draft_tokens"] for c in drafted), drafted
    assert LocalEngine().kit_containers("ld") == []
    rp.write([tmp_path / "r" / "ld"], tmp_path / "R.md", plot=False)
    text = (tmp_path / "R.md").read_text()
    assert "### Serving under load" in text and "(complete, the load study alone)" in text
    assert "| 2 | 4 | ngram-mod |" in text
