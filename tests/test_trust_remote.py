"""The remote host's files are the user's: a received manifest cannot overwrite them. Shown against a real sshd on
loopback (tests/conftest.py), whose "remote" models folder is a folder here that the tests can inspect."""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError
from harness.hosts.remote import SENT_FOLDER, RemoteEngine, check_host_spec
from harness.intake import manifest as mf
from tests.conftest import DEMO, write_manifest
from tests.crafted import one_line

USERS = b"GGUF the user's own 17.5 GB model, placed by `invoke models` on the host\n"
AUTHORS = b"GGUF the manifest author's bytes under the same name\n"


def _remote(sshd, remote_models: Path) -> RemoteEngine:
    return RemoteEngine.connect(sshd["spec"], key_filename=sshd["client_key"], known_hosts=sshd["known_hosts"],
                                remote_models=str(remote_models))


def _state(p: Path) -> tuple:
    st = p.lstat()
    return p.read_bytes(), st.st_ino, st.st_mtime_ns, st.st_mode


@pytest.fixture()
def folders(tmp_path):
    """The host's models folder holding the user's file, and the manifest's own file of the same name here."""
    remote = tmp_path / "remote-models"
    remote.mkdir()
    (remote / "Qwen3.8-27B-UD-Q4_K_XL.gguf").write_bytes(USERS)
    local = tmp_path / "manifest" / "models" / "Qwen3.8-27B-UD-Q4_K_XL.gguf"
    local.parent.mkdir(parents=True)
    local.write_bytes(AUTHORS)
    return remote, local


def test_a_file_of_the_same_name_on_the_host_is_never_overwritten(sshd, folders):
    remote, local = folders
    users = remote / local.name
    before = _state(users)
    want = hashlib.sha256(AUTHORS).hexdigest()
    lines: list[str] = []
    eng = _remote(sshd, remote)
    try:
        paths = eng.place_models({"target": local}, lines.append)
        assert _state(users) == before  # the user's file: same bytes, same inode, same mtime
        sent = remote / SENT_FOLDER / want / local.name
        assert paths == {"target": sent} and sent.read_bytes() == AUTHORS
        assert len(lines) == 1 and f"sending {local.name} (0.0 MB) to {sent}" in lines[0]
        assert f"{users} holds other bytes (0.00 GB, owner root, sha256 " \
               f"{hashlib.sha256(USERS).hexdigest()[:12]}), left as it is" in lines[0]
        lines.clear()
        assert eng.place_models({"target": local}, lines.append) == {"target": sent} and lines == []  # kept
        own = local.parent / "own" / users.name  # a manifest pinning the user's own file: used where it is
        own.parent.mkdir()
        own.write_bytes(USERS)
        assert eng.place_models({"target": own}, lines.append) == {"target": users} and lines == []
    finally:
        eng.close()
    leftovers = sorted(p.relative_to(remote).as_posix() for p in remote.rglob("*") if p.is_file())
    assert leftovers == [f"{SENT_FOLDER}/{want}/{local.name}", local.name]  # no partial file left behind


def test_too_large_to_send_is_one_line_naming_the_file_its_size_and_owner(sshd, folders):
    remote, local = folders
    before = _state(remote / local.name)
    eng = _remote(sshd, remote)
    try:
        with pytest.raises(KitError) as e:
            eng.place_models({"target": local}, lambda s: None, upload_limit=8)
    finally:
        eng.close()
    want = hashlib.sha256(AUTHORS).hexdigest()
    one_line(e, f"models.target: {local.name} (0.0 GB, sha256 {want[:12]}) is not there",
             f"{remote / local.name} holds other bytes (0.00 GB, owner root", "left as it is",
             "too large to send over SSH", f"copy it to {remote / SENT_FOLDER / want / local.name} (scp)")
    assert _state(remote / local.name) == before
    assert sorted(p.name for p in remote.rglob("*")) == [local.name]  # nothing written


@pytest.mark.parametrize("planted", ["file", "hash folder", "kit folder"])
def test_a_link_planted_in_the_kits_folder_is_refused_never_followed(sshd, folders, tmp_path, planted):
    """A link where the kit's file, its hash folder or `.specbench-sent` itself would be: reading it would mount a
    file outside the kit's folder into the container; writing through it would overwrite one."""
    remote, local = folders
    want = hashlib.sha256(AUTHORS).hexdigest()
    outside = tmp_path / "outside"
    (outside / want).mkdir(parents=True)
    canary = outside / want / local.name
    canary.write_bytes(AUTHORS)  # the bytes the manifest pins: a followed link would be used as the model
    victim = outside / local.name
    victim.write_text("the user's file\n")
    link = {"file": remote / SENT_FOLDER / want / local.name, "hash folder": remote / SENT_FOLDER / want,
            "kit folder": remote / SENT_FOLDER}[planted]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to({"file": canary, "hash folder": outside, "kit folder": outside}[planted])
    before = {p: _state(p) for p in (canary, victim)}
    eng = _remote(sshd, remote)
    try:
        with pytest.raises(KitError) as e:
            eng.place_models({"target": local}, lambda s: None)
        one_line(e, f"{link} is a symbolic link", f"{SENT_FOLDER} holds only files and folders it made")
        # noclobber: a partial file already there would not be written through either
        with pytest.raises(KitError) as e:
            eng.send_bytes(b"x", str(canary))
        one_line(e, f"cannot write {canary}")
    finally:
        eng.close()
    assert {p: _state(p) for p in (canary, victim)} == before
    assert link.is_symlink() and sorted(p.name for p in outside.rglob("*")) == sorted([want, local.name,
                                                                                      local.name])


@pytest.mark.parametrize("spec", ["root@127.0.0.1:abc", "root@127.0.0.1:99999", "root@:22", "a b@c", "x;id"])
def test_a_host_that_is_not_user_at_host_port_is_one_line(spec):
    with pytest.raises(KitError) as e:
        check_host_spec(spec)
    one_line(e, "--host", "expected user@host[:port] with a port from 1 to 65535")
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "doctor", "--host", spec],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.stderr and "expected user@host[:port]" in res.stderr


@pytest.mark.parametrize("files,expected", [
    (("t.gguf", "t.gguf"), "'t.gguf' is models.target.file too"),
    (("t.gguf", "sub/t.gguf"), "'sub/t.gguf' and models.target.file 't.gguf' have one file name 't.gguf'"),
])
def test_two_model_keys_with_one_file_name_are_refused(tmp_path, files, expected):
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"] = {"target": {"file": files[0], "sha256": "0" * 64},
                     "draft": {"file": files[1], "sha256": "1" * 64}}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "d", "spec_type": "draft-simple", "draft": "draft"}]
    with pytest.raises(mf.ManifestError) as e:
        mf.load(write_manifest(tmp_path, yaml.safe_dump(copy.deepcopy(raw), sort_keys=False)))
    one_line(e, "models.draft.file: ", expected, "give each model a file name of its own")
    assert sorted(os.listdir(tmp_path)) == ["m.yaml", "tasks"]
