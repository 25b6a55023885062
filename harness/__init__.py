"""specbench-kit: benchmark speculative decoding in llama.cpp with one fresh container per measurement.

The package's rooms, each importing only the ones listed below it (tests/test_layout.py checks this, and that no
module imports inside a function to dodge a loop):

    share      bundles and reproduction
    run        plan, protocol, server, client, executor, the `invoke run` use case
    report     RESULTS.md, its sections and plots, a comparison in words (words and pictures of verdicts)
    analysis   statistics, checks, summary, compare                    (pure functions of run folders)
    image      source, bases, build plan, build, finding images
    store      run folders, run.json (typed: strategies, tasks, models, plan), safe archives
    models     model files, GGUF headers, pre-flight, bytes per pass
    hosts      the Engine interface: local Docker, remote over SSH
    intake     manifests, allowed flags, URLs, trust
    (root)     errors and paths here, files.py, schema.py, formatter.py: every room may import these

Data flows one way: manifest -> plan -> measurements.jsonl -> summary.json -> RESULTS.md."""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (schemas/, docker/, manifests/ live here).
ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"
DOCKER = ROOT / "docker"
MANIFESTS = ROOT / "manifests"
DEFAULT_MANIFEST = MANIFESTS / "demo-cpu.yaml"

#: Label put on every container and image the kit creates, so `invoke clean` finds them.
LABEL_PREFIX = "specbench"


class KitError(Exception):
    """An error the user can fix; its message is one line, printed without a traceback."""
