"""`invoke reproduce`: run a bundle's (or a manifest's) matrix again here and compare with the original.

What arrives is untrusted: the bundle is verified (harness/share/bundle.py) before anything is fetched, and a
build source other than the official one is refused unless the user passes --trust-source."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import KitError
from harness.analysis import compare as cmp
from harness.analysis import reproduction as repro
from harness.analysis.records import CellKey
from harness.analysis.summary import summarize
from harness.files import now_iso
from harness.formatter import console
from harness.hosts.engine import LocalEngine
from harness.image import builds
from harness.intake import manifest as mf
from harness.intake import trust
from harness.models import ensure as md
from harness.report import results as rp
from harness.run import runner
from harness.share.bundle import open_bundle
from harness.store.rundir import RunDir


@dataclass(frozen=True)
class Reproduction:
    """What `reproduce` made: the new run folder, the original's (a bundle's run, else None) and the comparison
    of the two (None without an original)."""

    run: Path
    original: Path | None
    comparison: cmp.Comparison | None


def reproduce(source: Path, workdir: Path, *, models_dir: Path, log: Callable[[str], None] = print,
              progress: bool = True, engines=None, trust_source: bool = False,
              margin: float = repro.REPRODUCE_MARGIN, until: bool = False, max_rounds: int | None = None,
              cell_margin: float | None = None) -> Reproduction:
    """Run a bundle's (or a manifest's) matrix again here and compare with the original when there is one, each
    strategy's geometric mean of B/A against ±margin and each cell's against ±cell_margin (default twice the
    margin). With `until`, rounds are added here after the original's number, for the cells whose comparison is
    still unresolved (and their baselines), until the verdict is decided or `max_rounds`. The result's
    `comparison` is a compare.Comparison (compare.json holds its `as_dict`).

    What arrives is untrusted: it is verified before anything is fetched, and a build source other than the
    official one is refused unless `trust_source`."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    original = None
    plan = None
    if str(source).endswith((".tar.gz", ".tgz", ".tar")):
        manifest_path, original = open_bundle(source, fresh_folder(workdir, "bundle"))
        plan = RunDir.open(original).read_meta().plan
        log(f"reproduce: bundle of run {console(original.parent.name, 200)} verified; manifest "
            f"{console(manifest_path.name, 200)}")
        reach = summarize(RunDir.open(original)).get("reproduction_reach")
        if reach:  # said before any download: what this reproduction can confirm and the rounds it will need
            log(f"reproduce: {console(reach['sentence'], 1000)}")
    else:
        manifest_path = Path(source)
    trusted = trust.decide(mf.load(manifest_path), trust_source)  # once: the build and the run are handed it
    manifest = trusted.manifest
    engines = engines or [LocalEngine()]  # an engine that does not answer is reported before any download
    md.ensure(manifest, models_dir, download=True, log=log)
    for e in engines:
        for name, rec in builds.build_each(e, trusted, log=log, host=e.name):  # every build the manifest names
            log(f"reproduce: {f'build {name}: ' if name else ''}image {rec.tag} on {e.name} "
                f"({'reused' if rec.reused else 'built'})")
    run_id = f"{manifest.name}-reproduction-{now_iso()[:19].replace(':', '').replace('-', '')}"
    extend = decided(original, margin, cell_margin) if until and original is not None else None
    # the sampling study as the original drew it: none, the manifest's after the timed rounds, or alone
    study = None if plan is None else 0 if not plan.distribution else plan.distribution.settings.samples \
        if not plan.runs else None
    out = runner.run(trusted, results_dir=workdir / "results", models_dir=models_dir, run_id=run_id,
                     strategies=plan.strategies if plan else None, tasks=plan.tasks if plan else None,
                     runs=plan.runs if plan else None, progress=progress, engines=engines, log=log, extend=extend,
                     max_rounds=max_rounds, distribution=study)
    log(out)
    new = workdir / "results" / run_id
    comparison = cmp.compare(original, new, margin, cell_margin) if original is not None else None
    rp.write([new], workdir / "RESULTS.md", comparison=comparison)
    if comparison is not None:
        (workdir / "compare.json").write_text(json.dumps(comparison.as_dict(), indent=2) + "\n")
    return Reproduction(new, original, comparison)


def fresh_folder(parent: Path, name: str) -> Path:
    """A name for a folder that does not exist yet under `parent`: `name`, else `name-2`, `name-3`, ... (the folder
    is made by whoever unpacks into it, so nothing that was there, the user's or an earlier run's, is reused or
    removed)."""
    for i in range(1, 10_000):
        p = parent / (name if i == 1 else f"{name}-{i}")
        if not p.exists() and not p.is_symlink():
            return p
    raise KitError(f"{parent}: holds {name} to {name}-9999 already; choose another --workdir")


def decided(original: Path, margin: float, cell_margin: float | None = None) -> runner.Extender:
    """`invoke reproduce --until`: another round for the cells whose comparison with the original is still
    unresolved (inconclusive at the cell margin or without a B/A interval; all cells of a strategy whose geometric
    mean is inconclusive), with their baselines, until the verdict is reproduces or differs."""
    def decide(rd: RunDir, last: int) -> tuple[list[CellKey] | None, str]:
        res = cmp.compare(original, rd.path, margin, cell_margin)
        if res.call in (repro.Call.REPRODUCES, repro.Call.DIFFERS, repro.Call.NOT_COMPARABLE):
            return None, f"reproduce --until: {res.call.value} after {last} rounds here"
        open_strategies = {(g.host, g.strategy) for g in res.geomeans if g.call is repro.Call.INCONCLUSIVE}
        meta = rd.read_meta()
        base = {s.id: s.baseline for s in meta.planned_strategies()}
        cells: list[CellKey] = []
        for r in res.rows:
            if r.call is repro.Call.INCONCLUSIVE or ((r.host, r.strategy) in open_strategies
                                                  and r.call is repro.Call.REPRODUCES):
                host = res.host_b.get(r.host) or r.host
                for s in (r.strategy, base.get(r.strategy)):
                    key = CellKey(host, s, r.task) if s and r.task is not None else None
                    if key is not None and key not in cells:
                        cells.append(key)
        if not cells:
            return None, f"reproduce --until: {res.call.value}, and adding rounds here would not decide it"
        return cells, (f"reproduce --until: still {res.verdict.split(':')[0]} after {last} rounds here; next: "
                       f"{len(cells)} cells")
    return decide
