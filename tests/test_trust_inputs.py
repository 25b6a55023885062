"""What a run folder, a manifest or a host says is checked and shown, never acted on: terminal escapes are shown
as escapes, numbers that would overflow and YAML that says two things are one line, a record of something the
run did not plan is not counted, and the pre-flight rules that need no image run before any build."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError
from harness import formatter as fm
from harness.analysis import compare as cmp
from harness.intake import manifest as mf
from harness.models import generate
from harness.report import compare as compare_words
from harness.report import results as rp
from harness.run import doctor as doc
from harness.run import plan as pl
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest
from tests.crafted import DEMO_RUN, one_line

DEMO_RAW = yaml.safe_load(DEMO.read_text())
#: Set the window title, erase the line, return to its start, print a fake verdict, conceal what follows.
ESCAPES = "Xeon\x1b]0;pwned\x07\x1b[2K\rverdict: reproduces\x1b[8m\x9b2J\u202e"


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)


def _forged_run(folder: Path, edit=None, name: str = "forged", raw_lines=None) -> Path:
    """A copy of the committed demo run, run.json and records edited (or the records' lines replaced)."""
    run = folder / name
    shutil.copytree(DEMO_RUN, run)
    meta = RunDir(run).read_meta().to_json()
    records = [json.loads(x) for x in (run / "measurements.jsonl").read_text().splitlines() if x.strip()]
    if edit is not None:
        edit(meta, records)
    (run / "run.json").write_text(json.dumps(meta))
    lines = [json.dumps(r) for r in records]
    if raw_lines is not None:
        lines = raw_lines(lines)
    (run / "measurements.jsonl").write_text("".join(x + "\n" for x in lines))
    return run


def _env(meta: dict) -> dict:
    return next(iter(meta["environment"].values()))


# ---------------------------------------------------------------- escapes are shown, never sent


def test_console_and_markdown_show_every_escape():
    for shown in (fm.console(ESCAPES), fm.md(ESCAPES), fm.code(ESCAPES), fm.visible(ESCAPES)):
        assert not any(ord(c) < 32 or 127 <= ord(c) < 160 or c == "\u202e" for c in shown), repr(shown)
        assert "x1b" in shown and "pwned" in shown and "u202e" in shown
    assert fm.console("a\nb") == "a\\nb" and fm.console_lines("a\nb\x1b") == "a\nb\\x1b"
    assert fm.console("plain text, ünïcode, 中文") == "plain text, ünïcode, 中文"


def test_compare_shows_escapes_from_a_run_folder_and_fakes_no_verdict(sandbox):
    a = _forged_run(sandbox.work, name="a")
    b = _forged_run(sandbox.work, lambda m, r: _env(m).update(cpu_model=ESCAPES), name="b")
    text = compare_words.text(cmp.compare(a, b))
    assert not any(ord(c) < 32 and c != "\n" for c in text) and "\x9b" not in text and "\u202e" not in text
    assert "\\x1b]0;pwned\\x07\\x1b[2K\\rverdict: reproduces" in text
    verdicts = [ln for ln in text.splitlines() if ln.startswith("verdict")]
    assert verdicts == [text.splitlines()[-1]]  # the fake verdict stays inside its value's line
    out = sandbox.work / "R.md"
    res = _invoke("compare", str(a), str(b), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\r" not in res.stdout
    md = out.read_text()
    assert "\x1b" not in md and "\x07" not in md and "\r" not in md and "\\x1b]0;pwned" in md


def test_doctor_lines_and_errors_show_escapes(sandbox):
    line = doc.Item("gpu", False, f"nvidia-smi says {ESCAPES}", f"fix {ESCAPES}").line()
    assert "\x1b" not in line and line.count("\n") == 1 and "\\x1b]0;pwned" in line
    res = _invoke("validate", "--manifest", str(sandbox.work / "m\x1b]0;pwned\x07.yaml"))
    assert res.returncode == 1 and "\x1b" not in res.stderr and "\\x1b]0;pwned\\x07" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- numbers that overflow, literals that are not JSON


@pytest.mark.parametrize("case,edit,expected", [
    ("1e308 tok/s", lambda lines: [lines[0].replace('"decode_tok_s":', '"decode_tok_s": 1e308, "x":', 1)] + lines[1:],
     "client.decode_tok_s: 1e+308 is not a finite number within ±1e+15"),
    ("Infinity", lambda lines: [lines[0].replace('"decode_s":', '"decode_s": Infinity, "x":', 1)] + lines[1:],
     "client.decode_s: inf is not a finite number"),
    ("NaN", lambda lines: [lines[0].replace('"ttft_s":', '"ttft_s": NaN, "x":', 1)] + lines[1:],
     "client.ttft_s: nan is not a finite number"),
    ("-Infinity index", lambda lines: [lines[0].replace('"run_index":', '"run_index": -Infinity, "x":', 1)] + lines[1:],
     "run_index: -inf is not a finite number"),
])
def test_numbers_that_would_overflow_are_one_line(sandbox, case, edit, expected):
    run = _forged_run(sandbox.work, raw_lines=edit)
    for fn in (lambda: rp.write([run], sandbox.work / "R.md", plot=False),
               lambda: cmp.compare(DEMO_RUN, run)):
        with pytest.raises(KitError) as e:
            fn()
        one_line(e, "measurements.jsonl: line 1", expected)


def test_a_run_json_with_nan_bandwidth_is_one_line(sandbox):
    run = _forged_run(sandbox.work)
    text = (run / "run.json").read_text()
    (run / "run.json").write_text(text.replace('"memory_bandwidth_gbs": ', '"memory_bandwidth_gbs": NaN, "x": ', 1))
    with pytest.raises(KitError) as e:
        rp.write([run], sandbox.work / "R.md", plot=False)
    one_line(e, "run.json", "is not a finite number")


# ---------------------------------------------------------------- YAML and patterns that say two things


def _yaml(folder: Path, text: str) -> Path:
    return write_manifest(folder, text, "m.yaml")


#: The demo manifest's line of `runs:` (the duplicate is inserted above it).
RUNS_LINE = next(i for i, line in enumerate(DEMO.read_text().splitlines(), 1) if line.startswith("runs: "))


@pytest.mark.parametrize("case,change,expected", [
    ("duplicate key", lambda t: t.replace("runs: ", "runs: 1\nruns: ", 1), f"line {RUNS_LINE + 1}, column 1: invalid "
     f"YAML: key 'runs' is given twice in this mapping (also line {RUNS_LINE}); give each key once"),
    (".nan bandwidth", lambda t: t.replace("memory_bandwidth_gbs: 200", "memory_bandwidth_gbs: .nan"),
     "line 12, column 25: invalid YAML: '.nan' is not a finite number"),
    (".nan temperature", lambda t: t.replace("temperature: 0", "temperature: .NaN"), "'.NaN' is not a finite number"),
    (".inf timeout", lambda t: t.replace("load_s: 60", "load_s: -.inf"), "'-.inf' is not a finite number"),
])
def test_yaml_that_says_two_things_or_nothing_is_one_line(sandbox, case, change, expected):
    text = DEMO.read_text()
    assert change(text) != text, case
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_yaml(sandbox.work, change(text)))
    one_line(e, "m.yaml: ", expected)


@pytest.mark.parametrize("field,set_value", [
    ("name", lambda r: r.update(name="demo\n")),
    ("strategies[0].id", lambda r: r["strategies"][0].update(id="baseline\n")),
    ("tasks[0].id", lambda r: r["tasks"][0].update(id="zh-prose\n")),
    ("models.target.file", lambda r: r["models"]["target"].update(file="tiny-target.gguf\n")),
    ("models.target.sha256", lambda r: r["models"]["target"].update(sha256=r["models"]["target"]["sha256"] + "\n")),
    ("llama_cpp.identity.commit", lambda r: r["llama_cpp"]["identity"].update(commit="b11434\n")),
    ("build.cuda_architectures", lambda r: r["build"].update(cuda_architectures="121\n")),
    ("hardware.name", lambda r: r["hardware"].update(name="box\n")),
    ("strategies[1].label", lambda r: r["strategies"][1].update(label="x\n")),
])
def test_a_trailing_newline_does_not_satisfy_a_pattern(sandbox, field, set_value):
    raw = copy.deepcopy(DEMO_RAW)
    set_value(raw)
    with pytest.raises(mf.ManifestError) as e:
        mf.load(_yaml(sandbox.work, yaml.safe_dump(raw, allow_unicode=True)))
    one_line(e, f"{field}: ", "\\n' does not match")


# ---------------------------------------------------------------- a record of what the run did not plan


@pytest.mark.parametrize("case,edit,expected", [
    ("unknown strategy", lambda m, r: r[5].update(strategy="ghost"), "line 6: strategy 'ghost' is not one the run"),
    ("unknown task", lambda m, r: r[0].update(task="ghost"), "line 1: task 'ghost' is not one the run planned"),
    ("unknown host", lambda m, r: r[0].update(host="elsewhere"), "line 1: host 'elsewhere' is not one the run"),
    ("unknown prompt", lambda m, r: r[0].update(prompt="ghost"), "line 1: prompt 'ghost' is not one the run"),
    ("another spec type", lambda m, r: r[0].update(spec_type="draft-mtp"), "has spec type 'draft-mtp' here and"),
])
def test_a_record_of_what_the_run_did_not_plan_is_not_counted(sandbox, case, edit, expected):
    run = _forged_run(sandbox.work, edit)
    with pytest.raises(KitError) as e:
        RunDir(run).measurements()
    one_line(e, "measurements.jsonl: ", expected, "this record is not of this run")
    with pytest.raises(KitError):
        rp.write([run], sandbox.work / "R.md", plot=False)
    assert len(RunDir(DEMO_RUN).measurements()) == 288  # the committed run: every record planned


# ---------------------------------------------------------------- pre-flight before any build; what validate skipped


class Untouchable:
    """An engine the run must not use: the pre-flight that needs no image comes first."""

    name = "local"

    def __getattr__(self, attr: str):
        raise AssertionError(f"the engine was used ({attr}) before the pre-flight refused the files")


def _foreign_draft_manifest(folder: Path) -> Path:
    raw = copy.deepcopy(DEMO_RAW)
    raw["models"] = {"target": raw["models"]["target"],
                     "foreign": {"file": "tiny-foreign.gguf", "generate": {"kind": "tiny-foreign", "seed": 7}}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "wrong", "spec_type": "draft-simple", "draft": "foreign"}]
    return write_manifest(folder, yaml.safe_dump(raw))


