"""The load study: its manifest block bounded and typed, the open-loop sender against a fake llama-server on
loopback, the serving metrics on hand-made request timings (vLLM's definitions), the judgement on synthetic
levels (Holm per table, paired by round), and one level measured end to end on a stub engine."""

from __future__ import annotations

import math
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from harness import ROOT
from harness.analysis import load as judged
from harness.hosts.engine import Endpoint
from harness.intake import load as load_block
from harness.intake import manifest as mf
from harness.intake.bounded_yaml import ManifestError
from harness.run import load as load_run
from harness.run import metrics
from harness.run.protocol import Context
from harness.store import load as store
from harness.store.rundir import RunDir
from tests.fakeserver import FakeLlamaServer

GEMMA = ROOT / "manifests" / "load-gemma3-270m.yaml"


def _with_load(tmp_path: Path, block: object) -> Path:
    raw = yaml.safe_load(GEMMA.read_text())
    raw["load"] = block
    p = tmp_path / "manifests" / "load.yaml"
    p.parent.mkdir()
    shutil.copytree(ROOT / "manifests" / "tasks", p.parent / "tasks")
    p.write_text(yaml.safe_dump(raw, sort_keys=False))
    return p


BASE = {"rates": [1, 2], "requests": 4, "slots": [1, 4], "slo": {"ttft_ms": 500}}


