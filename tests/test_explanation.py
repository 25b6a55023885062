"""Why a strategy is faster or slower: the speedup decomposed on the committed runs, acceptance by draft position
counted from real server logs (tests/data/serverlogs/calls-*.log, b11434 with LLAMA_TRACE set), the cache trap
request by request on the committed naive run, and acceptance parity between the committed CPU and Vulkan demos."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from harness import ROOT, schema
from harness import formatter as fm
from harness.analysis import acceptance as acc
from harness.analysis import decomposition as dc
from harness.analysis import explanation, stats
from harness.analysis.records import CellIndex, CellKey, Measurement
from harness.analysis.summary import summarize
from harness.report import explanation as why_report
from harness.report import results as rp
from harness.run import serverlog
from harness.store.rundir import RunDir

RESULTS = ROOT / "results"
LOGS = Path(__file__).parent / "data" / "serverlogs"
COMMITTED = sorted(p.name for p in RESULTS.iterdir() if (p / "run.json").is_file())


@pytest.fixture(scope="module")
def summaries() -> dict[str, dict]:
    return {name: summarize(RunDir.open(RESULTS / name)) for name in COMMITTED}


# ---------------------------------------------------------------- the decomposition


@pytest.mark.parametrize("name", COMMITTED)
def test_factors_multiply_back_to_the_speedup_on_the_committed_runs(summaries, name):
    s = summaries[name]
    assert schema.errors("summary", s) == []
    rows = {(d["host"], d["strategy"], d["task"]): d for d in s["decomposition"]}
    speculative = {x["id"] for x in s["strategies"] if x["spec_type"] != "none"}
    for c in s["cells"]:
        if c["strategy"] not in speculative or c["speedup"] is None:
            continue
        d = rows.pop((c["host"], c["strategy"], c["task"]))  # every speculative cell with a speedup has its row
        t, r = d["tokens_per_pass"]["estimate"], d["pass_rate"]["estimate"]
        assert d["speedup"] == pytest.approx(c["speedup"], abs=1e-4)
        assert t * r == pytest.approx(c["speedup"], abs=6e-5)  # the speedup rounded to 4 places, the factors to 6
        # as printed: three significant digits each, so the printed product is the printed speedup within rounding
        assert float(fm.sig(t).replace(",", "")) * float(fm.sig(r)) == pytest.approx(c["speedup"], rel=0.012)
        for f in (d["tokens_per_pass"], d["pass_rate"]):
            if f["low"] is not None:
                assert f["low"] <= f["estimate"] <= f["high"]
    assert rows == {}


def _stats(name: str):
    rd = RunDir.open(RESULTS / name)
    meta = rd.read_meta()
    index = CellIndex(rd.measurements())
    bases = {s.id: s.baseline for s in meta.planned_strategies()}
    return index, bases, stats.analyze(index, bases, meta.protocol)


def test_each_round_splits_exactly_into_its_two_factors():
    index, bases, rs = _stats("demo-cpu")
    from harness.analysis.speedups import paired_logs

    for key in [k for k in rs.table.cells if k.strategy in ("draft-simple", "ngram-mod", "eagle3")]:
        split = dc.round_logs(index, key, bases[key.strategy])
        total = paired_logs(index, key, bases[key.strategy])
        assert split and split.keys() == total.keys()
        for rd, (a, b) in split.items():
            assert a + b == pytest.approx(total[rd], abs=1e-12)


def test_tokens_per_pass_is_the_servers_count_and_the_cause_is_named(summaries):
    rows = {(d["strategy"], d["task"]): d for d in summaries["demo-cpu"]["decomposition"]}
    d = rows[("draft-simple", "code-edit")]
    # every run: 128 tokens, 98 of 229 drafted accepted -> 128 / (128 - 98) tokens per pass, a baseline's 1
    assert d["tokens_per_pass"]["estimate"] == pytest.approx(128 / 30, abs=1e-4)
    assert d["tokens_per_pass"]["low"] == d["tokens_per_pass"]["high"] == pytest.approx(128 / 30, abs=1e-4)
    assert d["acceptance"] == pytest.approx(98 / 229, abs=1e-4)
    assert d["offered_tokens_per_pass"] == pytest.approx(1 + 229 / 30, abs=1e-3)
    # a step costs ten baseline passes and yields 4.3 tokens: the step, not acceptance, decides
    assert d["cause"] == "each step too expensive" and d["step_cost_passes"] > 8
    assert rows[("ngram-simple", "code-edit")]["cause"] == "nothing drafted"
    # ngram-cache drafts a little and accepts none: even full acceptance would give 1.07 tok/pass
    assert rows[("ngram-cache", "long-ctx")]["acceptance"] == 0
    # a cause is named only where the speedup is marked: an unmarked estimate's side of 1 is noise
    for name in ("demo-cpu", "real-gemma3-270m"):
        verdicts = {(c["strategy"], c["task"]): (c["verdict"] or {}).get("kind") for c in summaries[name]["cells"]}
        for x in summaries[name]["decomposition"]:
            kind = verdicts[(x["strategy"], x["task"])]
            if x["cause"] != "nothing drafted":
                assert x["cause"] == {"faster": "tokens per pass pay", "equivalent": "gain and cost balance"}.get(
                    kind, "not decided" if kind != "slower" else x["cause"]), (name, x["strategy"], x["task"])
                assert (x["cause"] in ("acceptance too low", "each step too expensive")) == (kind == "slower")
    gemma = summaries["real-gemma3-270m"]["decomposition"]
    assert any(x["speedup"] > 1.2 and x["cause"] == "not decided" for x in gemma)


def test_rule_picks_the_factor_further_from_its_ideal():
    from harness.analysis import inference as inf

    def cause(tpp: float, rate: float, accepted: int, drafted: int, predicted: int = 100) -> dc.Cause:
        recs = [{"strategy": "s", "task": "t", "round": 1, "status": "ok", "client": {"decode_tok_s": 10.0},
                 "server": {"predicted_n": predicted, "draft_n": drafted, "draft_n_accepted": accepted}}]
        index = CellIndex(recs)
        t = inf.Estimate(math.log(tpp), 0.0, math.inf, 3, inf.Method.MEAN, False)
        p = inf.Estimate(math.log(rate), 0.0, math.inf, 3, inf.Method.MEAN, False)
        return dc._decomposition(index, CellKey("local", "s", "t"), "b", math.log(tpp * rate), t, p, 3,
                                 "slower").cause

    # 20 of 100 drafted tokens accepted (offered 1 + 100/80 = 2.25 tok/pass, had 1.25), steps nearly free: acceptance
    assert cause(1.25, 0.7, 20, 100) == dc.Cause.ACCEPTANCE
    # 90 of 100 accepted, a step costs 10 passes: the step
    assert cause(10.0, 0.09, 90, 100) == dc.Cause.STEP
    assert cause(1.0, 0.9, 0, 0) == dc.Cause.NOTHING_DRAFTED


def test_draft_share_and_verify_pass_from_the_servers_statistics(summaries):
    rows = {(d["strategy"], d["task"]): d for d in summaries["demo-vulkan"]["decomposition"]}
    d = rows[("draft-simple", "code-edit")]
    # the three runs' dur(b,g,a) summed over their decode ms: 2121.246/5656.141, 2856.614/7609.506,
    # 2445.001/6297.725; the median share is the second run's
    assert d["draft_share"] == pytest.approx(2856.614 / 7609.506, abs=1e-4)
    # 104 of 128 tokens were accepted drafts: 24 target passes share the rest of the decode time; the median of
    # 147.29, 198.04 and 160.53 ms
    assert d["verify_pass_ms"] == pytest.approx((6297.725 - 2445.001) / 24, abs=1e-3)
    assert d["baseline_pass_ms"] is not None and d["verify_pass_ms"] > d["baseline_pass_ms"]
    # CPU records carry no trace-level statistics: no split, said by its absence
    assert all(x["draft_share"] is None for x in summaries["demo-cpu"]["decomposition"])


# ---------------------------------------------------------------- by position, from the server's own lines


@pytest.mark.parametrize("name, accepted, drafted", [
    # counted by hand from the log's `accepted  a/ d draft tokens` lines
    ("calls-draft-simple-lv4", [13, 3, 0, 0, 0, 1, 2, 2, 8], {6: 1, 7: 1, 8: 27}),
    ("calls-draft-mtp-lv4", [13, 16, 14, 10], {1: 1, 2: 1, 3: 51}),
])
def test_per_call_lines_counted_as_by_hand_and_as_the_server_itself(name, accepted, drafted):
    parsed = serverlog.parse((LOGS / f"{name}.log").read_text())
    calls = serverlog.draft_calls(parsed)
    assert calls is not None and calls["accepted"] == accepted and calls["calls"] == sum(accepted)
    assert {i: n for i, n in enumerate(calls["drafted"]) if n} == drafted
    # the figures the report shows, from a record holding these calls ...
    rec = {"strategy": "s", "task": "t", "status": "ok", "client": {"decode_tok_s": 1.0}, "spec_type": "x",
           "server": {"predicted_n": 128, "draft_n": parsed.draft_acceptance["generated"],
                      "draft_n_accepted": parsed.draft_acceptance["accepted"]},
           "server_log": {"draft_calls": calls}}
    pos = acc.Positions()
    pos.add(Measurement.of(rec))
    # ... are the server's own per-position acceptance (its `acc per pos` line, trace level), to its 3 decimals
    assert len(pos.shares) == len(parsed.acc_per_pos)
    for mine, server in zip(pos.shares, parsed.acc_per_pos, strict=True):
        assert mine == pytest.approx(server, abs=5e-4)
    assert 1 + sum(pos.shares) == pytest.approx(parsed.draft_acceptance["mean_len"], abs=5e-3)


def test_calls_missing_from_the_log_give_no_figures_rather_than_partial_ones():
    lines = (LOGS / "calls-draft-simple-lv4.log").read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if "draft tokens" in ln)
    cut = "\n".join(lines[:first] + lines[first + 1:])  # one call line lost (a log tail too short)
    assert serverlog.draft_calls(serverlog.parse(cut)) is None
    # without LLAMA_TRACE the server prints no call line: nothing, not zeros
    assert serverlog.draft_calls(serverlog.parse((LOGS / "ok-draft-simple.log").read_text())) is None


def test_a_reused_servers_earlier_requests_are_left_out_and_a_restored_checkpoint_is_one_call():
    one = (LOGS / "calls-draft-simple-lv4.log").read_text()
    two = one + "\n" + one.replace("| task 0 |", "| task 5 |").replace("accepted  8/ 8", "accepted  3/ 8 "
                                                                        "draft tokens (restore checkpoint)\n"
                                                                        "x I slot operator(): id  0 | task 5 | "
                                                                        "accepted  4/ 4")
    parsed = serverlog.parse(two)
    # the second request (task 5): its 8/8 calls became 3/8 with a checkpoint restored, each followed by the
    # replay of the 3 accepted tokens and the corrected one (4/4), which the server does not count as a call
    # (its own acceptance line would say 98 - 8*5 accepted: the test gives it that line)
    parsed.task_accepted[5] = 98 - 8 * 5
    later = serverlog.draft_calls(parsed, skip={0})
    assert later is not None and later["calls"] == 29 and later["accepted"][3] == 8 and len(later["accepted"]) == 8
    assert later["tasks"] == 1
    both = serverlog.draft_calls(parsed)
    assert both is not None and both["calls"] == 58 and both["tasks"] == 2


def test_records_without_per_position_figures_say_why_once_and_show_the_mean_length(summaries):
    part = summaries["demo-cpu"]["positions"]
    assert part["requests_without"] > 0 and "LLAMA_TRACE" in part["note"]
    assert all(p["calls"] == 0 and p["mean_len"]["n"] for p in part["strategies"])
    vk = summaries["demo-vulkan"]["positions"]
    shares = {p["strategy"]: p for p in vk["strategies"]}
    # three runs of each task, every run's `acc per pos` weighted by its calls (the server's calls_accept)
    ds = shares["draft-simple"]
    assert ds["sources"] == [acc.SERVER_SHARES] and ds["calls"] == 3 * (23 + 15)
    assert ds["shares"][0] == pytest.approx((0.652 * 23 + 1.0 * 15) / 38, abs=1e-3)
    assert vk["requests_without"] == 0 and vk["note"] is None


# ---------------------------------------------------------------- the cache trap, request by request


def test_the_naive_run_request_by_request_beside_fresh_containers(summaries):
    naive, fresh = summaries["real-gemma3-270m-naive"], summaries["real-gemma3-270m"]
    rows = naive["requests"]["servers"]
    assert [r["index"] for r in rows] == list(range(1, 19)) and {r["server"] for r in rows} == {1}
    # request 2 (code-edit, its first time in this server): 92 drafted, 22 accepted; fresh: 40 and 18 every run
    assert (rows[1]["prompt"], rows[1]["drafted"], rows[1]["accepted"]) == ("code-edit", 92, 22)
    peer = why_report.fresh_peer(naive, [fresh, naive])
    assert peer is fresh
    f = {(x["strategy"], x["prompt"]): x for x in fresh["requests"]["prompts"]}[("ngram-mod", "code-edit")]
    assert (f["drafted"], f["accepted"], f["drafted_range"]) == (40, 18, [40, 40])
    table, sentence = why_report.requests_table(naive, peer)
    # requests 2, 8, 11, 14 and 15 drafted what no fresh container did for the same prompt
    assert sentence.startswith("5 of 18 requests")
    assert table.count("≠") == 5
    assert why_report.fresh_peer(fresh, [fresh, naive]) is None and fresh["requests"]["servers"] == []


# ---------------------------------------------------------------- parity


def _units(*names: str) -> list[acc.Unit]:
    out = []
    for name in names:
        rd = RunDir.open(RESULTS / name)
        out += acc.units(rd.read_meta(), CellIndex(rd.measurements()))
    return out


def test_same_files_on_two_backends_a_difference_is_named():
    found = {(p.strategy, p.task): p for p in acc.parity(_units("demo-cpu", "demo-vulkan"))}
    assert set(found) == {("draft-simple", "code-edit"), ("draft-simple", "json-out"), ("ngram-mod", "code-edit"),
                          ("ngram-mod", "json-out")}
    p = found[("draft-simple", "code-edit")]
    assert (p.a.backend, p.b.backend) == ("cpu", "vulkan") and not p.paired
    # every run: 98 of 229 accepted on the CPU, 104 of 177 on the Vulkan device; no spread either side
    assert p.difference == pytest.approx(104 / 177 - 98 / 229)
    assert p.low == pytest.approx(p.difference) and p.high == pytest.approx(p.difference)
    assert p.differs and p.units == 1  # one prompt
    assert not any(x.differs for k, x in found.items() if k != ("draft-simple", "code-edit"))
    text = why_report.parity_text([acc.parity_dict(x) for x in found.values()])
    assert "**draft-simple / code-edit**: 42.8% with backend cpu (demo-cpu), 58.8% with backend vulkan" in text


def test_parity_within_one_run_is_paired_by_round_and_noise_is_not_a_finding():
    what = acc.What("draft-simple", (), 1, "t", "d", "task", "p", 64, "completion", "temperature=0")
    a, b = acc.Where("a", "cuda", "b1"), acc.Where("b", "cuda", "b2")
    base = [0.50, 0.62, 0.41, 0.55, 0.47]
    units = [acc.Unit(what, a, "r", i + 1, x, "s") for i, x in enumerate(base)]
    # the other host follows the rounds' swings within half a point: paired, that is no difference
    units += [acc.Unit(what, b, "r", i + 1, x + (0.004 if i % 2 else -0.004), "s") for i, x in enumerate(base)]
    (p,) = acc.parity(units)
    assert p.paired and p.units == 5 and not p.differs and p.low < 0 < p.high
    # a build that accepts 5 points less in every round is a finding, however the rounds swing
    units = units[:5] + [acc.Unit(what, b, "r", i + 1, x - 0.05, "s") for i, x in enumerate(base)]
    (p,) = acc.parity(units)
    assert p.differs and p.high < 0 and p.b.build == "b2"
    # one run each, in different runs: no spread to judge by, no verdict
    one = [acc.Unit(what, a, "r1", 1, 0.5, "s"), acc.Unit(what, b, "r2", 1, 0.3, "s")]
    (p,) = acc.parity(one)
    assert p.p_differs is None and not p.differs


def test_a_record_naming_its_build_is_keyed_by_it():
    meta = RunDir.open(RESULTS / "demo-cpu").read_meta()
    assert acc.build_of(meta, {}) == "b11434 (b11434)"
    assert acc.build_of(meta, {"build": "b9093"}) == "b9093"


# ---------------------------------------------------------------- the report


def test_report_shows_the_sections_and_the_plots(tmp_path):
    runs = []
    for name in ("real-gemma3-270m", "real-gemma3-270m-naive", "demo-vulkan", "demo-cpu"):
        shutil.copytree(RESULTS / name, tmp_path / name)
        runs.append(tmp_path / name)
    out = tmp_path / "RESULTS.md"
    rp.write(runs, out)
    text = out.read_text()
    assert text.count("### Why: speedup = tokens per pass × pass rate") == 4
    assert "| code-edit | 1.48x = 2.24 tok/pass × 0.660 pass rate |" in text
    # by position: the Vulkan run's plot beside its speedup plot; the CPU runs say once why they have none
    assert "plot.png) ![acceptance by draft position](demo-vulkan/positions.png)" in text
    assert (tmp_path / "demo-vulkan" / "positions.png").read_bytes()[:4] == b"\x89PNG"
    said = [explanation.NO_POSITIONS.format(build=b).replace("`", "\\`").replace("_", "\\_") for b in (
        "this run's build (b11434)", "b11434 (where the kit measured it; not checked on this run's b10502)")]
    assert sum(text.count(x) for x in said) == 3
    # the cache trap: only the naive run has it, with its plot
    assert text.count("### Request by request in one server") == 1
    assert (tmp_path / "real-gemma3-270m-naive" / "requests.png").is_file()
    assert "## Acceptance parity" in text and "**differs**" in text
    summary = json.loads((tmp_path / "demo-cpu" / "summary.json").read_text())
    assert schema.errors("summary", summary) == []


def test_positions_reach_the_longest_draft_even_where_none_was_accepted_that_far():
    # two calls of 8 drafted tokens, 2 and 3 accepted: positions 4..8 accepted in no call
    rec = {"strategy": "s", "task": "t", "status": "ok", "client": {"decode_tok_s": 1.0},
           "server": {"predicted_n": 10, "draft_n": 16, "draft_n_accepted": 5},
           "server_log": {"draft_calls": {"calls": 2, "accepted": [0, 0, 1, 1], "drafted": [0] * 8 + [2]}}}
    pos = acc.Positions()
    pos.add(Measurement.of(rec))
    assert pos.shares == [1.0, 1.0, 0.5, 0, 0, 0, 0, 0] and pos.accepted_hist == [0, 0, 1, 1]


def test_a_request_whose_acceptance_line_is_logged_after_its_response_is_waited_for():
    """llama-server logs from a thread of its own: the calls of a request can be in the log before its acceptance
    line. The record waits for that line (on the recorded log, replayed in two steps) rather than drop the calls."""
    from types import SimpleNamespace

    from harness.run import protocol

    lines = (LOGS / "calls-draft-simple-lv4.log").read_text().splitlines()
    upto = next(i for i, ln in enumerate(lines) if "draft acceptance" in ln)
    reads = []

    def log(tail: int) -> str:
        reads.append(tail)
        return "\n".join(lines if len(reads) > 2 else lines[:upto])

    item = SimpleNamespace(cell=SimpleNamespace(task=SimpleNamespace(n_predict=128),
                                                strategy=SimpleNamespace(parallel=1)))
    seen: set[int] = set()
    out = protocol.server_statistics(SimpleNamespace(log=log), item, seen)
    assert len(reads) == 3 and reads[0] >= 29 + 40  # every call line of 128 tokens fits the tail read
    assert out["draft_calls"]["calls"] == 29 and out["draft_acceptance"]["accepted"] == 98 and seen == {0}
    # the same server's next request: its earlier task is left out
    assert "draft_calls" not in protocol.server_statistics(SimpleNamespace(log=log), item, seen)


def test_build_facts_are_said_of_the_runs_own_builds(summaries):
    from harness.analysis import builds

    assert builds.measured_on(["b11434"]) == "this run's build (b11434)"
    assert builds.measured_on(["b11434", "b10502"]).endswith("not checked on this run's b10502)")
    note = summaries["builds-gemma3-270m"]["positions"]["note"]
    assert note and "not checked on this run's b10502" in note
    assert "this run's build (b11434) prints" in summaries["real-gemma3-270m"]["positions"]["note"]
