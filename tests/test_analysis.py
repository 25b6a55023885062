"""The analysis stages on committed run folders, without Docker: summary.json and RESULTS.md regenerate byte for
byte; old formats stay readable; compare's verdicts; the typed run metadata."""

from __future__ import annotations

import copy
import json
import re
import shutil
import types
import typing

import pytest

from harness import ROOT, KitError, schema
from harness.analysis import compare as cmp
from harness.analysis.reproduction import Call, Match
from harness.analysis.summary import summarize
from harness.report import compare as compare_words
from harness.report import results as rp
from harness.store import result, shapes
from harness.store.buildrecord import BuildRecord
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta

COMMITTED = re.findall(r"^## Run (\S+)$", (ROOT / "RESULTS.md").read_text(encoding="utf-8"), re.M)


def _copy_runs(tmp_path):
    out = []
    for run_id in COMMITTED:
        run_id = run_id.replace("\\", "")
        shutil.copytree(ROOT / "results" / run_id, tmp_path / "results" / run_id)
        out.append(tmp_path / "results" / run_id)
    return out


def test_committed_results_md_and_summaries_regenerate_byte_for_byte(tmp_path, monkeypatch):
    assert COMMITTED, "RESULTS.md names no run"
    dirs = _copy_runs(tmp_path)
    monkeypatch.chdir(tmp_path)
    rp.write([d.relative_to(tmp_path) for d in dirs], tmp_path / "RESULTS.md")
    assert (tmp_path / "RESULTS.md").read_text(encoding="utf-8") == (ROOT / "RESULTS.md").read_text(encoding="utf-8")
    for d in dirs:
        assert (d / "summary.json").read_bytes() == (ROOT / "results" / d.name / "summary.json").read_bytes()
        if RunDir.open(d).read_meta().plan.measurements:  # a sampling study drawn alone draws no speedup plot
            assert (d / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_links_the_plot_relative_to_the_report(tmp_path):
    dirs = _copy_runs(tmp_path)
    out = tmp_path / "elsewhere" / "deeper" / "R.md"
    rp.write(dirs[:1], out)
    link = re.search(r"!\[[^\]]*\]\(([^)]+)\)", out.read_text()).group(1)
    assert (out.parent / link).resolve() == (dirs[0] / "plot.png").resolve()


def test_summary_of_committed_demo_is_schema_valid_and_complete():
    rd = RunDir.open(ROOT / "results" / "demo-cpu")
    s = summarize(rd)
    assert schema.errors("summary", s) == []
    meta = rd.read_meta()
    assert s["measurements"]["ok"] == meta.plan.measurements and not s["missing"]
    assert {c["strategy"] for c in s["cells"]} == set(meta.plan.strategies)
    speculative = [c for c in s["cells"] if meta.strategy(c["strategy"]).speculative]
    assert speculative and all(c["speedup"] is not None for c in speculative)


def test_every_check_says_that_it_ran_also_when_it_finds_nothing(tmp_path):
    """The committed demo flags no contamination: its report still says what the check compared (cells, draft
    counts and outputs), and so do determinism, physics and interference; the naive run's line says what fired."""
    dirs = _copy_runs(tmp_path)
    demo = next(d for d in dirs if d.name == "demo-cpu")
    naive = next(d for d in dirs if d.name == "real-gemma3-270m-naive")
    rp.write([demo, naive], tmp_path / "R.md", plot=False)
    text = (tmp_path / "R.md").read_text(encoding="utf-8")
    s = summarize(RunDir.open(demo))
    assert [x["check"] for x in s["checks_ran"]] == ["contamination", "determinism", "physics", "interference"]
    assert not any(c["checks"]["contamination"]["flagged"] for c in s["cells"])
    cells = len(s["cells"])
    line = (f"- contamination: {cells} cells checked over {sum(c['runs_ok'] for c in s['cells'])} runs in fresh "
            f"containers: draft counts and outputs compared run over run, identical in {cells} of {cells}")
    assert line in text and "nothing flagged" in text.split(line)[1].splitlines()[0]
    assert "- determinism: outputs of 10 speculative strategies compared byte by byte" in text
    assert "- physics: 96 cells' tok/s held against the memory-bandwidth roofline" in text and "none above it" in text
    assert "- interference: other work on the host measured during 288 timed requests: 1 disturbed" in text
    assert "- contamination: the naive protocol (one server per strategy): all 4 cells flagged" in text


def test_a_new_check_is_one_row_of_the_registry_and_says_that_it_ran(tmp_path, monkeypatch):
    """A throwaway check added as one row of summary.CHECKS_RAN: summary.json lists it after the four, schema-valid,
    and RESULTS.md prints its sentence with theirs."""
    from harness.analysis import summary as sm

    def tokens_ran(cells, interference, meta):
        n = sum(c["runs_ok"] for c in cells)
        return 0, f"tokens: {n} runs' outputs counted, nothing flagged"

    monkeypatch.setattr(sm, "CHECKS_RAN", (*sm.CHECKS_RAN, ("tokens", tokens_ran)))
    demo = next(d for d in _copy_runs(tmp_path) if d.name == "demo-cpu")
    s = summarize(RunDir.open(demo))
    assert [x["check"] for x in s["checks_ran"]] == ["contamination", "determinism", "physics", "interference",
                                                      "tokens"]
    assert schema.errors("summary", s) == []
    rp.write([demo], tmp_path / "R.md", plot=False)
    runs = sum(c["runs_ok"] for c in s["cells"])
    assert f"- tokens: {runs} runs' outputs counted, nothing flagged" in (tmp_path / "R.md").read_text()


def test_run_json_round_trips_through_the_typed_reader(tmp_path):
    meta = RunDir.open(ROOT / "results" / "demo-cpu").read_meta()
    again = RunMeta.from_json(json.loads(json.dumps(meta.to_json())), "x")
    assert again == meta
    assert again.baselines() == [s.id for s in again.planned_strategies() if not s.speculative]


#: Fields an earlier kit wrote under another name (a task's `probe` is read as `perturbation`).
RENAMED = {"probe": "perturbation"}


def _within(said, kept, at="run.json") -> None:
    """Everything `said` holds is in `kept` with the same value (`kept` may add fields a later kit writes)."""
    if isinstance(said, dict):
        assert isinstance(kept, dict), at
        for k, v in said.items():
            name = RENAMED.get(k, k) if k not in kept else k
            assert name in kept, f"{at}.{k} was lost"
            _within(v, kept[name], f"{at}.{k}")
    elif isinstance(said, list):
        assert isinstance(kept, list) and len(kept) == len(said), at
        for i, (a, b) in enumerate(zip(said, kept, strict=True)):
            _within(a, b, f"{at}[{i}]")
    else:
        assert said == kept and type(said) is type(kept), f"{at}: {said!r} became {kept!r}"


@pytest.mark.parametrize("run", sorted(p.parent.name for p in (ROOT / "results").glob("*/run.json")))
def test_every_committed_run_json_is_kept_whole_by_the_typed_records(run):
    """The typed records (manifest, hardware, sampling, models, build, hosts, bandwidth, plan, sampling study) hold
    all that a committed run.json says, and what they write is read back as the same bytes."""
    path = ROOT / "results" / run / "run.json"
    said = json.loads(path.read_text())
    meta = RunMeta.from_json(said, str(path))
    written = json.dumps(meta.to_json(), indent=2, ensure_ascii=False)
    _within(said, json.loads(written))
    assert json.dumps(RunMeta.from_json(json.loads(written), "again").to_json(), indent=2, ensure_ascii=False) \
        == written
    build = json.loads((path.parent / "build.json").read_text())
    assert BuildRecord.from_json(build, "build.json").to_json() == build == meta.build.to_json()


def _fits(value, tp, where: str) -> None:
    """`value` has the shape the annotation `tp` says: a TypedDict's required keys and no others, recursively
    through lists, str-keyed dicts and optional values; other annotations are not looked into."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):  # one of them (a check's data: the shape of its kind)
        if value is None and type(None) in args:
            return
        errors = []
        for member in args:
            if member is type(None):
                continue
            try:
                return _fits(value, member, where)
            except AssertionError as e:
                errors.append(e)
        raise errors[0]
    elif typing.is_typeddict(tp):
        assert isinstance(value, dict), where
        assert set(value) <= set(tp.__annotations__), f"{where}: {sorted(set(value) - set(tp.__annotations__))}"
        assert tp.__required_keys__ <= set(value), f"{where}: {sorted(tp.__required_keys__ - set(value))}"
        hints = typing.get_type_hints(tp)
        for k, v in value.items():
            _fits(v, hints[k], f"{where}.{k}")
    elif origin is list:
        for i, v in enumerate(value):
            _fits(v, args[0], f"{where}[{i}]")
    elif origin is dict:
        for k, v in value.items():
            _fits(v, args[1], f"{where}.{k}")


def test_summary_shapes_are_the_schema_and_what_summarize_writes():
    """harness/store/shapes.py names the keys the schema names, and every committed run's summary fits it."""
    sch = json.loads((ROOT / "schemas" / "summary.schema.json").read_text())
    assert set(shapes.Summary.__annotations__) == set(sch["properties"])
    assert set(sch["required"]) <= shapes.Summary.__required_keys__
    cell = sch["properties"]["cells"]["items"]
    assert set(cell["properties"]) <= set(shapes.CellSummary.__annotations__)
    assert set(cell["required"]) <= shapes.CellSummary.__required_keys__
    assert set(shapes.Described.__annotations__) == set(sch["$defs"]["stats"]["properties"])
    runs = sorted(p.parent for p in (ROOT / "results").glob("*/run.json"))
    assert len(runs) >= 7
    for run in runs:
        _fits(summarize(RunDir.open(run)), shapes.Summary, run.name)
    for run in (runs[0], ROOT / "results" / "real-gemma3-270m-distribution"):
        _fits(cmp.compare(run, run).as_dict(), shapes.CompareJson, f"compare.json of {run.name}")
    with pytest.raises(AssertionError, match=r"demo-cpu.cells\[0\]: \['speed'\]"):  # the check can fail
        s = summarize(RunDir.open(ROOT / "results" / "demo-cpu"))
        s["cells"][0]["speed"] = 1.0
        _fits(s, shapes.Summary, "demo-cpu")


def test_the_measurement_record_shape_is_the_schema_and_what_the_runs_hold():
    """harness/store/result.py names the keys schemas/result.schema.json names, and every record of every committed
    run (the demo's, the real model's, a sweep's, a reused server's, several builds') fits it."""
    sch = json.loads((ROOT / "schemas" / "result.schema.json").read_text())
    assert set(result.ResultRecord.__annotations__) == set(sch["properties"])
    assert set(sch["required"]) <= result.ResultRecord.__required_keys__
    for part, tp in (("failure", result.Failure), ("timing", result.Timing), ("client", result.ClientFigures),
                     ("server", result.ServerFigures), ("output", result.Output), ("quiet", result.Quiet),
                     ("interference", result.Interference), ("concurrency", result.Concurrency),
                     ("slots", result.Slots), ("server_log", result.ServerLogFacts), ("device", result.DeviceLoad)):
        assert set(sch["properties"][part]["properties"]) == set(tp.__annotations__), part
    samples = json.loads((ROOT / "schemas" / "samples.schema.json").read_text())
    assert set(result.BatchRecord.__annotations__) == set(samples["properties"])
    assert set(samples["properties"]["samples"]["items"]["properties"]) == set(result.Sample.__annotations__)
    seen, batches = 0, 0
    for run in sorted(p.parent for p in (ROOT / "results").glob("*/run.json")):
        for i, rec in enumerate(RunDir.open(run).measurements()):
            _fits(rec, result.ResultRecord, f"{run.name} record {i}")
            seen += 1
        for i, rec in enumerate(RunDir.open(run).samples()):
            _fits(rec, result.BatchRecord, f"{run.name} batch {i}")
            batches += 1
    assert seen > 500 and batches > 10


def test_format_1_run_folder_is_read_through_its_upgrade(tmp_path):
    """A run folder written in format 1 (run.json kept only the manifest text; 12 of its records) still reads."""
    d = ROOT / "tests" / "data" / "format1-run"
    assert json.loads((d / "run.json").read_text())["format_version"] == 1
    rd = RunDir.open(d)
    meta = rd.read_meta()
    assert meta.strategy("draft-simple").baseline == "baseline" and meta.strategy("baseline").baseline is None
    assert [p.id for p in meta.task("long-ctx").prompts] == ["long-ctx"] and meta.task("long-ctx").prompts[0].sha256
    recs = rd.measurements()
    assert len(recs) == 12 and all(r["format_version"] == 2 and r["prompt"] == r["task"] for r in recs)
    s = summarize(rd)
    assert schema.errors("summary", s) == [] and len(s["missing"]) > 0


def test_newer_or_broken_formats_are_one_line(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "demo-cpu", d)
    obj = json.loads((d / "run.json").read_text())
    newer = dict(obj, format_version=99)
    (d / "run.json").write_text(json.dumps(newer))
    with pytest.raises(KitError, match="format_version 99 is newer than this kit reads"):
        RunDir.open(d).read_meta()
    (d / "run.json").write_text("[1, 2]")
    with pytest.raises(KitError, match="expected a JSON object, got list"):
        RunDir.open(d).read_meta()
    (d / "run.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(KitError, match="not UTF-8"):
        RunDir.open(d).read_meta()


def test_torn_last_line_is_named_not_silently_dropped(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "demo-cpu", d)
    lines = (d / "measurements.jsonl").read_text().splitlines()
    (d / "measurements.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])
    rd = RunDir.open(d)
    assert len(rd.measurements()) == len(lines) - 1 and rd.torn_last_line
    s = summarize(rd)
    assert s["measurements"]["torn_last_line"] is True
    rp.write([d], tmp_path / "R.md", plot=False)
    assert "cut short" in (tmp_path / "R.md").read_text()
    # a bad line in the middle is an error naming it
    (d / "measurements.jsonl").write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(KitError, match="line 2: not valid JSON"):
        RunDir.open(d).measurements()


def _fake_meta_pair(tmp_path):
    """A and a B with the same figures in measurements of its own (other containers): a replicate, not A itself."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(ROOT / "results" / "demo-cpu", a)
    shutil.copytree(ROOT / "results" / "demo-cpu", b)
    recs = [json.loads(x) for x in (b / "measurements.jsonl").read_text().splitlines() if x.strip()]
    (b / "measurements.jsonl").write_text("".join(json.dumps({**r, "container_id": f"b{r.get('container_id')}"})
                                                  + "\n" for r in recs))
    return a, b


def test_compare_of_a_run_with_itself_has_identical_fingerprints_and_no_difference(tmp_path):
    a, _ = _fake_meta_pair(tmp_path)
    res = cmp.compare(a, a)
    assert isinstance(res, cmp.Comparison) and res.differences == []
    # B's records are A's: said so, and never called a reproduction (nor an inconclusive one)
    assert res.same_records and res.call is Call.NOT_COMPARABLE and not res.comparable
    assert res.verdict.startswith("not a reproduction: B's records are A's (the same 288 measurements")
    judged = [r for r in res.rows if r.call not in (Call.BASELINE, Call.MISSING)]
    assert judged and all(r.call in (Call.REPRODUCES, Call.INCONCLUSIVE) for r in judged)
    assert all(res.row_call(r) is Call.NOT_COMPARABLE for r in judged)
    assert all(r.fingerprint is Match.IDENTICAL for r in res.rows)
    assert all(r.ratio == pytest.approx(1.0) for r in judged)
    # Three rounds a side are too few for ±5%: the judgement underneath says so.
    assert res.reproduction.call is Call.INCONCLUSIVE
    text = compare_words.text(res)
    assert "never judged" in text and "judged as one family" in text and "geomean" in text
    assert "within ±10% (the cell margin)" in text and "one estimator" in text
    assert "records: B's 288 measurements are A's own" in text
    # compare.json: the same judgement as plain data
    d = json.loads(json.dumps(res.as_dict()))
    assert d["call"] == "not comparable" and d["verdict"] == res.verdict and d["cell_margin"] == pytest.approx(0.1)
    assert d["shared_records"] == [288, 288]
    assert len(d["rows"]) == len(res.rows) and d["unresolved"] == len(res.reproduction.unresolved) > 0
    assert d["worst"]["strategy"] == res.reproduction.worst.strategy
    assert {r["verdict"] for r in d["rows"]} <= {"n/a", "not comparable"}


def test_compare_names_blocking_differences_by_field(tmp_path):
    a, b = _fake_meta_pair(tmp_path)
    obj = json.loads((b / "run.json").read_text())
    obj = copy.deepcopy(obj)
    obj["models"]["target"]["sha256"] = "0" * 64
    obj["environment"]["local"]["cpu_model"] = "Other CPU"
    (b / "run.json").write_text(json.dumps(obj))
    res = cmp.compare(a, b)
    fields = {d.field: d.blocking for d in res.differences}
    assert fields == {"model target sha256": True, "hardware": False}
    assert not res.comparable and res.call is Call.NOT_COMPARABLE and res.verdict.startswith("not comparable")
    assert {res.row_call(r) for r in res.rows} <= {Call.NOT_COMPARABLE, Call.BASELINE}
    assert {r["verdict"] for r in res.as_dict()["rows"]} <= {"not comparable", "n/a"}


def test_compare_on_other_hardware_judges_speedups_not_tok_s(tmp_path):
    """B is the same run on a machine twice as fast: tok/s doubles, speedups and fingerprints do not change."""
    a, b = _fake_meta_pair(tmp_path)
    lines = []
    for ln in (b / "measurements.jsonl").read_text().splitlines():
        r = json.loads(ln)
        if r["client"].get("decode_tok_s"):
            r["client"]["decode_tok_s"] *= 2
        lines.append(json.dumps(r))
    (b / "measurements.jsonl").write_text("\n".join(lines) + "\n")
    res = cmp.compare(a, b)
    judged = [r for r in res.rows if r.call not in (Call.BASELINE, Call.MISSING)]
    assert all(r.ratio == pytest.approx(1.0) and r.tok_s_ratio == pytest.approx(2.0, rel=1e-3) for r in judged)
    assert "differs" not in res.counts()


def test_compare_cell_margin_decides_which_cells_reproduce(tmp_path):
    """The committed demo against itself at ±15%: its noisiest cells' B/A intervals reach past the default ±30%,
    so only the geometric means reproduce and the worst cell is named; a cell margin wider than every cell's
    interval lets the verdict reproduce (save the cells that have no interval)."""
    a, b = _fake_meta_pair(tmp_path)
    res = cmp.compare(a, b, 0.15)
    assert res.call is Call.GEOMEANS_REPRODUCE and res.cell_margin == pytest.approx(0.30)
    worst = res.reproduction.worst
    assert worst.reach is not None and worst.reach > 0.30
    assert res.verdict.startswith(f"geometric means reproduce; {len(res.reproduction.unresolved)} cells "
                                  f"unresolved (worst {worst.strategy} / {worst.task} B/A 1.00x")
    wide = cmp.compare(a, b, 0.15, 10.0)
    assert [r.task for r in wide.reproduction.unresolved if r.reach is not None] == []
    assert all(r.est is None for r in wide.reproduction.unresolved)  # the json-out cells: too few rounds


def test_compare_pairs_every_host():
    assert cmp.host_pairs(["a", "b"], ["b", "a"]) == [("a", "a"), ("b", "b")]
    assert cmp.host_pairs(["local"], ["me@spark"]) == [("local", "me@spark")]
    assert cmp.host_pairs(["x", "y"], ["p", "q"]) == [("x", "p"), ("y", "q")]
