"""What harness.run.interference costs and what it sees. Prints the time each read takes (host cgroup file vs
`exec_run` inside the container, /proc/stat, the frequency/throttle shell, a whole sample), then the interference
figure over windows with nothing added, with a busy loop on the host, and with a busy loop inside the container.

    python3 bench/interference_cost.py [--image TAG] [--window 2] [--repeats 3]

Needs a Docker engine and any image with `sh` and `timeout` (default: the kit's llama-server image).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from harness.hosts.engine import LocalEngine  # noqa: E402
from harness.run import interference as itf  # noqa: E402


def timed(fn, n: int) -> float:
    """Median seconds of n calls."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def spin(seconds: float) -> float:
    proc = subprocess.Popen([sys.executable, "-c", f"import time\nt = time.monotonic()\n"
                             f"while time.monotonic() - t < {seconds}: pass"])
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def window(engine, container, seconds: float, what: str) -> tuple[itf.Figure, float]:
    before = itf.sample(engine, container)
    extra = 0.0
    if what == "host loop":
        extra = spin(seconds)
    elif what == "container loop":
        container.exec_run(["timeout", str(seconds), "sh", "-c", "while :; do :; done"])
    else:
        time.sleep(seconds)
    after = itf.sample(engine, container, edge="end")
    return itf.figure(before, after), extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=None)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reads", type=int, default=30)
    args = ap.parse_args()
    engine = LocalEngine()
    image = args.image or next(t for i in engine.images(name="specbench/llama-server") for t in i.tags
                               if ":cpu-" in t)
    c = engine.start_server(image, ["sh", "-c", "sleep 600"], [], {"specbench.role": "bench"})
    try:
        itf.sample(engine, c)  # finds the cgroup file once
        path = itf._capabilities(engine).cgroup_file.get(c.id)
        print(f"image {image}; container cgroup file on the host: {path}")
        print(f"median cost per read over {args.reads} reads:")
        print(f"  host cgroup file      {timed(lambda: engine.read_host_file(path), args.reads) * 1e3:8.3f} ms")
        print(f"  exec in container     {timed(lambda: engine.exec_in(c, itf._EXEC_CGROUP), args.reads) * 1e3:8.3f} ms")
        print(f"  /proc/stat            {timed(lambda: engine.read_host_file('/proc/stat'), args.reads) * 1e3:8.3f} ms")
        freq = timed(lambda: engine.run_host(["sh", "-c", itf._FREQ_CMD]), args.reads)
        print(f"  freq/throttle shell   {freq * 1e3:8.3f} ms  (skipped after the first sample where the host "
              "exposes neither)")
        print(f"  whole sample()        {timed(lambda: itf.sample(engine, c), args.reads) * 1e3:8.3f} ms")
        print(f"\nfigures over {args.window:g} s windows ({os.cpu_count()} CPUs here):")
        print(f"  {'window':<15}{'others cores':>13}{'others s':>10}{'container s':>12}{'loop cpu s':>11}"
              f"{'steal s':>9}  disturbed")
        for what in ("nothing added", "host loop", "container loop"):
            for _ in range(args.repeats):
                f, extra = window(engine, c, args.window, what)
                print(f"  {what:<15}{f.others_cores:>13.3f}{f.others_s:>10.3f}{f.container_s:>12.3f}"
                      f"{extra:>11.3f}{f.steal_s:>9.3f}  {f.disturbed}")
    finally:
        engine.remove(c)


if __name__ == "__main__":
    main()
