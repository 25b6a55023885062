"""`invoke reproduce`: run a bundle's (or a manifest's) matrix again here and compare with the original.

What arrives is untrusted: the bundle is verified (harness/share/bundle.py) before anything is fetched, and a
build source other than the official one is refused unless the user passes --trust-source."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.analysis import compare as cmp
from harness.analysis import report
from harness.files import now_iso
from harness.hosts.engine import LocalEngine
from harness.image import build
from harness.intake import manifest as mf
from harness.intake import trust
from harness.models import ensure as models
from harness.run import runner
from harness.share.bundle import open_bundle
from harness.store.rundir import RunDir


def reproduce(source: Path, workdir: Path, *, models_dir: Path, log: Callable[[str], None] = print,
              progress: bool = True, engines=None, trust_source: bool = False) -> dict[str, Any]:
    """Run a bundle's (or a manifest's) matrix again here and compare with the original when there is one.

    What arrives is untrusted: it is verified before anything is fetched, and a build source other than the
    official one is refused unless `trust_source`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    original = None
    plan = None
    if str(source).endswith((".tar.gz", ".tgz", ".tar")):
        dest = workdir / "bundle"
        if dest.exists():
            shutil.rmtree(dest)
        manifest_path, original = open_bundle(source, dest)
        plan = RunDir.open(original).read_meta().plan
        log(f"reproduce: bundle of run {original.parent.name} verified; manifest {manifest_path.name}")
    else:
        manifest_path = Path(source)
    trusted = trust.decide(mf.load(manifest_path), trust_source)  # once: the build and the run are handed it
    manifest = trusted.manifest
    engines = engines or [LocalEngine()]  # an engine that does not answer is reported before any download
    models.ensure(manifest, models_dir, download=True, log=log)
    for e in engines:
        rec = build.build(e, trusted, log=log, host=e.name)
        log(f"reproduce: image {rec['tag']} on {e.name} ({'reused' if rec['reused'] else 'built'})")
    run_id = f"{manifest.name}-reproduction-{now_iso()[:19].replace(':', '').replace('-', '')}"
    out = runner.run(trusted, results_dir=workdir / "results", models_dir=models_dir, run_id=run_id,
                     strategies=plan.strategies if plan else None, tasks=plan.tasks if plan else None,
                     runs=plan.runs if plan else None, progress=progress, engines=engines, log=log)
    log(out)
    new = workdir / "results" / run_id
    result: dict[str, Any] = {"run": str(new), "original": str(original) if original else None}
    if original is not None:
        result["comparison"] = cmp.compare(original, new)
        report.write([new], workdir / "RESULTS.md", comparison=result["comparison"])
        (workdir / "compare.json").write_text(json.dumps(result["comparison"], indent=2) + "\n")
    else:
        report.write([new], workdir / "RESULTS.md")
    return result
