"""The executor through the fake engine (tests/fake_engine.py): a whole `invoke run` without Docker, Ctrl-C and
SIGTERM at any point, a lost engine, resume, several hosts in parallel, the naive protocol, leftovers and the
quiet-machine warnings. The measurements themselves are tested with a real engine in tests/test_run.py."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest

from harness import KitError
from harness.analysis.summary import summarize
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.fake_engine import CELLS, STRATEGIES, TASKS, FakeEngine, demo_image, fake, planned_ids, records, run_demo

# ---------------------------------------------------------------- a whole run


def test_a_run_plays_recorded_measurements_one_fresh_container_each(world, models_dir):
    eng = fake()
    out = run_demo(world, models_dir, [eng])
    assert f"{2 * CELLS} ok, 0 failed" in out
    recs = records(world)
    assert {r["measurement_id"] for r in recs} == planned_ids(world)
    assert len({r["container_id"] for r in recs}) == len(recs) == len(eng.started)  # one fresh container each
    assert eng.containers == [] and eng.most_running == 1  # none left, never two at once
    assert sorted(r["order"] for r in recs) == list(range(len(recs)))
    for r in recs:  # what the recorded server said comes back through the kit's client
        c = next(c for c in eng.started if c.id == r["container_id"])
        out = r["output"]
        assert (out["text"], out["tokens"]) == (c.record["output"]["text"], c.record["output"]["tokens"])
        assert r["server"]["draft_n"] == c.record["server"]["draft_n"] and r["interference"]["disturbed"] is False
    assert RunDir.open(world / "r" / "fake").read_meta().status == "complete"
    cells = summarize(RunDir.open(world / "r" / "fake"))["cells"]
    assert {(c["strategy"], c["task"]) for c in cells} == {(s, t) for s in STRATEGIES for t in TASKS}


def test_rounds_run_every_cell_once_in_a_shuffled_order_the_seed_repeats(world, models_dir):
    run_demo(world, models_dir, [fake()], runs=3, seed=5)
    run_demo(world, models_dir, [fake()], runs=3, seed=5, run_id="again")
    run_demo(world, models_dir, [fake()], runs=3, seed=6, run_id="other")

    def order(run_id: str) -> list[list[str]]:
        recs = sorted(records(world, run_id), key=lambda r: r["order"])
        return [[f"{r['strategy']}/{r['task']}" for r in recs if r["round"] == k] for k in (1, 2, 3)]

    rounds = order("fake")
    assert all(sorted(x) == sorted(rounds[0]) and len(x) == CELLS for x in rounds)  # each round every cell once
    assert rounds == order("again") and rounds != order("other") and len({tuple(x) for x in rounds}) > 1


def test_the_baseline_asks_for_token_probabilities_and_the_others_do_not(world, models_dir):
    run_demo(world, models_dir, [fake()], runs=1)
    for r in records(world):
        assert ("probs" in r) == (r["strategy"] == "baseline"), r["strategy"]
        if "probs" in r:
            assert len(r["probs"]["positions"]) == r["output"]["n_tokens"]


def test_a_server_that_exits_while_loading_is_a_recorded_failure_and_the_run_goes_on(world, models_dir):
    eng = fake(exits=lambda labels: labels["specbench.strategy"] == "draft-simple")
    out = run_demo(world, models_dir, [eng])
    assert f"{2 * CELLS - 4} ok, 4 failed" in out
    failed = [r for r in records(world) if r["status"] == "failed"]
    assert {r["strategy"] for r in failed} == {"draft-simple"}
    assert all(r["failure"]["phase"] == "load" and "exit code 1" in r["failure"]["reason"]
               and "error loading model" in r["failure"]["reason"] for r in failed)
    assert eng.containers == []


@pytest.mark.parametrize("mode, reason", [
    ("http-error", "server answered HTTP 500"),
    ("no-final", "the stream ended without a final chunk"),
    ("bad-json", "connection to the server failed: JSONDecodeError"),
])
def test_a_request_that_goes_wrong_is_a_recorded_failure_with_its_reason(world, models_dir, mode, reason):
    out = run_demo(world, models_dir, [fake(mode=mode)], runs=1, strategies=["ngram-mod"], tasks=["json-out"])
    assert "0 ok, 2 failed" in out  # ngram-mod and the baseline it needs
    for rec in records(world):
        assert rec["status"] == "failed" and reason in rec["failure"]["reason"], rec["failure"]


def test_a_server_killed_mid_request_says_it_died(world, models_dir):
    eng = fake()

    def kill_on_second(e: FakeEngine, labels: dict, n: int) -> None:
        if n == 1:
            e.mode = "no-final"  # the stream stops: the server died under the request

    eng.on_start = kill_on_second
    orig = eng._serve

    def serve(rec, labels, ctr):
        server = orig(rec, labels, ctr)
        if eng.mode == "no-final":
            server.on_first_token = lambda: eng.kill(ctr)
            eng.mode = "ok"
        return server

    eng._serve = serve  # type: ignore[method-assign]
    out = run_demo(world, models_dir, [eng], runs=1, strategies=["ngram-mod"], tasks=["json-out"])
    assert "1 ok, 1 failed" in out
    failed = next(r for r in records(world) if r["status"] == "failed")
    assert failed["failure"]["reason"].startswith("server container exited during the request")


# ---------------------------------------------------------------- stopping and resuming


def _stop_at(n: int, how: str):
    def on_start(e: FakeEngine, labels: dict, k: int) -> None:
        if k == n:
            if how == "ctrl-c":
                raise KeyboardInterrupt
            if how == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            if how == "engine-lost":
                raise ConnectionError("the engine went away")
    return on_start


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "engine-lost"])
@pytest.mark.parametrize("at", [0, 5, 2 * CELLS - 1])
def test_a_run_stopped_at_any_measurement_keeps_what_it_finished_and_resumes(world, models_dir, how, at):
    eng = fake(on_start=_stop_at(at, how))
    lines: list[str] = []
    with pytest.raises(KitError) as e:
        run_demo(world, models_dir, [eng], lines)
    said = str(e.value)
    assert "resume" in said and "--resume fake" in said and "\n" not in said
    assert ("lost the Docker engine" in said) == (how == "engine-lost")
    rd = RunDir.open(world / "r" / "fake")
    meta = rd.read_meta()
    assert meta.status == "interrupted" and meta.interruptions[-1].done == at == len(rd.measurements())
    assert eng.containers == []  # the running container was removed
    lines.clear()
    again = fake()
    out = run_demo(world, models_dir, [again], lines, resume="fake")
    assert f"{2 * CELLS - at} ok, 0 failed" + (f", {at} already recorded" if at else ";") in out
    if at:
        assert any(ln.startswith(f"resume: {at} of {2 * CELLS} measurements already recorded") for ln in lines)
    recs = records(world)
    assert [r["measurement_id"] for r in recs].count(recs[0]["measurement_id"]) == 1
    assert {r["measurement_id"] for r in recs} == planned_ids(world) and len(recs) == 2 * CELLS
    assert sorted(r["order"] for r in recs) == list(range(2 * CELLS))
    assert rd.read_meta().status == "complete" and len(again.started) == 2 * CELLS - at


def test_sigterm_mid_request_removes_the_running_container_and_records_nothing_of_it(world, models_dir):
    eng = fake()

    def on_start(e: FakeEngine, labels: dict, k: int) -> None:
        if k == 3:
            e.mode = "term"

    eng.on_start = on_start
    orig = eng._serve

    def serve(rec, labels, ctr):
        server = orig(rec, labels, ctr)
        if eng.mode == "term":
            eng.mode = "ok"
            server.on_first_token = lambda: os.kill(os.getpid(), signal.SIGTERM)
        return server

    eng._serve = serve  # type: ignore[method-assign]
    with pytest.raises(KitError, match="interrupted; finished measurements are saved"):
        run_demo(world, models_dir, [eng])
    assert len(records(world)) == 3 and eng.containers == [] and len(eng.started) == 4
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_resume_refuses_a_changed_manifest_and_removes_what_an_earlier_attempt_left(world, models_dir, tmp_path):
    eng = fake(on_start=_stop_at(2, "ctrl-c"))
    with pytest.raises(KitError):
        run_demo(world, models_dir, [eng])
    left = eng.leave({"specbench.run": "fake", "specbench.strategy": "baseline"})
    other = eng.leave({"specbench.run": "someone-else", "specbench.strategy": "baseline"})
    changed = write_manifest(tmp_path / "m", DEMO.read_text() + "\n# changed\n", "demo.yaml")
    with pytest.raises(KitError, match=r"changed since run fake started .*resume with the same manifest"):
        runner.run(trusted(changed), results_dir=world / "r", models_dir=models_dir, resume="fake", engines=[eng],
                   progress=False, log=lambda s: None)
    eng.on_start = None
    lines: list[str] = []
    run_demo(world, models_dir, [eng], lines, resume="fake")
    assert any(f"local: removing {left.short_id} left by an earlier attempt of run fake" in ln for ln in lines)
    assert left not in eng.containers and other in eng.containers  # another run's container is not ours


# ---------------------------------------------------------------- several hosts


def test_hosts_run_in_parallel_one_measurement_at_a_time_each(world, models_dir):
    engines = [fake("a"), fake("b"), fake("c")]
    out = run_demo(world, models_dir, engines)
    assert f"{3 * 2 * CELLS} ok, 0 failed" in out
    recs = records(world)
    assert Counter(r["host"] for r in recs) == {"a": 2 * CELLS, "b": 2 * CELLS, "c": 2 * CELLS}
    assert {r["measurement_id"] for r in recs} == planned_ids(world)
    assert all(e.most_running == 1 and len(e.started) == 2 * CELLS for e in engines)
    a, b = ([(c.started_at, c.removed_at) for c in e.started] for e in engines[:2])
    assert any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)  # the hosts measured at the same time
    meta = RunDir.open(world / "r" / "fake").read_meta()
    assert sorted(meta.environment) == ["a", "b", "c"] and meta.environment["b"].hostname == "fake-b"


@pytest.mark.parametrize("at", [0, 4])
def test_a_host_lost_mid_run_stops_the_others_after_their_measurement_and_resume_finishes(world, models_dir, at):
    a, b = fake("a"), fake("b", on_start=_stop_at(at, "engine-lost"))
    with pytest.raises(KitError, match=r"host b: lost mid-run \(ConnectionError: the engine went away\); finished "
                                       r"measurements are saved: resume with `invoke run --resume fake`"):
        run_demo(world, models_dir, [a, b])
    done = Counter(r["host"] for r in records(world))
    assert done["b"] == at and done["a"] < 2 * CELLS and a.containers == [] and b.containers == []
    assert RunDir.open(world / "r" / "fake").read_meta().status == "interrupted"
    out = run_demo(world, models_dir, [fake("a"), fake("b")], resume="fake")
    assert f"{sum(done.values())} already recorded" in out
    assert {r["measurement_id"] for r in records(world)} == planned_ids(world)


def test_the_hosts_must_hold_the_same_image(world, models_dir):
    other = FakeEngine("arm", images=[demo_image(trusted(DEMO).manifest, "sha256:" + "a" * 64, arch="arm64")])
    other.info = lambda: {**FakeEngine.info(other), "Architecture": "aarch64"}  # type: ignore[method-assign]
    with pytest.raises(KitError, match=r"the hosts need different images .* run each host in a run of its own"):
        run_demo(world, models_dir, [fake("x86"), other])


def test_no_build_names_the_host_without_the_image(world, models_dir):
    bare = FakeEngine("bare", images=[])
    with pytest.raises(KitError, match=r"no image of manifest demo-cpu's build .* on bare; run `invoke build "
                                       r"--manifest .* --host bare`, or drop --no-build"):
        run_demo(world, models_dir, [bare], build_missing=False)
    assert not (world / "r" / "fake").exists() and bare.started == []


# ---------------------------------------------------------------- the naive protocol and the quiet machine


def test_reuse_server_runs_one_server_per_strategy_labelled_naive(world, models_dir):
    eng = fake()
    out = run_demo(world, models_dir, [eng], reuse_server=True)
    assert f"{2 * CELLS} ok" in out and len(eng.started) == len(STRATEGIES) and eng.containers == []
    recs = records(world)
    assert {r["protocol"] for r in recs} == {"reuse-server"}
    by = {s: {r["container_id"] for r in recs if r["strategy"] == s} for s in STRATEGIES}
    assert all(len(ids) == 1 for ids in by.values()) and len(set().union(*by.values())) == len(STRATEGIES)
    assert RunDir.open(world / "r" / "fake").read_meta().protocol == "reuse-server"


def test_reuse_server_that_cannot_start_fails_its_whole_group(world, models_dir):
    out = run_demo(world, models_dir, [fake(exits=lambda labels: labels["specbench.strategy"] == "ngram-mod")],
              reuse_server=True)
    assert f"{2 * CELLS - 4} ok, 4 failed" in out
    assert {r["strategy"] for r in records(world) if r["status"] == "failed"} == {"ngram-mod"}


def test_other_runs_containers_are_named_once_per_host_and_recorded_with_each_measurement(world, models_dir):
    eng = fake()
    eng.leave({"specbench.run": "another-run", "specbench.strategy": "baseline"})
    lines: list[str] = []
    run_demo(world, models_dir, [eng], lines, runs=1)
    warned = [ln for ln in lines if ln.startswith("warning (local):")]
    assert warned == ["warning (local): 1 container(s) of other kit runs exist (`invoke clean` removes them)"]
    assert all(r["quiet"]["kit_containers"] == 1 and r["quiet"]["busy"] for r in records(world))


def test_a_busy_host_is_warned_about_from_its_own_load_and_cpu_count(world, models_dir):
    eng = fake()
    eng.read_host_file = lambda path: "3.50 2.00 1.00 3/100 1\n" if path == "/proc/loadavg" else \
        FakeEngine.read_host_file(eng, path)  # type: ignore[method-assign]
    lines: list[str] = []
    run_demo(world, models_dir, [eng], lines, runs=1)
    assert "warning (local): load average 3.50 on 2 CPUs: the machine is busy" in lines
    assert all(r["quiet"]["load_average_1m"] == 3.5 for r in records(world))


# ---------------------------------------------------------------- --until


def _steady(labels: dict) -> float:
    """Every strategy at its own constant rate: speedups that hold round after round (slow enough that the
    scheduling noise of a busy machine stays small beside a decode of tens of milliseconds)."""
    return {"baseline": 600.0, "ngram-mod": 900.0, "draft-simple": 450.0}[labels["specbench.strategy"]]


def _wild(labels: dict) -> float:
    """draft-simple on json-out swings by a factor of eight from round to round: its interval never closes."""
    if (labels["specbench.strategy"], labels["specbench.task"]) == ("draft-simple", "json-out"):
        return 2_400.0 if int(labels["specbench.run-index"]) % 2 else 300.0
    return _steady(labels)


def test_until_adds_rounds_until_every_cell_converges(world, models_dir):
    lines: list[str] = []
    out = run_demo(world, models_dir, [fake(speed=_steady)], lines, until=0.5, max_rounds=8)
    meta = RunDir.open(world / "r" / "fake").read_meta()
    rounds = {r["round"] for r in records(world)}
    assert rounds == set(range(1, 6))  # 2 planned, then rounds up to the fewest a cell may converge with (5)
    assert [x.round for x in meta.plan.extra_rounds] == [3, 4, 5] and meta.plan.until == 0.5
    assert "until ±50%: every cell converged after 5 rounds" in lines and f"{5 * CELLS} ok" in out


def test_until_stops_at_the_round_cap_and_names_the_cells_that_did_not_converge(world, models_dir):
    lines: list[str] = []
    run_demo(world, models_dir, [fake(speed=_wild)], lines, until=0.5, max_rounds=6)
    recs = records(world)
    assert max(r["round"] for r in recs) == 6
    later = {(r["strategy"], r["task"]) for r in recs if r["round"] == 6}
    assert later == {("draft-simple", "json-out"), ("baseline", "json-out")}  # the open cell and its baseline
    said = next(ln for ln in lines if ln.startswith("until ±50%: 1 cell(s) not converged after 6 rounds"))
    assert "draft-simple/json-out ±" in said and said.endswith("stopped at the cap of 6 rounds")


def test_an_interrupted_until_run_resumes_the_rounds_it_had_decided_on(world, models_dir):
    def stop_in_round_four(e: FakeEngine, labels: dict, n: int) -> None:
        if labels["specbench.run-index"] == "4":
            raise KeyboardInterrupt

    with pytest.raises(KitError, match="interrupted"):
        run_demo(world, models_dir, [fake(speed=_wild, on_start=stop_in_round_four)], until=0.5, max_rounds=5)
    meta = RunDir.open(world / "r" / "fake").read_meta()
    assert [x.round for x in meta.plan.extra_rounds] == [3, 4] and meta.status == "interrupted"
    lines: list[str] = []
    run_demo(world, models_dir, [fake(speed=_wild)], lines, resume="fake")
    recs = records(world)
    assert max(r["round"] for r in recs) == 5 and len({r["measurement_id"] for r in recs}) == len(recs)
    assert any(ln.endswith("stopped at the cap of 5 rounds") for ln in lines)
