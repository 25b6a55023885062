"""`invoke doctor`: is a host ready to measure? One line per item, and the fix for each failing one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.engine import Engine
from harness.files import file_sha256
from harness.manifest import Manifest


@dataclass(frozen=True)
class Item:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    fatal: bool = True

    def line(self) -> str:
        mark = "ok  " if self.ok else ("FAIL" if self.fatal else "warn")
        text = f"{mark} {self.name}: {self.detail}"
        return text + (f"\n       fix: {self.fix}" if not self.ok and self.fix else "")


def check(engine: Engine, manifest: Manifest, local_models: Path, models: bool = True) -> list[Item]:
    """Docker, GPU and driver, NVIDIA runtime, disk, model files and image on the engine's host.

    models=False skips hashing the model files (the run verifies them as it places them)."""
    items: list[Item] = []
    v = engine.client.version()
    info = engine.client.info()
    items.append(Item("docker", True, f"engine {v.get('Version')} (API {v.get('ApiVersion')}) on "
                      f"{info.get('OperatingSystem')}, {info.get('NCPU')} CPUs"))
    from harness.environment import nvidia_smi

    gpus = nvidia_smi(engine)
    cuda = manifest.build.backend == "cuda"
    if gpus:
        items.append(Item("gpu", True, ", ".join(f"{g['name']} (driver {g['driver']})" for g in gpus)))
    else:
        why = "" if cuda else " (not needed: cpu backend)"
        items.append(Item("gpu", not cuda, f"nvidia-smi not found or no GPU{why}",
                          "install the NVIDIA driver on the host (nvidia-smi must list the GPU)", fatal=cuda))
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    has_nvidia = "nvidia" in runtimes or any("nvidia" in str(x) for x in info.get("CDISpecDirs") or [])
    if cuda:
        items.append(Item("nvidia runtime", has_nvidia, f"Docker runtimes: {', '.join(runtimes)}",
                          "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"))
    # model files at the host's models folder
    remote_dir = engine.models_dir()
    need = 0
    for m in manifest.models_used() if models else []:
        local = m.local_path(local_models)
        if remote_dir is None:
            where = local
            present = local.is_file()
            sha = file_sha256(local) if present and m.sha256 else None
        else:
            where = Path(f"{remote_dir}/{local.name}")
            sha = engine.remote_sha256(str(where))  # type: ignore[attr-defined]
            present = sha is not None
        size = m.size_bytes or (local.stat().st_size if local.is_file() else 0)
        if not present:
            need += size
            plan = ("generated here and sent over SSH" if m.generate else
                    "sent over SSH from this machine" if local.is_file() and remote_dir else
                    f"download with `invoke models` ({m.hf.repo}/{m.hf.file})" if m.hf else "place it there")
            items.append(Item(f"model {m.key}", m.generate is not None or (local.is_file() and remote_dir is not None),
                              f"{where} missing; plan: {plan}", f"put {m.file} at {where}",
                              fatal=m.generate is None and not local.is_file()))
        elif m.sha256 and sha != m.sha256:
            items.append(Item(f"model {m.key}", False, f"{where} has sha256 {sha[:12]}, the manifest pins "
                              f"{m.sha256[:12]}", f"replace {where} with the pinned file"))
        else:
            items.append(Item(f"model {m.key}", True, f"{where} present" + (", sha256 ok" if m.sha256 else
                                                                             " (sha256 not pinned)")))
    df_dir = remote_dir or str(local_models if local_models.exists() else Path.cwd())
    code, out = engine.run_host(["df", "-Pk", df_dir])
    if code == 0 and len(out.splitlines()) > 1:
        free = int(out.splitlines()[1].split()[3]) * 1024
        items.append(Item("disk", free > need * 1.1, f"{free / 1e9:,.1f} GB free at {df_dir}, models need "
                          f"{need / 1e9:,.1f} GB more", "free disk space or choose another models folder"))
    from harness import images

    found = images.find(engine.client, manifest)
    if found is None:
        items.append(Item("image", False, "no image of this manifest's build (source, flags, backend, bases) here",
                          "invoke build" + ("" if engine.name == "local" else f" --host {engine.name}")
                          + " (or let `invoke run` build it)", fatal=False))
    else:
        items.append(Item("image", True, f"{found.tag} ({found.image.short_id.split(':')[-1]}, llama.cpp "
                          f"b{found.plan.source['build_number']} {found.plan.source['commit']})"))
    return items


def preflight(engine: Engine, manifest: Manifest, local_models: Path) -> None:
    """The doctor's checks at the start of a run: any fatal item stops it, each named with its fix."""
    from harness import KitError

    bad = [i for i in check(engine, manifest, local_models, models=False) if not i.ok and i.fatal]
    if bad:
        lines = "; ".join(f"{i.name}: {i.detail} (fix: {i.fix})" for i in bad)
        raise KitError(f"{engine.name} is not ready: {lines}")
