"""Drawing a run folder's figures with matplotlib, whose text comes from elsewhere.

A strategy id, a sweep value, a host label or a manifest name is drawn as plain text: never parsed as mathtext
(`$\\undefinedmacro{x}$` would raise in a tick label) or LaTeX, with control characters shown as escapes. And what
matplotlib says while drawing (a glyph missing from the font quotes the character) stays out of the terminal."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from harness import formatter as fm
from harness.files import atomic_write_bytes

#: Every text is drawn as it is: no mathtext, no LaTeX.
PLAIN_TEXT = {"text.usetex": False, "text.parse_math": False}


def label(text: object, max_len: int = 100) -> str:
    """Foreign text as a plot draws it: control characters as visible escapes, long text cut."""
    return fm.visible(text, max_len, spaces=True)


@contextlib.contextmanager
def pyplot() -> Iterator[Any]:
    """matplotlib.pyplot on the Agg backend, every text plain (PLAIN_TEXT), and matplotlib's warnings and log
    lines held back while it draws (they may quote the text being drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    logger = logging.getLogger("matplotlib")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), plt.rc_context(cast(Any, PLAIN_TEXT)):
            warnings.simplefilter("ignore")
            yield plt
    finally:
        logger.setLevel(level)


def save(plt: Any, fig: Any, path: Path) -> Path:
    """A figure as a PNG written whole (no timestamp or software name inside, so a redraw is byte for byte the
    same), the figure closed."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
    return path
