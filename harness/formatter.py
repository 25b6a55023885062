"""Numbers to text in one place: rates, sizes, percentages, ratios, and text made safe for Markdown."""

from __future__ import annotations

import math
import re
import unicodedata

DASH = "-"


def num(x: float | None, nd: int = 2) -> str:
    """1234.5 -> '1,234.50'; None -> '-'."""
    return DASH if x is None else f"{x:,.{nd}f}"


def fixed(x: float, nd: int) -> str:
    """0.1234, 3 -> '0.123' (no thousands separator: margins, shares, p-values' neighbours)."""
    return f"{x:.{nd}f}"


def signed(x: float, nd: int) -> str:
    """A statistic whose sign is the point: 0.123, 2 -> '+0.12'."""
    return f"{x:+.{nd}f}"


def count(n: int) -> str:
    """12345 -> '12,345'."""
    return f"{n:,}"


def padded(n: int, width: int) -> str:
    """A whole number zero-padded to a width, as in a name the kit makes: 7, 3 -> '007'."""
    return f"{n:0{width}d}"


def plain(x: float) -> str:
    """A setting as written, shortest form: 0.8 -> '0.8', 50.0 -> '50'."""
    return f"{x:g}"


def rounded(x: float | None, nd: int) -> float | None:
    """A figure as a record keeps it (summary.json): rounded to nd decimals; None stays None."""
    return None if x is None else round(float(x), nd)


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


def sig(x: float | None, digits: int = 3) -> str:
    """A factor to `digits` significant digits, so that factors multiply back to their product as printed:
    0.09512 -> '0.0951', 4.2667 -> '4.27', 13.277 -> '13.3'."""
    if x is None:
        return DASH
    if x == 0:
        return "0"
    nd = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:,.{nd}f}"


def points(diff: float | None, nd: int = 1) -> str:
    """A difference of two shares in percentage points: 0.16 -> '+16.0 pts'."""
    return DASH if diff is None else f"{diff * 100:+.{nd}f} pts"


def interval(lo: float | None, hi: float | None, nd: int = 2) -> str:
    """A confidence interval of ratios: '[0.91, 1.12]'."""
    if lo is None or hi is None:
        return DASH
    return f"[{lo:.{nd}f}, {hi:.{nd}f}]"


def braced(lo: float | None, hi: float | None, nd: int = 2) -> str:
    """An interval at another level beside a bracketed one: '{0.97, 1.63}'."""
    if lo is None or hi is None:
        return DASH
    return f"{{{lo:.{nd}f}, {hi:.{nd}f}}}"


def level(confidence: float) -> str:
    """A confidence as a percentage, one decimal at least and as many as keep it below 100%: 0.99969 -> '99.97%'."""
    nd = 1
    while round(confidence * 100, nd) >= 100 and nd < 6:
        nd += 1
    return pct(confidence, nd)


def gbs(x: float | None) -> str:
    return DASH if x is None else f"{x:,.1f} GB/s"


#: What can start markup inside a table cell: emphasis, code, links and images, HTML, a cell boundary, math.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|$])")


def _hidden(ch: str) -> bool:
    """A character a terminal or renderer acts on or hides rather than shows: C0/C1 controls (ESC, CSI, BEL,
    backspace), DEL, format characters (bidi overrides, zero-width), line and paragraph separators, surrogates."""
    o = ord(ch)
    if o < 32 or 127 <= o < 160:
        return True
    return o >= 160 and unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs", "Co")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    o = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{o:02x}" if o < 256 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def visible(text: object, max_len: int | None = None, *, spaces: bool = False) -> str:
    """Text from elsewhere (a run folder, a manifest, a model file, a remote host) with every character that a
    terminal or renderer would act on shown as an escape (ESC as `\\x1b`), so it can neither move the cursor,
    set a title, erase a line nor fake one; with `spaces`, tab and line breaks become spaces instead."""
    s = str(text)
    if max_len is not None and len(s) > max_len:
        s = s[: max_len - 1] + "…"
    if not any(_hidden(ch) for ch in s):
        return s
    return "".join((" " if spaces and ch in "\t\n\r" else _escape(ch)) if _hidden(ch) else ch for ch in s)


def console(text: object, max_len: int | None = 2000) -> str:
    """One line of foreign text for the terminal: control characters and escapes shown visibly, a line break as
    `\\n` (a value cannot start a line of its own), long text cut."""
    return visible(text, max_len)


def console_lines(text: str) -> str:
    """A block the kit rendered itself (its own line breaks kept), each line passed through `console`: a last
    line of defence for values that reached it unescaped."""
    return "\n".join(console(line, None) for line in str(text).split("\n"))


def md(text: object, max_len: int = 300) -> str:
    """Text from a run folder or a manifest, safe inside Markdown (and the HTML a renderer makes of it): control
    characters shown as escapes, line breaks and tabs as spaces, Markdown and HTML specials backslash-escaped,
    long text cut."""
    s = visible(text, max_len, spaces=True)
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return s.replace("&", "&amp;")


def code(text: object, max_len: int = 300) -> str:
    """Text as inline code: backticks cannot close it early, nothing inside is interpreted, control characters
    are shown as escapes."""
    s = visible(text, max_len, spaces=True)
    s = s.replace("`", "'")
    return f"`{s}`"


def pvalue(p: float | None) -> str:
    """0.0004 -> '<0.001', 0.0213 -> '0.021'."""
    if p is None:
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"
