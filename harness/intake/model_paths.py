"""Where a manifest's model files live: a plain name in the models folder, a path with a slash in the manifest's own
folder; the file a container mounts must stay inside that folder (a manifest and its folder are untrusted)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Protocol

from harness import KitError
from harness.files import display_path


class Place(Protocol):
    """What this module reads of a manifest (manifest.py builds on this module, so it names no class there)."""

    @property
    def folder(self) -> Path: ...

    path: Path


class File(Protocol):
    """What this module reads of a manifest's model entry."""

    key: str
    file: str
    path: Any


def model_location(manifest: Place, model: File, models_dir: Path) -> Path:
    """Where a model file is, or will be written: a plain name in the models folder, a path with a slash in the
    manifest's folder. A file that is there is returned resolved, after checking that every symlink on the way
    stays inside that folder and that it is a regular file (not a folder, FIFO or device); one line otherwise."""
    slash = model.path is not None
    root = Path(os.path.realpath(manifest.folder if slash else models_dir))
    place = "the manifest's folder" if slash else "the models folder"
    lexical = (manifest.folder / model.file) if slash else Path(models_dir) / model.file
    field = f"{display_path(manifest.path)}: models.{model.key}.file"
    if not os.path.lexists(lexical):
        # Not there yet: the folders on the way must still resolve inside (it is written there).
        if not Path(os.path.realpath(lexical)).is_relative_to(root):
            raise KitError(f"{field}: {display_path(lexical)} would land outside {place} {display_path(root)} "
                           "(a folder on the way is a symlink out of it)")
        return lexical
    try:
        real = Path(os.path.realpath(lexical, strict=True))
        mode = os.stat(real).st_mode
    except (OSError, RuntimeError) as e:
        why = getattr(e, "strerror", None) or e
        raise KitError(f"{field}: {display_path(lexical)} cannot be resolved ({why}: a symlink loop "
                       "or a link to nothing?)") from None
    if not real.is_relative_to(root):
        raise KitError(f"{field}: {display_path(lexical)} is a link to {real}, outside {place} {display_path(root)}; "
                       "only files inside it are mounted (copy or hard-link the file there, or point --models-dir "
                       "at its folder)")
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise KitError(f"{field}: {display_path(lexical)} is {kind}, expected a regular model file")
    return real
