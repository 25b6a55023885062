"""Numbers to text in one place: rates, sizes, percentages, ratios, and text made safe for Markdown."""

from __future__ import annotations

import re

DASH = "-"


def num(x: float | None, nd: int = 2) -> str:
    """1234.5 -> '1,234.50'; None -> '-'."""
    return DASH if x is None else f"{x:,.{nd}f}"


def rate(tok_s: float | None) -> str:
    """Tokens per second with a precision that suits its size."""
    if tok_s is None:
        return DASH
    return f"{tok_s:,.1f}" if tok_s >= 100 else f"{tok_s:,.2f}"


def size(n_bytes: float | None) -> str:
    """Bytes in decimal units: '11.4 MB', '17.5 GB'."""
    if n_bytes is None:
        return DASH
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:,.1f} {unit}"
    return f"{n_bytes:,.0f} B"


def pct(fraction: float | None, nd: int = 0) -> str:
    """0.123 -> '12%'."""
    return DASH if fraction is None else f"{fraction * 100:.{nd}f}%"


def ratio(x: float | None, nd: int = 2) -> str:
    """1.234 -> '1.23x'."""
    return DASH if x is None else f"{x:.{nd}f}x"


def interval(lo: float | None, hi: float | None, nd: int = 2) -> str:
    """A confidence interval of ratios: '[0.91, 1.12]'."""
    if lo is None or hi is None:
        return DASH
    return f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def gbs(x: float | None) -> str:
    return DASH if x is None else f"{x:,.1f} GB/s"


#: What can start markup inside a table cell: emphasis, code, links and images, HTML, a cell boundary, math.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|$])")


def md(text: object, max_len: int = 300) -> str:
    """Text from a run folder or a manifest, safe inside Markdown (and the HTML a renderer makes of it): control
    characters and line breaks become spaces, Markdown and HTML specials are backslash-escaped, long text is cut."""
    s = "".join(" " if ord(ch) < 32 or ord(ch) == 127 else ch for ch in str(text))
    if len(s) > max_len:
        s = s[: max_len - 1] + "…"
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return s.replace("&", "&amp;")


def code(text: object, max_len: int = 300) -> str:
    """Text as inline code: backticks cannot close it early and nothing inside is interpreted."""
    s = "".join(" " if ord(ch) < 32 or ord(ch) == 127 else ch for ch in str(text))[:max_len]
    s = s.replace("`", "'")
    return f"`{s}`"


def pvalue(p: float | None) -> str:
    """0.0004 -> '<0.001', 0.0213 -> '0.021'."""
    if p is None:
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"
