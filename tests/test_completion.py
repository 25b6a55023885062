"""A busy start and what completes the run: retakes go where they restore the most pairs (a disturbed baseline
first), a resume retakes what is still missing within the cap, the report ends with the one command that gives the
cells a verdict, and a quiet wait before each measurement keeps most from being disturbed at all. Through the fake
engine (tests/fake_engine.py), whose scripted host makes the kit's own interference measurement see other work."""

from __future__ import annotations

import shlex

import pytest

from harness import KitError, schema
from harness.analysis import gaps
from harness.analysis.records import CellIndex, Measurement
from harness.analysis.summary import summarize
from harness.report.results import completion_text, render_run
from harness.run import interference
from harness.store.rundir import RunDir
from tests.fake_engine import CELLS, TASKS, FakeEngine, disturb, fake, records, run_demo

BASELINES = {"baseline": None, "ngram-mod": "baseline", "draft-simple": "baseline"}


def _rec(strategy: str, task: str, round_: int, *, disturbed: bool = False, ok: bool = True, order: int = 0,
         retake_of: str | None = None) -> Measurement:
    mid = f"local/{strategy}/{task}/{round_}" + ("/retake" if retake_of else "")
    return Measurement.of({"measurement_id": mid, "host": "local", "strategy": strategy, "task": task,
                           "prompt": task, "round": round_, "run_index": round_, "order": order,
                           "status": "ok" if ok else "failed", "client": {"decode_tok_s": 100.0 if ok else None},
                           "interference": {"disturbed": disturbed}, **({"retake_of": retake_of} if retake_of else {})})


def _round(disturbed: set[tuple[str, str]], failed: set[tuple[str, str]] = frozenset(), round_: int = 1):
    return [_rec(s, t, round_, disturbed=(s, t) in disturbed, ok=(s, t) not in failed, order=i)
            for i, (s, t) in enumerate((s, t) for t in TASKS for s in BASELINES)]


def test_a_disturbed_baseline_is_retaken_before_the_strategies_it_pairs_with():
    # both baselines and one strategy of each task disturbed: a baseline restores a pair with the present strategy
    ms = _round({("baseline", "json-out"), ("baseline", "code-gen"), ("ngram-mod", "json-out"),
                 ("draft-simple", "code-gen")})
    st = gaps.state(ms)
    assert len(st.gaps) == 4 and {g.why for g in st.gaps} == {"disturbed"}
    for seed in range(20):  # whatever the shuffle, the cap of two goes to the baselines
        chosen = gaps.choose(st.gaps, st.present, BASELINES, 2, str(seed))
        assert {g.slot[1] for g in chosen} == {"baseline"}
    assert gaps.restored(chosen, st.present, BASELINES) == 2
    # with room for all four, every pair comes back: 2 strategies x 2 tasks
    every = gaps.choose(st.gaps, st.present, BASELINES, 10, "x")
    assert len(every) == 4 and gaps.restored(every, st.present, BASELINES) == 4


def test_a_round_disturbed_throughout_is_restored_task_by_task_and_nothing_is_spent_on_a_lost_pair():
    ms = _round({(s, t) for t in TASKS for s in BASELINES})
    st = gaps.state(ms)
    chosen = gaps.choose(st.gaps, st.present, BASELINES, 3, "s")
    # a baseline first (it holds two pairs), then the two strategies that pair with it: two pairs for three retakes
    assert chosen[0].slot[1] == "baseline" and {g.slot[2] for g in chosen} == {chosen[0].slot[2]}
    assert gaps.restored(chosen, st.present, BASELINES) == 2
    # the last retake is not spent on a baseline whose strategies no retake is left for
    assert len(gaps.choose(st.gaps, st.present, BASELINES, 4, "s")) == 3
    # a strategy that failed in every attempt is no gap; its partner's retake restores nothing with it
    ms = _round({("baseline", "json-out")}, failed={("ngram-mod", "json-out"), ("draft-simple", "json-out")})
    st = gaps.state(ms)
    assert [g.slot[1] for g in st.gaps] == ["baseline"]
    assert gaps.choose(st.gaps, st.present, BASELINES, 5, "s") == []


def test_a_failure_is_a_gap_where_its_cell_succeeded_and_a_retake_chain_ends_at_the_last_attempt():
    ms = _round(set()) + _round(set(), failed={("ngram-mod", "code-gen")}, round_=2)
    st = gaps.state(ms)
    assert [(g.id, g.why) for g in st.gaps] == [("local/ngram-mod/code-gen/2", "failed")]
    first = _rec("baseline", "json-out", 3, disturbed=True, order=20)
    again = Measurement.of({**first.raw, "measurement_id": first.id + "/retake", "retake_of": first.id,
                            "order": 21})
    st = gaps.state([*ms, first, again])
    assert first.id + "/retake" in {g.id for g in st.gaps} and first.id not in {g.id for g in st.gaps}


