"""specbench-kit: benchmark speculative decoding in llama.cpp with one fresh container per measurement."""

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
