"""Every speculative type on the generated drafters, in the real server: drafted / accepted per prompt, the
server's mean accepted length, output vs `--spec-type none` on the same target; and each generated file's
size, sha256 and write time.

    python3 bench/drafters.py [--image TAG] [--n-predict 128] [--tasks code-gen,json-out,translate]

One fresh container per (type, prompt), `-t 2`, temperature 0. Prints two tables (files, types)."""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import MANIFESTS  # noqa: E402
from harness.hosts.engine import Engine, LocalEngine, connect  # noqa: E402
from harness.models.drafters import write_generated  # noqa: E402
from tests.llama_server import run_once  # noqa: E402

#: file -> (kind, seed, alpha): the demo target and what each type needs.
FILES = {
    "tiny-target.gguf": ("tiny-target", 7, 0.1),
    "tiny-draft.gguf": ("tiny-draft", 7, 0.1),
    "tiny-dflash2.gguf": ("tiny-dflash2", 7, 0.1),
    "tiny-dspark.gguf": ("tiny-dspark", 7, 0.1),
    "tiny-eagle3.gguf": ("tiny-eagle3", 7, 0.1),
    "tiny-mtp-target.gguf": ("tiny-mtp-target", 7, 0.3),
}
#: type -> (target file, draft file or None, extra args).
TYPES = {
    "draft-simple": ("tiny-target.gguf", "tiny-draft.gguf", ["--spec-draft-n-max", "8"]),
    "draft-dflash": ("tiny-target.gguf", "tiny-dflash2.gguf", []),
    "draft-dspark": ("tiny-target.gguf", "tiny-dspark.gguf", []),
    "draft-eagle3": ("tiny-target.gguf", "tiny-eagle3.gguf", []),
    "draft-mtp": ("tiny-mtp-target.gguf", None, []),
    "ngram-map-k": ("tiny-target.gguf", None, []),
    "ngram-map-k4v": ("tiny-target.gguf", None, []),
    "ngram-cache": ("tiny-target.gguf", None, []),
}


def newest_image(engine: Engine) -> str:
    tags = [t for img in engine.images(name="specbench/llama-server") for t in img.tags if ":cpu-" in t]
    if not tags:
        sys.exit("no specbench/llama-server:cpu-* image: build it with `invoke build`")
    return sorted(tags)[-1]


def write_files(folder: Path) -> None:
    print(f"{'file':24s} {'kind':16s} {'seed':>4s} {'alpha':>5s} {'bytes':>10s} {'write ms':>9s}  sha256")
    for name, (kind, seed, alpha) in FILES.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            write_generated(folder / name, kind, seed, alpha)
            times.append((time.perf_counter() - t0) * 1e3)
        data = (folder / name).read_bytes()
        print(f"{name:24s} {kind:16s} {seed:4d} {alpha:5.2f} {len(data):10d} {statistics.median(times):9.0f}  "
              f"{hashlib.sha256(data).hexdigest()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image")
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--tasks", default="code-gen,json-out,translate")
    ap.add_argument("--types", default=",".join(TYPES))
    a = ap.parse_args()
    client = connect()  # tests/llama_server.py drives the Docker SDK itself: one container, one request
    image = a.image or newest_image(LocalEngine(client))
    tasks = a.tasks.split(",")
    prompts = {t: (MANIFESTS / "tasks" / f"{t}.md").read_text() for t in tasks}
    with tempfile.TemporaryDirectory(prefix="specbench-drafters-") as tmp:
        folder = Path(tmp)
        write_files(folder)
        print(f"\nimage {image}, -t 2, temperature 0, n_predict {a.n_predict}")
        baseline = {}
        for target in sorted({t for t, _, _ in TYPES.values()}):
            for task in tasks:
                baseline[target, task] = run_once(client, image, folder, ["-m", f"/models/{target}",
                                                  "--spec-type", "none"], prompts[task], a.n_predict)
        print(f"{'type':14s} {'task':10s} {'drafted':>7s} {'accepted':>8s} {'rate':>5s} {'mean len':>8s} "
              f"{'per position':24s} identical")
        for spec in a.types.split(","):
            target, draft, extra = TYPES[spec]
            args = ["-m", f"/models/{target}", *(["-md", f"/models/{draft}"] if draft else []),
                    "--spec-type", spec, "-lv", "4", *extra]
            for task in tasks:
                o = run_once(client, image, folder, args, prompts[task], a.n_predict)
                if o.content is None:
                    print(f"{spec:14s} {task:10s} FAILED: {o.parsed['failure']} (exit {o.exit_code})")
                    continue
                acc = o.parsed["draft_acceptance"] or {}
                pos = ",".join(f"{x:.2f}" for x in (o.parsed["acc_per_pos"] or [])[:4])
                rate = o.accepted / o.draft_n if o.draft_n else 0.0
                same = o.content == baseline[target, task].content
                print(f"{spec:14s} {task:10s} {o.draft_n:7d} {o.accepted:8d} {rate:5.2f} "
                      f"{acc.get('mean_len', 0):8.2f} {pos:24s} {same}")


if __name__ == "__main__":
    main()