def test_a_failure_while_other_work_ran_is_the_hosts_and_is_retaken(world, models_dir):
    ms = _round(set(), failed={("ngram-mod", "json-out")})
    assert gaps.state(ms).gaps == ()  # failed on a quiet host, its cell never succeeded: the strategy's
    lost = _rec("ngram-mod", "json-out", 1, ok=False, disturbed=True)  # timed out while other work ran
    others = [m for m in ms if (m.strategy, m.task) != ("ngram-mod", "json-out")]
    assert [(g.slot[1], g.why) for g in gaps.state([*others, lost]).gaps] == [("ngram-mod", "failed")]
    # through the kit: a request that fails while other work runs keeps the interference its window saw, and is
    # measured again at the end of its round
    first = disturb(("ngram-mod", "json-out", 1))
    out = run_demo(world, models_dir, [fake(disturbed=first, request_fails=first)], runs=1, retakes=2)
    recs = records(world)
    failed = next(r for r in recs if r["status"] == "failed")
    assert failed["interference"]["disturbed"] and schema.errors("result", failed) == []
    again = next(r for r in recs if r.get("retake_of") == failed["measurement_id"])
    assert again["status"] == "ok" and "1 measured again" in out


BUSY_CAP = 3


def _busy_first_round(e: FakeEngine) -> bool:
    """Other work on the host through round 1 and the retakes at its end, then none."""
    return len(e.started) <= CELLS + BUSY_CAP


def test_a_busy_first_round_interrupted_and_resumed_ends_with_the_command_that_completes_it(world, models_dir,
                                                                                            monkeypatch):
    monkeypatch.setattr(interference, "QUIET_WINDOW_S", 0.01)
    def stop(e: FakeEngine, labels: dict, n: int) -> None:
        if n == CELLS + BUSY_CAP + 2:  # two measurements into round 2: SIGTERM, Ctrl-C or a closed laptop
            raise KeyboardInterrupt

    lines: list[str] = []
    with pytest.raises(KitError, match="interrupted"):
        run_demo(world, models_dir, [fake(busy=_busy_first_round, on_start=stop)], lines, runs=3, retakes=BUSY_CAP)
    retaken = [r for r in records(world) if "retake_of" in r]
    # the cap went to one task's baseline first, then the two strategies that pair with it (all disturbed again)
    assert sorted(r["strategy"] for r in retaken) == ["baseline", "draft-simple", "ngram-mod"]
    assert len({r["task"] for r in retaken}) == 1 and all(r["interference"]["disturbed"] for r in retaken)
    assert any("round 1: 6 measurement(s) do not count (6 disturbed by other work); measuring 3 again to restore "
               "2 pair(s)" in ln for ln in lines), lines

    out = run_demo(world, models_dir, [fake()], lines, resume="fake")  # on a quiet machine, as the docs say
    rd = RunDir.open(world / "r" / "fake")
    s = summarize(rd)
    assert schema.errors("summary", s) == []
    short = [c for c in s["cells"] if c["verdict"] and c["verdict"]["kind"] == "too few rounds"]
    assert len(short) == 4  # round 1 counts for no cell: every cell has 2 paired rounds
    c = s["completion"]
    assert (len(c["fillable"]), c["disturbed"], c["retakes_made"], c["retake_cap"]) == (4, 6, 3, 3)
    command = "invoke run --resume fake --manifest manifests/demo-cpu.yaml --retakes 9 --quiet-wait 30s"
    assert c["command"] == command and f"`{command}`" in out
    text = render_run(rd, s, world / "R.md", None) + completion_text(s)
    assert text.rstrip().endswith("each measurement first waits up to that long for a quiet host.")
    assert f"`{command}`" in text and "4 cells have no verdict (fewer than 3 paired rounds)" in text
    assert "To measure (again): 6 measurements disturbed by other work; the run retook 3 of its cap of 3" in text

    # the command, as written (the fake engine stands in for the host): every gap retaken, every cell judged
    words = shlex.split(command)
    flags = dict(zip(words[2::2], words[3::2], strict=True))
    assert flags == {"--resume": "fake", "--manifest": "manifests/demo-cpu.yaml", "--retakes": "9",
                     "--quiet-wait": "30s"}
    out = run_demo(world, models_dir, [fake()], lines, resume="fake", retakes=9, quiet_wait=30.0)
    assert "0 ok, 0 failed, 18 already recorded, 6 measured again" in out and "`invoke run" not in out
    s = summarize(rd)
    assert all(c["verdict"]["kind"] != "too few rounds" for c in s["cells"] if c["verdict"])
    assert s["completion"]["command"] is None and completion_text(s) == ""
    # the pairs of round 1: 2 tasks x 2 strategies
    assert s["measurements"]["retakes"] == 9 and s["measurements"]["retake_pairs"] == 4
    waits = [r["quiet"]["wait"] for r in records(world) if "wait" in r.get("quiet", {})]
    assert len(waits) == 6 and all(w["quiet"] and w["bound_s"] == 30.0 for w in waits)


