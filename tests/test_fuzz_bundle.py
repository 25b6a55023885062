"""Bundle archives fuzzed with hypothesis: members with random names, types, sizes and links, added to, dropped
from or changed in a real bundle (re-signed or not), compressed or not, cut short or not. Every archive is either
a verified bundle inside its destination or a one-line KitError that leaves nothing behind; never a traceback,
never a write outside."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from harness import KitError
from harness.share import bundle as bu
from tests.crafted import Sandbox, bundle_files, demo_bundle, rebundle

TOP = "demo-cpu"
KINDS = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
         tarfile.FIFOTYPE, tarfile.CONTTYPE]
NAMES = st.one_of(
    st.sampled_from([f"{TOP}/bundle.json", f"{TOP}/run/run.json", f"{TOP}/run/measurements.jsonl",
                     f"{TOP}/manifest/demo-cpu.yaml", f"{TOP}/manifest/tasks/zh-prose.md", f"{TOP}/run", TOP,
                     f"{TOP}/extra", "..", "../evil", "/tmp/evil", f"{TOP}/../../evil", f"{TOP}/a\\..\\b",
                     f"./{TOP}/x", f"{TOP}//x", f"{TOP}/./run/run.json", "other/x", f"{TOP}/" + "d" * 300]),
    st.text(alphabet="ab./-\\é\x01", min_size=1, max_size=24),
)
LINKS = st.one_of(NAMES, st.sampled_from(["/etc/passwd", "../../outside/canary.txt", ".", "..", ""]))


@st.composite
def members(draw):
    name, kind = draw(NAMES), draw(st.sampled_from(KINDS))
    data = draw(st.binary(max_size=64)) if kind in (tarfile.REGTYPE, tarfile.CONTTYPE) else b""
    return name, kind, data, draw(LINKS)


class _Files(dict):
    def __repr__(self) -> str:  # hypothesis prints its arguments: the demo's files are not worth 600 kB
        return f"<the {len(self)} files of the demo bundle>"


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> dict[str, bytes]:
    return _Files(bundle_files(demo_bundle(tmp_path_factory.mktemp("made"))))


def _archive(path, entries, gz: bool, cut: float | None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.GNU_FORMAT) as tf:
        for name, kind, data, link in entries:
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname, ti.mode = kind, link, 0o644
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data else None)
    raw = buf.getvalue()
    path.write_bytes(raw[: int(len(raw) * cut)] if cut is not None else raw)
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(base=st.sampled_from(["demo", "re-signed demo", "empty"]), drop=st.sets(st.integers(0, 20), max_size=3),
       change=st.dictionaries(st.integers(0, 20), st.binary(max_size=32), max_size=2),
       extra=st.lists(members(), max_size=5), gz=st.booleans(),
       cut=st.one_of(st.none(), st.floats(0.05, 0.99)))
def test_fuzzed_bundle_is_verified_or_one_line(tmp_path_factory, demo_files, base, drop, change, extra, gz, cut):
    root = tmp_path_factory.mktemp("fuzz")
    box = Sandbox(root, root / "work", root / "outside")
    box.work.mkdir()
    box.outside.mkdir()
    (box.outside / "canary.txt").write_text("canary\n")
    files = {} if base == "empty" else dict(demo_files)
    names = sorted(files)
    for i in drop:
        if i < len(names):
            files.pop(names[i], None)
    for i, data in change.items():
        if i < len(names) and names[i] in files:
            files[names[i]] = data
    if base == "re-signed demo":
        files["bundle.json"] = demo_files["bundle.json"]
        source = rebundle(box.work / "signed.tar", files)  # bundle.json lists the changed files' hashes
        with tarfile.open(source) as tf:
            files = {m.name.split("/", 1)[1]: tf.extractfile(m).read() for m in tf if m.isreg()}
    entries = [(f"{TOP}/{k}", tarfile.REGTYPE, v, "") for k, v in files.items()] + list(extra)
    try:
        archive = _archive(box.work / "in.tar.gz", entries, gz, cut)
    except (ValueError, UnicodeError, tarfile.TarError):
        assume(False)  # tarfile itself cannot write this member
    before = box.state()
    dest = box.work / "dest"
    try:
        manifest, run = bu.open_bundle(archive, dest)
    except KitError as e:
        msg = str(e)
        event("refused: " + msg.split(": ", 1)[-1][:40])
        assert "\n" not in msg and "Traceback" not in msg, msg
        assert not dest.exists(), "a refused bundle left files behind"
    else:
        event("verified")
        assert manifest.is_file() and manifest.resolve().is_relative_to(dest.resolve())
        assert run.is_dir() and run.resolve().is_relative_to(dest.resolve())
        assert not any(p.is_symlink() or not (p.is_file() or p.is_dir()) for p in dest.rglob("*"))
    assert box.state() == before, "something was written outside the work folder"
