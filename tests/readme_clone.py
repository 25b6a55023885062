"""A fresh clone of this repository's HEAD with its own venv, where the README's commands run as written.

The clone is a `git clone` of HEAD (commit first) in a temporary folder; its venv is made with
--system-site-packages, so `pip install -e` installs the clone there and never repoints this machine's `harness`.
Runs are bounded the way a user would: `INVOKE_SPECBENCH_RUNS=1` (invoke.yaml's specbench.runs), and 2 for the
set-up's demo, whose run is also the one the run and report tests read (conftest's `setup_run`, `demo_run`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import LABEL_PREFIX, ROOT
from harness.hosts.engine import connect

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


def without_comment(line: str) -> str:
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


@dataclass(frozen=True)
class SetupRun:
    """The README set-up's first command run once in the clone: what it printed, the run folder it made, when."""

    command: str
    out: str
    run: Path
    started: float
    left: list  # the kit's containers the command left behind (looked at as soon as it returned)


def kit_containers_left(run_id: str, since: float) -> list[dict[str, str]]:
    """The labels of every container of the run, and of the kit's short-lived helpers (version check, probe)
    started since `since`, still on the engine; a helper another process on this engine is using is given a moment
    to go."""
    client = connect()
    left = [c.labels for c in client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.run={run_id}"})]
    deadline = time.monotonic() + 15
    since_iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since))
    while True:
        helpers = [c for role in ("version", "probe")
                   for c in client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.role={role}"})
                   if c.attrs.get("Created", "") >= since_iso]
        if not helpers or time.monotonic() > deadline:
            break
        time.sleep(1)
    return left + [c.labels for c in helpers]
