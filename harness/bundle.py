"""`invoke bundle` and `invoke reproduce`: one archive with a run and everything needed to run it again.

Layout of a bundle (tar.gz):
    bundle.json              format_version, run id, sha256 of every other file
    manifest/<name>.yaml     the manifest exactly as the run read it
    manifest/<prompt files>  at the paths the manifest names
    run/run.json, run/measurements.jsonl, run/summary.json
    RESULTS.md               the report of that run
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from harness import ROOT, KitError, build, models, report, session
from harness import compare as cmp
from harness import manifest as mf
from harness.measure import now_iso
from harness.results import MEASUREMENTS_FILE, RUN_FILE, RunDir

FORMAT_VERSION = 1
INDEX = "bundle.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_folder(meta: dict[str, Any], hint: Path | None) -> Path:
    """Where the run's prompt files are: --manifest-dir, else the manifest's recorded folder."""
    if hint is not None:
        return Path(hint)
    recorded = Path(meta["manifest"]["path"])
    for folder in (recorded.parent, ROOT / recorded.parent):
        if (folder / recorded.name).is_file():
            return folder
    raise KitError(f"the run's manifest folder {recorded.parent} is not here; name it with --manifest-dir")


def make(run_dir: Path, out: Path | None = None, manifest_dir: Path | None = None) -> Path:
    """Write the bundle of a run folder; prompts are read from the manifest's folder and checked against the
    sha256 the run recorded, so an edited prompt cannot slip in."""
    rd = RunDir.open(run_dir)
    meta = rd.read_meta()
    rd.measurements()  # schema-checks every record
    raw = yaml.safe_load(meta["manifest"]["text"])
    folder = _manifest_folder(meta, manifest_dir)
    files: dict[str, bytes] = {f"manifest/{Path(meta['manifest']['path']).name}": meta["manifest"]["text"].encode()}
    for t in raw["tasks"]:
        data = (folder / t["prompt_file"]).read_bytes()
        want = meta["manifest"]["prompts"].get(t["id"])
        if want and _sha(data) != want:
            raise KitError(f"{folder / t['prompt_file']}: sha256 {_sha(data)} differs from the one run "
                           f"{rd.run_id} used ({want}): the prompt was edited since")
        files[f"manifest/{t['prompt_file']}"] = data
    with tempfile.TemporaryDirectory() as tmp:
        report.write([rd.path], Path(tmp) / "RESULTS.md", plot=False)
        files["RESULTS.md"] = (Path(tmp) / "RESULTS.md").read_bytes()
    for name in (RUN_FILE, MEASUREMENTS_FILE, "summary.json"):
        files[f"run/{name}"] = (rd.path / name).read_bytes()
    index = {"format_version": FORMAT_VERSION, "run_id": rd.run_id, "created_at": now_iso(),
             "manifest": next(iter(files)), "files": {k: _sha(v) for k, v in files.items()}}
    out = Path(out or f"{rd.run_id}.bundle.tar.gz")
    with tarfile.open(out, "w:gz") as tf:
        for name, data in [(INDEX, json.dumps(index, indent=2).encode()), *files.items()]:
            info = tarfile.TarInfo(f"{rd.run_id}/{name}")
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    return out


def open_bundle(path: Path, dest: Path) -> tuple[Path, Path]:
    """Unpack and verify a bundle; return (manifest path, run folder). One line per problem."""
    path = Path(path)
    try:
        with tarfile.open(path) as tf:
            names = tf.getnames()
            roots = {n.split("/", 1)[0] for n in names}
            if len(roots) != 1 or f"{next(iter(roots))}/{INDEX}" not in names:
                raise KitError(f"{path}: not a specbench bundle (no {INDEX})")
            tf.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise KitError(f"{path}: not a specbench bundle ({e})") from None
    root = Path(dest) / next(iter(roots))
    index = json.loads((root / INDEX).read_text())
    for name, want in index["files"].items():
        f = root / name
        if not f.is_file():
            raise KitError(f"{path}: {name} is missing from the bundle")
        if _sha(f.read_bytes()) != want:
            raise KitError(f"{path}: {name} was modified (sha256 {_sha(f.read_bytes())[:12]}, "
                           f"the bundle lists {want[:12]})")
    rd = RunDir.open(root / "run")
    meta = rd.read_meta()
    manifest_path = root / index["manifest"]
    if _sha(manifest_path.read_bytes()) != meta["manifest"]["sha256"]:
        raise KitError(f"{path}: the manifest differs from the one run {meta['run_id']} recorded")
    for tid, want in meta["manifest"]["prompts"].items():
        raw = yaml.safe_load(manifest_path.read_text())
        pf = next((t["prompt_file"] for t in raw["tasks"] if t["id"] == tid), None)
        if pf and _sha((manifest_path.parent / pf).read_bytes()) != want:
            raise KitError(f"{path}: prompt {pf} differs from the one run {meta['run_id']} used")
    rd.measurements()
    return manifest_path, rd.path


def reproduce(source: Path, workdir: Path, *, models_dir: Path, log: Callable[[str], None] = print,
              progress: bool = True, engines=None) -> dict[str, Any]:
    """Run a bundle's (or a manifest's) matrix again here and compare with the original when there is one."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    original = None
    plan: dict[str, Any] = {}
    if str(source).endswith((".tar.gz", ".tgz", ".tar")):
        manifest_path, original = open_bundle(source, workdir / "bundle")
        plan = RunDir.open(original).read_meta()["plan"]
        log(f"reproduce: bundle of run {original.parent.name} verified; manifest {manifest_path.name}")
    else:
        manifest_path = Path(source)
    manifest = mf.load(manifest_path)
    models.ensure(manifest, models_dir, download=True, log=log)
    from harness.engine import connect

    rec = build.build(connect(), manifest, log=log)
    log(f"reproduce: image {rec['tag']} ({'reused' if rec['reused'] else 'built'})")
    run_id = f"{manifest.name}-reproduction-{now_iso()[:19].replace(':', '').replace('-', '')}"
    out = session.run(manifest_path, results_dir=workdir / "results", models_dir=models_dir, run_id=run_id,
                      strategies=plan.get("strategies"), tasks=plan.get("tasks"), runs=plan.get("runs"),
                      progress=progress, engines=engines, log=log)
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


def clean_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