def test_a_quiet_wait_lets_other_work_pass_before_the_timed_request(world, models_dir, monkeypatch):
    monkeypatch.setattr(interference, "QUIET_WINDOW_S", 0.001)
    eng = fake(busy=lambda e: e.reads < 40)  # the host busy for its first 40 seconds
    run_demo(world, models_dir, [eng], quiet_wait=20.0, retakes=0)
    recs = sorted(records(world), key=lambda r: r["order"])
    assert not any(r["interference"]["disturbed"] for r in recs)  # none measured while the host was busy
    first = recs[0]["quiet"]["wait"]
    assert first["quiet"] and first["windows"] >= 30 and first["others_cores"] < 0.25
    assert all(r["quiet"]["wait"]["windows"] == 1 for r in recs[1:])  # quiet at the first look
    assert all(schema.errors("result", r) == [] for r in recs)
    rd = RunDir.open(world / "r" / "fake")
    assert rd.read_meta().plan.quiet_wait_s == 20.0
    s = summarize(rd)
    assert s["quiet_wait"]["measurements"] == 2 * CELLS and s["quiet_wait"]["bound_reached"] == 0
    assert "| quiet wait | up to 20.0 s before each timed request" in render_run(rd, s, world / "R.md", None)


def test_a_quiet_wait_is_bounded_and_says_when_the_host_stayed_busy(world, models_dir, monkeypatch):
    monkeypatch.setattr(interference, "QUIET_WINDOW_S", 0.01)
    lines: list[str] = []
    run_demo(world, models_dir, [fake(busy=lambda e: True)], lines, quiet_wait=0.05, retakes=0)
    recs = records(world)
    waits = [r["quiet"]["wait"] for r in recs]
    assert all(not w["quiet"] and 0.05 <= w["waited_s"] < 5 and w["reasons"] for w in waits)
    assert all(r["interference"]["disturbed"] for r in recs)  # the wait is a bound, not a promise
    assert any("waiting up to 0.05 s for a quiet host before each" in ln for ln in lines)
    s = summarize(RunDir.open(world / "r" / "fake"))
    assert s["quiet_wait"]["bound_reached"] == 2 * CELLS


def test_resume_adds_rounds_to_a_run_planned_with_too_few(world, models_dir):
    out = run_demo(world, models_dir, [fake()], runs=2)
    command = "invoke run --resume fake --manifest manifests/demo-cpu.yaml --runs 3"
    assert f"4 cell(s) have no verdict that more rounds would give them: `{command}`" in out
    s = summarize(RunDir.open(world / "r" / "fake"))
    assert s["completion"]["short_planned"] and "planned with fewer rounds than a verdict needs" in completion_text(s)
    with pytest.raises(KitError, match=r"--runs 1: run fake planned 2 runs per cell; a resume adds rounds"):
        run_demo(world, models_dir, [fake()], resume="fake", runs=1)
    lines: list[str] = []
    out = run_demo(world, models_dir, [fake()], lines, resume="fake", runs=3)
    assert f"{CELLS} ok, 0 failed, {2 * CELLS} already recorded" in out and "`invoke run" not in out
    meta = RunDir.open(world / "r" / "fake").read_meta()
    assert (meta.plan.runs, meta.plan.measurements) == (3, 3 * CELLS)
    assert any("resume fake: 3 runs per cell" in ln for ln in lines)
    assert summarize(RunDir.open(world / "r" / "fake"))["completion"]["command"] is None


def test_a_busy_machine_retakes_within_one_execution_only_once(world, models_dir):
    # disturbed on every attempt: each disturbed measurement is retaken once, the retake kept as it is
    out = run_demo(world, models_dir, [fake(disturbed=disturb(("baseline", "json-out", 1), every_attempt=True))],
                   retakes=5)
    assert "1 measured again" in out
    assert [r["measurement_id"] for r in records(world) if "retake_of" in r] == ["local/baseline/json-out/1/retake"]
    # a resume retakes it again (its last attempt), as `retake_of` the retake: the chain the figures follow
    run_demo(world, models_dir, [fake()], resume="fake")
    recs = records(world)
    assert [r["retake_of"] for r in recs if "retake_of" in r] == ["local/baseline/json-out/1",
                                                                  "local/baseline/json-out/1/retake"]
    index = CellIndex(recs)
    assert [m.id for m in index.used(next(k for k in index.keys if k.strategy == "baseline"
                                          and k.task == "json-out")) if m.round == 1] == \
        ["local/baseline/json-out/1/retake/retake"]