def test_a_wrong_drafter_is_refused_before_any_image_is_built(sandbox):
    path = _foreign_draft_manifest(sandbox.work / "m")
    with pytest.raises(KitError) as e:
        runner.run(trusted(path), results_dir=sandbox.work / "results", models_dir=sandbox.work / "models",
                   engines=[Untouchable()], log=lambda s: None, progress=False)
    one_line(e, "checked before any build; nothing was started", "strategies wrong: models.foreign",
             "token ids must mean the same in both")
    assert not (sandbox.work / "results").exists()


def test_validate_names_each_check_it_could_not_run(sandbox):
    path = _foreign_draft_manifest(sandbox.work / "m")
    models = sandbox.work / "models"
    text = pl.render(mf.load(path), models)
    head, _, skipped = text.partition("not checked yet:\n")
    assert "valid (" in head and "2 check(s) not run, named below" in head
    assert "strategies baseline, wrong: the model files against their spec types (GGUF headers): models.target " \
           f"({models / 'tiny-target.gguf'}) is not there yet" in skipped
    assert "the pinned sha256 of models target" in skipped
    generate.write_tiny(models / "tiny-target.gguf", "tiny-target", 7)
    with pytest.raises(KitError) as e:  # only the target there: the drafter's check is named as skipped
        text = pl.render(mf.load(path), models)
        assert "strategies wrong: the model files against their spec types (GGUF headers): models.foreign" in text
        generate.write_tiny(models / "tiny-foreign.gguf", "tiny-foreign", 7)
        pl.render(mf.load(path), models)  # both there: the check runs and refuses
    one_line(e, "strategies wrong: models.foreign", "token ids must mean the same in both")
    res = _invoke("validate", "--manifest", str(path), "--models-dir", str(sandbox.work / "none"))
    assert res.returncode == 0 and "not checked yet:" in res.stdout and "check(s) not run" in res.stdout
