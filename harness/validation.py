"""`invoke validate`: a manifest's plan in a few lines, and the strict checks for sharing it."""

from __future__ import annotations

from pathlib import Path

from harness import KitError
from harness.manifest import Manifest, check_model_files, display_path


def unpinned(manifest: Manifest) -> list[str]:
    """Fields that must be pinned before a manifest is shared for reproduction, one line each."""
    where = display_path(manifest.path)
    out = []
    src = manifest.llama_cpp
    if src.sdist is None and not (src.git and src.git.commit):
        out.append(f"{where}: llama_cpp: pin a source: an sdist with sha256, or git.commit (a ref can move)")
    if src.path is not None and src.sdist is None and src.git is None:
        out.append(f"{where}: llama_cpp.path: a local folder cannot be reproduced elsewhere")
    for m in manifest.models.values():
        if not m.sha256:
            out.append(f"{where}: models.{m.key}.sha256: not pinned")
        if m.hf and not m.hf.revision:
            out.append(f"{where}: models.{m.key}.hf.revision: not pinned (a branch can move)")
    for i, t in enumerate(manifest.tasks):
        if not t.sha256:
            out.append(f"{where}: tasks[{i}].sha256: not pinned ({t.id})")
    return out


def describe(manifest: Manifest, models_dir: Path, strict: bool = False) -> str:
    problems = check_model_files(manifest, models_dir)
    if strict:
        problems += unpinned(manifest)
    if problems:
        raise KitError(problems[0] if len(problems) == 1 else
                       f"{len(problems)} problems:\n  " + "\n  ".join(problems))
    n = len(manifest.strategies) * len(manifest.tasks) * manifest.runs
    lines = [f"{display_path(manifest.path)}: valid (manifest {manifest.name}, sha256 {manifest.sha256[:12]})",
             f"plan: {len(manifest.strategies)} strategies x {len(manifest.tasks)} tasks x {manifest.runs} runs = "
             f"{n} measurements, one fresh container each",
             f"hardware: {manifest.hardware.name}, {manifest.hardware.memory_bandwidth_gbs:g} GB/s "
             f"({manifest.hardware.bandwidth_source})",
             f"build: {manifest.build.backend}"
             + (f", CUDA arch {manifest.build.cuda_architectures}" if manifest.build.backend == "cuda" else "")
             + f"; llama.cpp from {', '.join(manifest.llama_cpp.kinds())}",
             "strategies:"]
    for s in manifest.strategies:
        extra = f" draft={s.draft}" if s.draft else ""
        args = f" {' '.join(s.args)}" if s.args else ""
        lines.append(f"  {s.id:14} --spec-type {s.spec_type}{extra}{args}")
    lines.append("tasks: " + ", ".join(f"{t.id} ({t.n_predict})" for t in manifest.tasks))
    lines.append("models:")
    for m in manifest.models.values():
        p = m.local_path(models_dir)
        if p.is_file():
            state = f"{p.stat().st_size / 1e6:,.1f} MB present"
        elif m.size_bytes:
            state = f"{m.size_bytes / 1e9:,.1f} GB, not downloaded yet"
        else:
            state = "not present yet"
        origin = (f"hf {m.hf.repo}/{m.hf.file}" if m.hf else f"generated ({m.generate.kind})" if m.generate
                  else f"pypi {m.pypi.package}=={m.pypi.version}" if m.pypi
                  else f"first {m.derive.layer_skip} blocks of {m.derive.parent}" if m.derive else "local file")
        pin = f"sha256 {m.sha256[:12]}" if m.sha256 else "sha256 unpinned"
        lines.append(f"  {m.key:10} {m.file} [{origin}] {state}, {pin}")
    if strict:
        lines.append("strict: every field that decides the numbers is pinned")
    return "\n".join(lines)
