"""The whole `invoke run`: manifest, models, image, engines, plan, runner, in that order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness import KitError, build, models
from harness import manifest as mf
from harness.engine import Engine, LocalEngine
from harness.results import RunDir
from harness.runner import Runner, describe, make_plan


def run(manifest_path: Path, *, results_dir: Path, models_dir: Path, resume: str | None = None,
        run_id: str | None = None, strategies: list[str] | None = None, tasks: list[str] | None = None,
        runs: int | None = None, reuse_server: bool = False, seed: int | None = None, progress: bool = True,
        engines: list[Engine] | None = None, log: Callable[[str], None] = print) -> str:
    """Run (or resume) a manifest's matrix; return a one-paragraph summary of where the results are."""
    if resume:
        rd = RunDir.open(Path(resume) if Path(resume).is_dir() else Path(results_dir) / resume)
        meta = rd.read_meta()
        reuse_server = meta["protocol"] == "reuse-server"
        p = meta["plan"]
        strategies, tasks, runs, seed = p["strategies"], p["tasks"], p["runs"], p["shuffle_seed"]
        manifest = mf.load(manifest_path)
        if manifest.sha256 != meta["manifest"]["sha256"]:
            raise KitError(f"{manifest_path} changed since run {rd.run_id} started (sha256 "
                           f"{manifest.sha256[:12]} vs {meta['manifest']['sha256'][:12]}); "
                           "resume with the same manifest")
        build_record = meta["build"]
    else:
        manifest = mf.load(manifest_path)
        build_record = None
    engines = engines or [LocalEngine()]
    if build_record is None:
        for e in engines:
            rec = build.latest_record(manifest, host=e.name)
            if rec is None:
                where = "on this machine" if e.name == "local" else f"on {e.name}"
                flag = "" if e.name == "local" else f" --host {e.name}"
                raise KitError(f"no image built for manifest {manifest.name} {where}; run `invoke build{flag}` first")
            build_record = build_record or rec
    model_paths = models.ensure(manifest, models_dir, download=True, log=log)
    from harness.doctor import preflight

    for e in engines:
        preflight(e, manifest, models_dir)
    plan = make_plan(manifest, [e.name for e in engines], strategies=strategies, tasks=tasks, runs=runs,
                     shuffle_seed=seed)
    runner = Runner(manifest, engines, model_paths, build_record, log=log, progress=progress,
                    reuse_server=reuse_server)
    runner.check_image()
    if not resume:
        rd = runner.start(results_dir, plan, run_id)
    proto = "NAIVE reuse-server protocol (caches carry over)" if reuse_server else "one fresh container each"
    log(f"run {rd.run_id}: {describe(manifest, plan)}, {proto}; shuffle seed {plan.shuffle_seed}")
    try:
        counts = runner.execute(rd, plan)
    except KeyboardInterrupt:
        raise KitError(f"interrupted; finished measurements are saved in {rd.path}; "
                       f"resume with `invoke run --resume {rd.run_id}`") from None
    return (f"run {rd.run_id}: {counts['ok']} ok, {counts['failed']} failed"
            + (f", {counts['skipped']} already recorded" if counts["skipped"] else "")
            + f"; results in {rd.path}")