@pytest.mark.parametrize(("change", "field", "expected"), [
    ({"rates": [-1]}, "load.rates[0]", "above 0"),
    ({"rates": [1e9]}, "load.rates[0]", "at most 1000"),
    ({"rates": ["1e9"]}, "load.rates[0]", "expected a number of requests per second"),
    ({"rates": ["fast"]}, "load.rates[0]", "expected a number of requests per second"),
    ({"rates": "fast"}, "load.rates", "expected `sweep` or a list"),
    ({"rates": [True]}, "load.rates[0]", "expected a number"),
    ({"requests": None, "duration_s": 0}, "load.duration_s", "above 0"),
    ({"requests": 0}, "load.requests", "at least 1"),
    ({"requests": 2.5}, "load.requests", "whole number"),
    ({"slots": [0]}, "load.slots[0]", "at least 1"),
    ({"slo": {"ttft_ms": -5}}, "load.slo.ttft_ms", "above 0"),
    ({"slo": {"latency": 5}}, "load.slo.latency", "expected a mapping of"),
    ({"arrivals": "uniform"}, "load.arrivals", "expected one of"),
    ({"burstiness": 0.5}, "load.burstiness", "Poisson arrivals have burstiness 1"),
    ({"strategies": ["ngram-mod", "baseline"]}, "load.strategies[0]", "expected the baseline"),
    ({"strategies": ["nope"]}, "load.strategies[0]", "expected one of"),
    ({"speed": 1}, "load.speed", "unknown field"),
    ({"rates": [100], "requests": 10000, "rounds": 50}, "load", "requests in all"),
])
def test_a_wrong_load_field_is_one_line_naming_the_file_and_the_field(tmp_path, change, field, expected):
    block = {**BASE, **change}
    if block.get("requests", 0) is None:
        del block["requests"]
    p = _with_load(tmp_path, block)
    with pytest.raises(ManifestError) as e:
        mf.load(p, check_files=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: {field}:") and expected in msg, msg


def test_the_committed_load_manifests_validate_and_state_levels_requests_and_time():
    m = mf.load(GEMMA)
    s = m.load
    assert s is not None and s.rates == (0.5, 1.0, 2.0) and s.slots == (1, 4) and s.warmup == 2
    assert [a.id for a in load_block.arms(s, m.strategies)] == [
        "baseline@1", "ngram-mod@1", "ngram-simple@1", "baseline@4", "ngram-mod@4", "ngram-simple@4"]
    assert [a.parallel for a in load_block.arms(s, m.strategies)] == [1, 1, 1, 4, 4, 4]
    lines = load_block.describe(s)
    assert load_block.total_requests(s) == 6 * 3 * 3 * (12 + 2)
    assert lines[-1].startswith("  in all: 756 requests, about ")
    # sending time: (12 + 2) / rate per level, and a server start per level
    minutes = float(lines[-1].split("about ")[1].split(" min")[0])
    expected = 6 * 3 * (sum(14 / r for r in s.rates) + 3 * load_block.START_ESTIMATE_S) / 60
    assert abs(minutes - expected) < 0.1
    spark = mf.load(ROOT / "manifests" / "spark-qwen3.8-27b.yaml", check_files=False)
    assert spark.load is not None and spark.load.strategies[0] == "baseline" and len(spark.load.strategies) == 4


def test_a_sweep_names_its_levels_and_says_its_time_is_partly_unknown(tmp_path):
    m = mf.load(_with_load(tmp_path, {"rates": "sweep", "requests": 4, "sweep_rates": 3}), check_files=False)
    assert m.load.level_names() == ["synchronous", "throughput", "between-1", "between-2", "between-3"]
    assert "plus the synchronous and throughput levels" in load_block.describe(m.load)[-1]
    assert load_run.between(1.0, 4.0, 3) == [1.75, 2.5, 3.25]


def test_the_schedule_is_seeded_and_has_the_offered_rate_and_burstiness():
    a = load_run.schedule(4000, 5.0, "poisson", 1.0, "s")
    assert a == load_run.schedule(4000, 5.0, "poisson", 1.0, "s") != load_run.schedule(4000, 5.0, "poisson", 1.0, "t")
    assert a[0] == 0.0 and all(y >= x for x, y in zip(a, a[1:], strict=False))
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean
    assert abs(mean - 0.2) < 0.02 and abs(cv - 1) < 0.08  # exponential: the coefficient of variation is 1
    b = load_run.schedule(4000, 5.0, "gamma", 0.25, "s")
    gb = [y - x for x, y in zip(b, b[1:], strict=False)]
    mb = sum(gb) / len(gb)
    cvb = math.sqrt(sum((g - mb) ** 2 for g in gb) / len(gb)) / mb
    assert abs(mb - 0.2) < 0.03 and abs(cvb - 2) < 0.3  # gamma of shape k: CV 1/sqrt(k)
    prompts = [("t", "a"), ("t", "b"), ("u", "c")]
    seq = load_run.prompt_sequence(prompts, 50, "seed")
    assert seq == load_run.prompt_sequence(prompts, 50, "seed") and set(seq) == set(prompts)


def _plan(n: int, offsets: list[float] | None, cap: int | None = None) -> load_run.Plan:
    body = {"prompt": "x", "n_predict": 5, "temperature": 0.0, "seed": 1, "cache_prompt": False, "stream": True,
            "return_tokens": True}
    return load_run.Plan([dict(body) for _ in range(n)], [f"t/p{i}" for i in range(n)], offsets, cap)


def test_the_sender_keeps_the_schedule_open_loop_while_answers_are_slow():
    # each answer takes 0.4 s; the schedule sends 8 requests 0.05 s apart: a closed loop would take 3.2 s
    with FakeLlamaServer(tokens=[1, 2, 3, 4, 5], decode_s=0.4) as srv:
        offsets = [0.05 * i for i in range(8)]
        reqs, wall = load_run.send(Endpoint(srv.port), _plan(8, offsets), 10.0)
    assert all(r["error"] is None for r in reqs), reqs
    lags = [r["sent_s"] - r["scheduled_s"] for r in reqs]
    assert max(lags) < 0.05, lags  # no send waited for an answer
    assert wall < 1.5
    assert all(r["output_tokens"] == 5 and len(r["itl_s"]) == 4 and r["e2el_s"] >= 0.4 for r in reqs)
    a = judged.achieved({"requests": reqs, "offered_rate": 20.0})
    assert a.offered and a.behind == 0 and abs(a.schedule_rate - 20.0) < 1e-6 and a.send_rate > 15


def test_the_concurrency_cap_holds_sends_back_and_the_level_is_named_as_not_offered():
    with FakeLlamaServer(tokens=[1, 2, 3], decode_s=0.3) as srv:
        reqs, _ = load_run.send(Endpoint(srv.port), _plan(6, [0.02 * i for i in range(6)], cap=2), 10.0)
    sent = sorted(r["sent_s"] for r in reqs)
    assert sent[2] >= 0.29 and sent[4] >= 0.58  # the third waited for the first answer
    a = judged.achieved({"requests": reqs, "offered_rate": 50.0})
    assert not a.offered and a.behind >= 3
    line = load_run.level_line({"strategy": "baseline", "level": "50", "round": 1, "status": "ok",
                                "offered_rate": 50.0, "requests": reqs})
    said = f"offered 50 req/s (this schedule 50.00), NOT OFFERED ({a.behind} of 6 sends behind the schedule)"
    assert said in line, line


def test_synchronous_sends_each_request_after_the_last_answer():
    with FakeLlamaServer(tokens=[1, 2], decode_s=0.1) as srv:
        reqs, _ = load_run.send(Endpoint(srv.port), _plan(3, None), 10.0)
    for a, b in zip(reqs, reqs[1:], strict=False):
        assert b["sent_s"] >= a["sent_s"] + a["e2el_s"] - 1e-3


def _req(sent: float, ttft: float, e2el: float, tokens: int, itl: list[float] | None = None,
         error: str | None = None) -> store.Request:
    return {"prompt": "t/p", "scheduled_s": sent, "sent_s": sent, "ttft_s": None if error else ttft,
            "e2el_s": None if error else e2el, "output_tokens": 0 if error else tokens, "error": error,
            "itl_s": itl or []}


def test_metrics_follow_vllms_definitions_on_hand_made_timings():
    reqs = [_req(0.0, 0.1, 1.1, 11, [0.1] * 10),  # TPOT (1.1 - 0.1) / 10 = 100 ms
            _req(0.5, 0.3, 0.8, 6, [0.05, 0.05, 0.2, 0.1, 0.1]),  # TPOT 0.5 / 5 = 100 ms
            _req(1.0, 0.2, 0.2, 1),  # one token: no TPOT; meets a TPOT SLO (0, as vLLM)
            _req(1.5, 0, 0, 0, error="boom")]
    slo = load_block.Slo(ttft_ms=250, tpot_ms=150)
    a = judged.achieved({"requests": reqs, "offered_rate": 2.0})
    assert a.duration_s == pytest.approx(1.3)  # first send 0 to last answer 0.5 + 0.8
    m = judged.metrics(reqs, slo, a.duration_s)
    assert (m.sent, m.completed, m.good) == (4, 3, 2)  # the second misses TTFT; the failed one meets nothing
    assert m.request_throughput == pytest.approx(3 / 1.3) and m.output_tok_s == pytest.approx(18 / 1.3)
    assert m.goodput == pytest.approx(2 / 1.3)
    assert m.tpot_ms["p50"] == pytest.approx(100) and m.tpot_ms["mean"] == pytest.approx(100)
    assert m.itl_ms["mean"] == pytest.approx(1000 * (1.0 + 0.5) / 15)  # 15 gaps pooled over two requests
    assert m.ttft_ms["p50"] == pytest.approx(200) and m.e2el_ms["p99"] == pytest.approx(1000 * (0.8 + 0.3 * 0.98))


def test_a_levels_acceptance_is_its_servers_counters_after_minus_before():
    """The level reads the counters as a single request does (harness/run/metrics.py): after the level minus after
    the warm-up; where they could not be read, the acceptance is none, not zero."""
    before = metrics.parse("llamacpp:spec_decode_num_drafts_total 2\nllamacpp:spec_decode_num_draft_tokens_total 8\n"
                           "llamacpp:spec_decode_num_accepted_tokens_total 5\n")
    after = metrics.parse("# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
                          "llamacpp:spec_decode_num_drafts_total 12\nllamacpp:spec_decode_num_draft_tokens_total 48\n"
                          "llamacpp:spec_decode_num_accepted_tokens_total 30\nllamacpp:prompt_tokens_total 99\n")
    acc = judged.acceptance({"spec_counters": metrics.request_counters(before, after)})
    assert acc["drafts"] == 10 and acc["draft_tokens"] == 40 and acc["accepted"] == 25
    assert acc["mean_length"] == pytest.approx(3.5)
    absent = judged.acceptance({"spec_counters": metrics.request_counters(before, "GET /metrics answered 501")})
    assert absent == {"drafts": None, "draft_tokens": None, "accepted": None, "mean_length": None}
    assert store.problem_in_counters({"drafts": 1, "draft_tokens": 2, "accepted": 3, "accepted_per_pos": []}) \
        == "accepted exceeds what was drafted"


def _level(arm: str, entry: str, slots: int, rate: float, round_: int, service_s: float, n: int = 20,
           tokens: int = 20, ttft_s: float = 0.05, spec: bool = False, lag: float = 0.0) -> store.Level:
    """A level of n requests sent at the rate, each taking service_s with its TTFT, tokens evenly after it."""
    reqs = [{"prompt": "t/p", "scheduled_s": i / rate, "sent_s": i / rate + lag * i, "ttft_s": ttft_s,
             "e2el_s": service_s, "output_tokens": tokens, "error": None} for i in range(n)]
    return {"format_version": 1, "run_id": "r", "strategy": arm, "entry": entry, "speculative": spec,
            "slots": slots, "level": f"{rate:g}", "mode": "rate", "offered_rate": rate, "round": round_,
            "arrivals": "poisson", "burstiness": 1.0, "schedule_seed": "s", "warmup": 2, "status": "ok",
            "baseline": "baseline", "slo": {}, "requests": reqs, "wall_s": 1.0}


def _study(effect_at: dict[float, float], rounds: int = 4, noise: float = 0.02) -> list[store.Level]:
    """Baseline service 1 s at every rate; speculation's service time times effect_at[rate] (below 1: faster)."""
    out = []
    for r in range(1, rounds + 1):
        for i, (rate, eff) in enumerate(sorted(effect_at.items())):
            jitter = 1 + noise * math.sin(7 * r + 3 * i)
            out.append(_level("baseline", "baseline", 1, rate, r, 1.0 * jitter))
            out.append(_level("ngram-mod", "ngram-mod", 1, rate, r, 1.0 * eff * (1 + noise * math.cos(5 * r + i)),
                              spec=True))
    return out


def test_the_judgement_marks_levels_under_one_holm_family_and_names_the_crossover():
    levels = _study({0.5: 0.6, 1: 0.7, 2: 1.0, 4: 1.5})
    j = judged.judge(levels, "baseline", load_block.Slo(tpot_ms=40))
    rows = {r.level: r for r in j.rows}
    assert j.family == 4 * 3
    assert rows["0.5"].cells["p99_tpot"].mark == 1 and rows["4"].cells["p99_tpot"].mark == -1
    assert rows["2"].cells["p99_tpot"].mark == 0
    assert rows["0.5"].cells["p99_tpot"].estimate == pytest.approx(0.95 / 0.55, rel=0.05)  # TPOT excludes the TTFT
    x = next(c for c in j.crossovers if c.figure == "p99_tpot")
    assert (x.pays_up_to, x.worse_from) == (1, 4) and 1 < x.estimate < 4
    assert abs(math.log(x.estimate) - math.log(2.0)) < 0.2  # the estimate crosses 1 near 2 req/s


def test_the_crossover_is_not_within_the_rates_measured_when_no_level_is_worse():
    j = judged.judge(_study({0.5: 0.6, 1: 0.7}), "baseline", load_block.Slo())
    x = next(c for c in j.crossovers if c.figure == "p99_tpot")
    assert x.worse_from is None and x.pays_up_to == 1


def test_a_level_whose_sends_fell_behind_is_named_and_left_out():
    levels = _study({0.5: 0.6, 1: 0.7})
    levels[2] = _level("baseline", "baseline", 1, 1, 1, 1.0, lag=0.2)  # round 1 at 1 req/s: sends drift late
    j = judged.judge(levels, "baseline", load_block.Slo())
    assert ("baseline", "1", 1) in j.not_offered
    row = next(r for r in j.rows if r.level == "1")
    assert row.not_offered_rounds == (1,) and row.cells["p99_tpot"].rounds == 3


def test_an_aa_study_marks_nothing():
    j = judged.judge(_study({0.5: 1.0, 1: 1.0, 2: 1.0}, noise=0.1), "baseline", load_block.Slo())
    assert all(c.mark == 0 for r in j.rows for c in r.cells.values())


def test_load_jsonl_is_read_back_only_when_every_field_is_in_bounds(tmp_path):
    rec = _level("baseline", "baseline", 1, 1.0, 1, 1.0, n=3)
    store.append(tmp_path, rec)
    assert store.read(tmp_path) == [rec]
    with open(store.path_of(tmp_path), "a") as f:
        f.write('{"format_version": 1, "run_id"')  # a last line cut short: that level is lost
    assert len(store.read(tmp_path)) == 1
    bad = dict(rec, requests=[dict(rec["requests"][0], ttft_s=-1)])
    store.path_of(tmp_path).write_text(__import__("json").dumps(bad) + "\n")
    with pytest.raises(Exception, match=r"load.jsonl:1: requests\[0\]\.ttft_s: expected seconds"):
        store.read(tmp_path)


class _Container:
    id = "c0ffee"
    short_id = "c0ffee"


class _StubEngine:
    """An engine whose every server is a FakeLlamaServer on loopback that counts drafts in its /metrics."""

    name = "local"
    transient_errors = ()
    lost_errors = ()

    def __init__(self) -> None:
        self.servers: list[FakeLlamaServer] = []
        self.commands: list[list[str]] = []

    def free_port(self) -> int:
        seen = {"n": 0}
        lock = threading.Lock()

        def metrics() -> str:
            with lock:
                seen["n"] += 1
                n = seen["n"]
                return (f"llamacpp:spec_decode_num_drafts_total {10 * n}\n"
                        f"llamacpp:spec_decode_num_draft_tokens_total {40 * n}\n"
                        f"llamacpp:spec_decode_num_accepted_tokens_total {20 * n}\n")
        srv = FakeLlamaServer(tokens=[1, 2, 3, 4], decode_s=0.05, metrics=metrics)
        srv.__enter__()
        self.servers.append(srv)
        return srv.port

    def start_server(self, image, command, mounts, labels, access):  # noqa: ARG002
        self.commands.append(command)
        return _Container()

    def endpoint(self, port: int) -> Endpoint:
        return Endpoint(port)

    def status(self, container) -> str:  # noqa: ARG002
        return "running"

    def logs(self, container, tail) -> str:  # noqa: ARG002
        return ""

    def remove(self, container) -> None:  # noqa: ARG002
        self.servers[-1].__exit__(None, None, None)


def test_one_fresh_server_per_strategy_level_and_round_into_load_jsonl(tmp_path):
    m = mf.load(_with_load(tmp_path, {"rates": [20, 40], "requests": 4, "slots": [1, 2], "rounds": 2,
                                      "strategies": ["baseline", "ngram-mod"], "tasks": ["en-prose"]}))
    m = replace(m, endpoint="completion")
    engine = _StubEngine()
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    ctx = Context("run", m, "img", "cpu", {"local": {"target": Path("/m/gemma.gguf")}}, lambda e, w: None)
    t0 = time.monotonic()
    counts = load_run.draw(ctx, engine, rd, log=lambda s: None)
    assert counts == {"ok": 16, "failed": 0, "skipped": 0} and time.monotonic() - t0 < 30
    levels = store.read(rd.path)
    assert len(engine.commands) == 16 and all("--metrics" in c for c in engine.commands)
    assert sorted({(x["strategy"], x["level"], x["round"]) for x in levels}) == sorted(
        (f"{s}@{n}", lv, r) for s in ("baseline", "ngram-mod") for n in (1, 2) for lv in ("20", "40") for r in (1, 2))
    assert all(len(x["requests"]) == 4 and x["warmup"] == 2 for x in levels)
    # the same prompts at the same times for every strategy at a level and round
    key = [(x["requests"][i]["prompt"], x["requests"][i]["scheduled_s"]) for x in levels
           if x["level"] == "20" and x["round"] == 1 and x["slots"] == 1 for i in range(4)]
    assert key[:4] == key[4:]
    # counters after the warm-up and after the level, on the level's own server
    assert all(x["spec_counters"] == {"drafts": 10, "draft_tokens": 40, "accepted": 20, "accepted_per_pos": []}
               for x in levels)
    # the warm-up requests went to the server and are not in the record: 2 + 4 streamed per server
    assert all(sum(1 for p, b in s.requests if p == "/completion") == 6 for s in engine.servers)
    assert load_run.draw(ctx, engine, rd, log=lambda s: None) == {"ok": 0, "failed": 0, "skipped": 16}


def test_the_report_prints_the_table_the_plot_and_only_what_the_marks_show(tmp_path):
    from harness.report import load as load_report

    for rec in _study({0.5: 0.6, 1: 0.7, 2: 1.0, 4: 1.5}):
        rec["slo"] = {"tpot_ms": 40.0}
        store.append(tmp_path, rec)
    text = load_report.section(tmp_path, tmp_path / "RESULTS.md")
    rows = [ln for ln in text.splitlines() if ln.startswith("| 1 |")]
    assert len(rows) == 8 and rows[0].split(" | ")[2] == "baseline"  # the baseline's rows first
    assert "Holm over the 12 cells of this table" in text and "TPOT ≤ 40 ms" in text
    assert "**ngram-mod, p99 TPOT: speculation stops paying between 1 and 4 req/s**" in text
    # under a TPOT SLO of 40 ms the baseline (about 50 ms) meets none; speculation meets it up to 1 req/s
    assert "**ngram-mod, goodput: speculation stops paying between 1 and 4 req/s**" in text
    assert "![goodput and p99 TPOT against the offered rate, 95% intervals](load.png)" in text
    assert (tmp_path / "load.png").read_bytes()[:4] == b"\x89PNG"
    tpot = [ln.split(" | ")[-1] for ln in rows if " ngram-mod " in ln]
    assert tpot[0].endswith("▲ |") and tpot[3].endswith("▼ |") and "▲" not in tpot[2] and "▼" not in tpot[2]


def test_invoke_run_load_measures_the_study_alone_and_the_report_prints_it(world, models_dir):
    from harness.report import results
    from harness.run import runner
    from tests.conftest import DEMO, trusted, write_manifest
    from tests.fake_engine import FakeEngine, demo_image

    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution", None)
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"}, {"id": "ngram-mod", "spec_type": "ngram-mod"}]
    raw["load"] = {"rates": [20, 40], "requests": 3, "warmup": 1, "rounds": 2, "tasks": [raw["tasks"][0]["id"]],
                   "slo": {"ttft_ms": 5000}}
    m = trusted(write_manifest(world / "m", yaml.safe_dump(raw, sort_keys=False), "load.yaml"))
    eng = FakeEngine("local", images=[demo_image(m.manifest)])
    with pytest.raises(Exception, match="--load measures the load study alone"):
        runner.run(m, results_dir=world / "r", models_dir=models_dir, engines=[eng], load=True, until=0.05,
                   log=lambda s: None, progress=False)
    out = runner.run(m, results_dir=world / "r", models_dir=models_dir, run_id="ld", progress=False,
                     log=lambda s: None, engines=[eng], seed=1, load=True)
    assert "load study: 8 levels measured, 0 failed" in out, out
    rd = RunDir.open(world / "r" / "ld")
    assert rd.read_meta().status == "complete" and rd.read_meta().plan.runs == 0
    assert len(eng.started) == 8 and not rd.measurements()  # one server per strategy, level and round
    assert all("--metrics" in c.command for c in eng.started)
    results.write([rd.path], world / "RESULTS.md")
    text = (world / "RESULTS.md").read_text()
    assert "### Serving under load" in text and "| 1 | 40 | ngram-mod |" in text and (rd.path / "load.png").is_file()


def test_the_server_gets_metrics_once():
    m = mf.load(GEMMA, check_files=False)
    s = m.strategy("ngram-mod")
    assert "--metrics" in m.server_args and load_run.with_metrics(s, m) is s
    bare = replace(m, server_args=tuple(a for a in m.server_args if a != "--metrics"))
    assert load_run.with_metrics(s, bare).args.count("--metrics") == 1


def test_a_sweep_measures_synchronous_and_throughput_then_the_rates_between_from_the_baseline(tmp_path):
    m = mf.load(_with_load(tmp_path, {"rates": "sweep", "sweep_rates": 2, "requests": 3, "warmup": 0,
                                      "strategies": ["baseline", "ngram-mod"], "tasks": ["en-prose"], "rounds": 1}))
    m = replace(m, endpoint="completion")
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    ctx = Context("run", m, "img", "cpu", {"local": {"target": Path("/m/gemma.gguf")}}, lambda e, w: None)
    assert load_run.draw(ctx, _StubEngine(), rd, log=lambda s: None) == {"ok": 8, "failed": 0, "skipped": 0}
    levels = store.read(rd.path)
    assert [x["entry"] for x in levels[:2]] == ["baseline", "ngram-mod"] and levels[0]["mode"] == "synchronous"
    base = {x["mode"]: judged.achieved(x).request_rate for x in levels if x["entry"] == "baseline"
            and x["mode"] != "rate"}
    between = sorted({x["offered_rate"] for x in levels if x["mode"] == "rate"})
    assert len(between) == 2 and base["synchronous"] < between[0] < between[1] < base["throughput"]
    sync = next(x for x in levels if x["mode"] == "synchronous")["requests"]
    assert all(b["sent_s"] >= a["sent_s"] + a["e2el_s"] - 1e-3 for a, b in zip(sync, sync[1:], strict=False))


def test_the_committed_load_run_states_each_levels_achieved_rate_and_says_only_what_its_marks_show():
    """results/load-gemma3-270m (the manifest above, measured on this kind of 2-core machine): every planned
    (arm, level, round) is a line of load.jsonl with its achieved send rate; RESULTS.md's section has a row per
    arm and level with the rate sent, the plot, and a crossover sentence per arm and figure that the table's marks
    bear out."""
    import re

    run = ROOT / "results" / "load-gemma3-270m"
    levels = store.read(run)
    s = mf.load(GEMMA).load
    arms = [a.id for a in load_block.arms(s, mf.load(GEMMA).strategies)]
    got = {(x["strategy"], x["level"], x["round"]) for x in levels}
    assert got == {(a, lv, r) for a in arms for lv in s.level_names() for r in range(1, 4)}
    assert all(x["status"] == "ok" and len(x["requests"]) == s.requests for x in levels)
    assert all(judged.achieved(x).send_rate > 0 for x in levels)
    text = (ROOT / "RESULTS.md").read_text(encoding="utf-8").split("## Run load-gemma3-270m", 1)[1]
    text = text.split("\n## ", 1)[0]
    assert "(complete, the load study alone)" in text and "0 ok, 0 failed of 0 planned" not in text
    assert "![goodput and p99 TPOT against the offered rate, 95% intervals](results/load-gemma3-270m/load.png)" in text
    rows = [ln.split(" | ") for ln in text.splitlines() if re.match(r"\| [14] \| ", ln)]
    assert len(rows) == len(arms) * len(s.level_names())
    marks: dict[tuple[str, str], dict[float, str]] = {}
    for r in rows:
        assert re.fullmatch(r"\d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\]", r[3]), r  # sent (req/s), with its interval
        assert not re.search(r"\[-", r[5]), r  # a goodput's interval stops at 0
        for figure, cell in zip(("goodput", "p99 TPOT"), (r[11], r[13].rstrip(" |")), strict=True):
            mark = "▲" if cell.endswith("▲") else "▼" if cell.endswith("▼") else ""
            marks.setdefault((r[2], figure), {})[float(r[1])] = mark
    said = re.findall(r"^- \**(\S+), (goodput|p99 TPOT): (.*)$", text, re.M)
    speculative = [a for a in arms if not a.startswith("baseline")]
    assert sorted((a, f) for a, f, _ in said) == sorted((a, f) for a in speculative for f in ("goodput", "p99 TPOT"))
    for arm, figure, words in said:
        by_rate = marks[(arm, figure)]
        if "no level marked either way" in words:
            assert set(by_rate.values()) == {""}, (arm, figure, by_rate)
        elif m := re.search(r"speculation better up to ([\d.]+) req/s", words):
            up_to = float(m.group(1))
            assert by_rate[up_to] == "▲" and "▼" not in by_rate.values(), (arm, figure, by_rate)
        else:
            lo, hi = map(float, re.search(r"between ([\d.]+) and ([\d.]+) req/s", words).groups())
            assert by_rate[lo] == "▲" and by_rate[hi] == "▼", (arm, figure, by_rate)
    # the terminal after `invoke report` says the same, one line per arm and figure
    from harness.report import load as load_report

    said_there = load_report.terminal(run, run.name).splitlines()
    assert said_there[0].startswith("load-gemma3-270m: load study, 6 arms, 54 levels on fresh servers")
    assert [ln.strip() for ln in said_there[1:]] == [f"{a}, {f}: {w}".replace("**", "") for a, f, w in said]
