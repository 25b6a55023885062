"""The run.json of a new run: what it will measure and how, normalised from the manifest and the plan (models by
name, hash, size, source and what one pass reads; strategies with their resolved baselines; prompts by hash),
written once at the start. harness/store/runmeta.py reads it back for every later stage."""

from __future__ import annotations

from pathlib import Path

from harness import KitError, __version__
from harness.files import file_sha256, now_iso, recorded_path
from harness.intake.manifest import Manifest, ModelFile
from harness.models import gguf_facts, passbytes
from harness.run.plan import Plan
from harness.store.buildrecord import BuildRecord
from harness.store.runmeta import (
    HostFacts,
    ManifestMeta,
    MeasuredBandwidth,
    ModelMeta,
    ModelSource,
    PlanMeta,
    PromptMeta,
    RunMeta,
    StrategyMeta,
    StudyMeta,
    TaskMeta,
)


def model_facts(model: ModelFile, path: Path) -> ModelMeta:
    """What run.json records of a model file: name, hash, size, where it came from (never a local path)."""
    src: ModelSource
    if model.hf:
        src = {"hf": {"repo": model.hf.repo, "file": model.hf.file, "revision": model.hf.revision}}
    elif model.generate:
        src = {"generate": {"kind": model.generate.kind, "seed": model.generate.seed, "alpha": model.generate.alpha,
                            **model.generate.shape()}}
    else:
        src = {"file": model.file}
    return ModelMeta(path.name, model.sha256 or file_sha256(path), path.stat().st_size, model.quantization, src,
                     _reads(path))


def _reads(path: Path) -> passbytes.ModelReads | None:
    """What one pass of this model reads, from its GGUF header (None for a file that is not GGUF)."""

    try:
        return passbytes.model_reads(gguf_facts.read_facts(path))
    except (KitError, OSError, ValueError):
        return None


def for_run(run_id: str, manifest: Manifest, plan: Plan, protocol: str, build: BuildRecord,
            model_paths: dict[str, Path], environment: dict[str, HostFacts],
            bandwidth: MeasuredBandwidth | None, until: float | None = None, max_rounds: int | None = None,
            aa_control: bool = False, confirm_rounds: int = 0, quiet_wait_s: float | None = None,
            builds: dict[str, BuildRecord] | None = None, distribution: StudyMeta | None = None) -> RunMeta:
    """The run metadata of a new run, normalised from the manifest and the plan; `builds`: each build's record
    by name, for a manifest of several builds (`build` is the first's)."""
    folder = manifest.folder
    strategies = []
    for s in plan.strategies:  # those measured (an A/A twin included), with the models they use
        base = manifest.baseline_for(s)
        strategies.append(StrategyMeta(s.id, s.spec_type, s.draft, s.model,
                                       base.id if base is not None and base.id != s.id else None, tuple(s.args),
                                       s.label, s.parallel, s.family, s.sweep, s.build))
    # a suite's question is named by its file and question_id (harness/intake/suites.py), a prompt file by its path
    tasks = [TaskMeta(t.id, t.n_predict, tuple(PromptMeta(p.id, p.source or p.path.relative_to(folder).as_posix(),
                                                          p.sha256 or file_sha256(p.path)) for p in t.prompts),
                      t.perturbation, t.depth, t.dims) for t in manifest.tasks]
    return RunMeta(
        run_id=run_id, created_at=now_iso(), status="running", protocol=protocol, kit_version=__version__,
        manifest=ManifestMeta(manifest.name, recorded_path(manifest.path), manifest.sha256, manifest.text),
        hardware=manifest.hardware, sampling=manifest.sampling, endpoint=manifest.endpoint,
        strategies=strategies, tasks=tasks,
        models={k: model_facts(manifest.models[k], p) for k, p in model_paths.items()},
        build=build, environment=environment,
        plan=PlanMeta([s.id for s in plan.strategies], [t.id for t in plan.tasks], plan.runs, plan.shuffle_seed,
                      plan.hosts, len(plan.items), aa_control, until, max_rounds, retake_cap=plan.retake_cap,
                      confirm_rounds=confirm_rounds if plan.sweeps() else 0, quiet_wait_s=quiet_wait_s or None,
                      distribution=distribution),
        bandwidth=bandwidth, builds=builds or {})
