"""`invoke run`: manifest, models, image, engines, plan, run folder, executor, in that order.

Each round runs every cell once, in an order shuffled with a recorded seed, so slow drift of the machine does not
land on one strategy. `reuse_server` runs the naive protocol on purpose (one server per strategy)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors

from harness import KitError, build, environment, models, probe, runmeta
from harness import manifest as mf
from harness.engine import Engine, LocalEngine
from harness.executor import Executor
from harness.plan import Plan, make_plan
from harness.protocol import PROTOCOLS, Context
from harness.results import RunDir, new_run_id


def _resume(results_dir: Path, resume: str, manifest_path: Path) -> tuple[RunDir, runmeta.RunMeta, mf.Manifest]:
    rd = RunDir.open(Path(resume) if Path(resume).is_dir() else Path(results_dir) / resume)
    meta = rd.read_meta()
    manifest = mf.load(manifest_path)
    if manifest.sha256 != meta.manifest["sha256"]:
        raise KitError(f"{manifest_path} changed since run {rd.run_id} started (sha256 {manifest.sha256[:12]} vs "
                       f"{meta.manifest['sha256'][:12]}); resume with the same manifest")
    return rd, meta, manifest


def _image(manifest: mf.Manifest, engines: list[Engine], build_missing: bool,
           log: Callable[[str], None]) -> dict[str, Any]:
    """The build record of the manifest's image, found on every engine by its identity (harness/images.py);
    built where it is missing unless `build_missing` is off."""
    from harness import images

    records: dict[str, dict[str, Any]] = {}
    for e in engines:
        rec = images.record(e.client, manifest, host=e.name)
        if rec is None:
            flag = "" if e.name == "local" else f" --host {e.name}"
            if not build_missing:
                raise KitError(f"no image of manifest {manifest.name}'s build (source, flags, backend) on {e.name}; "
                               f"run `invoke build --manifest {manifest.path}{flag}`, or drop --no-build")
            log(f"{e.name}: no image of this build yet; building it now, as `invoke build{flag}` would "
                "(minutes the first time)")
            rec = build.build(e, manifest, host=e.name, log=log)
        records[e.name] = rec
    tags = {r["tag"] for r in records.values()}
    if len(tags) > 1:
        which = ", ".join(f"{h}: {r['tag']}" for h, r in records.items())
        raise KitError(f"the hosts need different images ({which}; their architectures differ): run each host in "
                       "a run of its own")
    return next(iter(records.values()))


def check_image(engines: list[Engine], record: dict[str, Any], log: Callable[[str], None]) -> None:
    for e in engines:
        try:
            img = e.client.images.get(record["tag"])
        except docker.errors.ImageNotFound:
            raise KitError(f"image {record['tag']} is not on {e.name}; run `invoke build` first") from None
        if img.id != record["image_id"]:
            log(f"note: {e.name} has {record['tag']} as {img.id[:19]}, the build record says "
                f"{record['image_id'][:19]}; recording the engine's")


def _bandwidth(manifest: mf.Manifest, engines: list[Engine]) -> dict[str, Any] | None:
    measured = [p for p in (probe.latest(manifest.name, e.name) for e in engines) if p]
    if not measured:
        return None
    m = measured[0]
    return {"gbs": m["gbs"], "kind": m["kind"], "host": m["host"], "measured_at": m["measured_at"]}


def run(manifest_path: Path, *, results_dir: Path, models_dir: Path, resume: str | None = None,
        run_id: str | None = None, strategies: list[str] | None = None, tasks: list[str] | None = None,
        runs: int | None = None, reuse_server: bool = False, seed: int | None = None, progress: bool = True,
        engines: list[Engine] | None = None, log: Callable[[str], None] = print, build_missing: bool = True) -> str:
    """Run (or resume) a manifest's matrix; return a one-paragraph summary of where the results are.

    The image is found on each engine by its identity; where it is missing it is built first, unless
    `build_missing` is off."""
    engines = engines or [LocalEngine()]
    meta = None
    if resume:
        rd, meta, manifest = _resume(results_dir, resume, manifest_path)
        reuse_server = meta.protocol == "reuse-server"
        p = meta.plan
        strategies, tasks, runs, seed = p.strategies, p.tasks, p.runs, p.shuffle_seed
        record = meta.build
    else:
        manifest = mf.load(manifest_path)
        record = _image(manifest, engines, build_missing, log)
    model_paths = models.ensure(manifest, models_dir, download=True, log=log)
    from harness.doctor import preflight

    for e in engines:
        preflight(e, manifest, models_dir)
    plan = make_plan(manifest, [e.name for e in engines], strategies=strategies, tasks=tasks, runs=runs,
                     shuffle_seed=seed)
    check_image(engines, record, log)
    protocol = PROTOCOLS["reuse-server" if reuse_server else "fresh-container"]()
    if meta is None:
        rd = RunDir.create(results_dir, run_id or new_run_id(manifest.name))
        meta = runmeta.for_run(rd.run_id, manifest, plan, protocol.name, record, model_paths,
                               {e.name: environment.facts(e, record["tag"]) for e in engines},
                               _bandwidth(manifest, engines))
        rd.write_meta(meta)
        build.write_record(rd.path / "build.json", record)  # the build beside the results (run.json has it too)
    return _execute(manifest, plan, engines, rd, protocol, record, model_paths, log, progress)


def _execute(manifest: mf.Manifest, plan: Plan, engines: list[Engine], rd: RunDir, protocol: Any,
             record: dict[str, Any], model_paths: dict[str, Path], log: Callable[[str], None],
             progress: bool) -> str:
    ctx = Context(rd.run_id, manifest, record["tag"], record["plan"]["backend"],
                  {e.name: e.place_models(model_paths, log) for e in engines}, lambda e, w: None)
    proto = "NAIVE reuse-server protocol (caches carry over)" if protocol.name == "reuse-server" \
        else "one fresh container each"
    log(f"run {rd.run_id}: {plan.describe()}, {proto}; shuffle seed {plan.shuffle_seed}")
    try:
        counts = Executor(ctx, engines, protocol, rd, log=log, progress=progress).execute(plan.items)
    except KeyboardInterrupt:
        raise KitError(f"interrupted; finished measurements are saved in {rd.path}; "
                       f"resume with `invoke run --resume {rd.run_id}`") from None
    return (f"run {rd.run_id}: {counts['ok']} ok, {counts['failed']} failed"
            + (f", {counts['skipped']} already recorded" if counts["skipped"] else "")
            + f"; results in {rd.path}")
