"""`invoke bundle` and `invoke reproduce`: one archive with a run and everything needed to run it again.

Layout of a bundle (tar.gz):
    <run-id>/bundle.json              format_version, run id, sha256 of every other file
    <run-id>/manifest/<name>.yaml     the manifest exactly as the run read it
    <run-id>/manifest/<prompt files>  at the paths the manifest names
    <run-id>/run/run.json, run/measurements.jsonl, run/summary.json (and run/samples.jsonl: a sampling study)
    <run-id>/RESULTS.md               the report of that run

A received bundle is untrusted: it is extracted member by member with harness/store/archive.py (files and folders only,
inside the destination, sizes capped), must hold exactly the files it lists with the hashes it lists, and is
removed again when it is refused."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath
from typing import TypedDict

from harness import ROOT, KitError
from harness.files import file_sha256, now_iso, sha256_bytes
from harness.report import results as rp
from harness.schema import FORMAT_VERSIONS
from harness.store import archive
from harness.store.rundir import MEASUREMENTS_FILE, RUN_FILE, SAMPLES_FILE, RunDir
from harness.store.runmeta import RunMeta

INDEX = "bundle.json"
MAX_INDEX_BYTES = 1 << 20


class BundleIndex(TypedDict):
    """bundle.json: the run, when it was bundled, its manifest and every file with its sha256."""

    format_version: int
    run_id: str
    created_at: str
    manifest: str  # a listed file under manifest/
    files: dict[str, str]  # name -> sha256


def _manifest_folder(meta: RunMeta, hint: Path | None) -> Path:
    """Where the run's prompt files are: --manifest-dir, else the manifest's recorded folder."""
    if hint is not None:
        return Path(hint)
    recorded = Path(meta.manifest.path).expanduser()
    for folder in (recorded.parent, ROOT / recorded.parent):
        if (folder / recorded.name).is_file():
            return folder
    raise KitError(f"the run's manifest folder {recorded.parent} is not here; name it with --manifest-dir")


def _relative(name: str, what: str) -> PurePosixPath:
    rel = archive.member_name(name)
    if rel is None:
        raise KitError(f"{what}: {name[:120]!r} is not a relative path inside the manifest's folder")
    return rel


def make(run_dir: Path, out: Path | None = None, manifest_dir: Path | None = None) -> Path:
    """Write the bundle of a run folder; prompts are read from the manifest's folder and checked against the
    sha256 the run recorded, so an edited prompt (or a file the run never used) cannot slip in."""
    rd = RunDir.open(run_dir)
    meta = rd.read_meta()
    rd.measurements()  # schema-checks every record
    folder = _manifest_folder(meta, manifest_dir).resolve()
    name = PurePosixPath(meta.manifest.path).name
    files: dict[str, bytes] = {f"manifest/{_relative(name, 'run.json manifest.path')}":
                               meta.manifest.text.encode()}
    for t in meta.tasks:
        for p in t.prompts:
            if "#" in p.file:  # `<suite file>#<question_id>` (harness/intake/suites.py)
                raise KitError(f"run.json tasks.{t.id}.prompts.{p.id}: {p.file[:120]!r} is a prompt suite's "
                               "question; a run of a prompt suite is not bundled yet (share its manifest and run "
                               "folder instead)")
            rel = _relative(p.file, f"run.json tasks.{t.id}.prompts.{p.id}")
            path = (folder / rel).resolve()
            if not path.is_relative_to(folder) or not path.is_file():
                raise KitError(f"{folder / rel}: not a prompt file inside the manifest's folder {folder}")
            data = path.read_bytes()
            if sha256_bytes(data) != p.sha256:
                raise KitError(f"{path}: sha256 {sha256_bytes(data)} differs from the one run {rd.run_id} used "
                               f"({p.sha256}): the prompt was edited since")
            files[f"manifest/{rel}"] = data
    with tempfile.TemporaryDirectory() as tmp:
        rp.write([rd.path], Path(tmp) / "RESULTS.md", plot=False)
        files["RESULTS.md"] = (Path(tmp) / "RESULTS.md").read_bytes()
    for fname in (RUN_FILE, MEASUREMENTS_FILE, "summary.json"):
        # a sampling study drawn alone records no measurement: its measurements file is empty
        files[f"run/{fname}"] = (rd.path / fname).read_bytes() if (rd.path / fname).is_file() else b""
    if rd.samples():  # schema-checks every batch
        files[f"run/{SAMPLES_FILE}"] = rd.samples_file.read_bytes()
    index: BundleIndex = {"format_version": FORMAT_VERSIONS["bundle"], "run_id": rd.run_id,
                          "created_at": now_iso(), "manifest": next(iter(files)),
                          "files": {k: sha256_bytes(v) for k, v in files.items()}}
    out = Path(out or f"{rd.run_id}.bundle.tar.gz")
    with tarfile.open(out, "w:gz") as tf:
        for fname, data in [(INDEX, json.dumps(index, indent=2).encode()), *files.items()]:
            info = tarfile.TarInfo(f"{rd.run_id}/{fname}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return out


def _read_index(path: Path, root: Path) -> BundleIndex:
    f = root / INDEX
    if not f.is_file() or f.stat().st_size > MAX_INDEX_BYTES:
        raise KitError(f"{path}: not a specbench bundle (no {INDEX})")
    try:
        index = json.loads(f.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise KitError(f"{path}: {INDEX} is not valid JSON") from None
    files = index.get("files") if isinstance(index, dict) else None
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise KitError(f"{path}: {INDEX}: expected an object with `files` (name -> sha256)")
    if index.get("format_version") != FORMAT_VERSIONS["bundle"]:
        raise KitError(f"{path}: {INDEX}: format_version {index.get('format_version')!r}, this kit reads "
                       f"{FORMAT_VERSIONS['bundle']}")
    if not isinstance(index.get("manifest"), str) or index["manifest"] not in files \
            or not index["manifest"].startswith("manifest/"):
        raise KitError(f"{path}: {INDEX}: `manifest` must name a listed file under manifest/")
    return index


def _verify(path: Path, root: Path, extracted: list[PurePosixPath]) -> BundleIndex:
    """The bundle holds exactly the files its index lists, each with the listed sha256."""
    index = _read_index(path, root)
    listed = set(index["files"])
    present = {str(p) for p in extracted} - {INDEX}
    if present - listed:
        raise KitError(f"{path}: {sorted(present - listed)[0]} is in the bundle but not listed in {INDEX}")
    for name, want in index["files"].items():
        if archive.member_name(name) is None or str(archive.member_name(name)) != name:
            raise KitError(f"{path}: {INDEX} lists {name[:120]!r}, not a plain relative path")
        if name not in present:
            raise KitError(f"{path}: {name} is missing from the bundle")
        got = file_sha256(root / name, cache=False)
        if got != want:
            raise KitError(f"{path}: {name} was modified (sha256 {got[:12]}, the bundle lists {want[:12]})")
    for required in (f"run/{RUN_FILE}", f"run/{MEASUREMENTS_FILE}"):
        if required not in listed:
            raise KitError(f"{path}: {required} is missing from the bundle")
    return index


def open_bundle(path: Path, dest: Path) -> tuple[Path, Path]:
    """Unpack and verify a bundle into `dest`, a folder this call makes (its parent must exist); return (manifest
    path, run folder). On refusal nothing stays behind: the folder it made is removed, and only that one (a folder
    that was there already is never unpacked into, nor removed). One line per problem."""
    path = Path(path)
    if not path.is_file():
        raise KitError(f"{path}: no such bundle file")
    dest = Path(dest)
    try:
        dest.mkdir()
    except FileExistsError:
        raise KitError(f"{dest}: exists already; the bundle is unpacked into a new folder") from None
    except OSError as e:
        raise KitError(f"{dest}: cannot make the folder to unpack the bundle into: {e.strerror or e}") from None
    try:
        return _unpack(path, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # the folder this call made, with what it unpacked
        raise


def _unpack(path: Path, dest: Path) -> tuple[Path, Path]:
    try:
        is_tar = tarfile.is_tarfile(path)
    except (OSError, EOFError, ValueError, tarfile.TarError, zlib.error):
        is_tar = True  # a tar cut short or corrupt: the extraction names the problem
    if not is_tar:
        raise KitError(f"{path}: not a specbench bundle (not a tar archive)")
    try:
        extracted = archive.extract(path, dest, archive.BUNDLE_LIMITS)
    except KitError as e:
        raise KitError(f"{path}: not a specbench bundle: {str(e).split(': ', 1)[-1]}") from None
    roots = {p.parts[0] for p in extracted}
    if len(roots) != 1:
        raise KitError(f"{path}: not a specbench bundle (expected one top folder, found {len(roots)})")
    top = next(iter(roots))
    root = dest / top
    index = _verify(path, root, [PurePosixPath(*p.parts[1:]) for p in extracted if len(p.parts) > 1])
    rd = RunDir.open(root / "run")
    meta = rd.read_meta()
    manifest_path = root / index["manifest"]
    if file_sha256(manifest_path, cache=False) != meta.manifest.sha256:
        raise KitError(f"{path}: the manifest differs from the one run {meta.run_id} recorded")
    for t in meta.tasks:
        for p in t.prompts:
            f = manifest_path.parent / _relative(p.file, f"{path}: run.json tasks.{t.id}.prompts.{p.id}")
            if not f.resolve().is_relative_to(root.resolve()) or not f.is_file() \
                    or file_sha256(f, cache=False) != p.sha256:
                raise KitError(f"{path}: prompt {p.file} differs from the one run {meta.run_id} used")
    rd.measurements()
    rd.samples()
    return manifest_path, rd.path
