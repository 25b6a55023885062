"""URLs a manifest names (a git repository, a package index for the source or for a model) and the links an index
answers with: one rule for all of them.

- Always: a URL a manifest names is well formed (a scheme, a host, a numeric port, no spaces or control
  characters) and carries no credentials; a shared manifest would hand them on, and errors would print them.
- Without --trust-source: https and the official host (the llama.cpp repository on GitHub, PyPI). Anything else
  is a build input the user must vouch for (harness/intake/trust.py).
- Links and redirects an index answers with are followed only to the index's own scheme, host and port (for
  PyPI also files.pythonhosted.org, where it keeps the files); a file:// index only to regular files inside
  its own folder. An index cannot point the kit at /etc/passwd, /dev/zero or a cloud metadata address.

Credentials that come from the user's own configuration (PIP_INDEX_URL) are redacted wherever a URL is
recorded or printed."""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

OFFICIAL_GIT = "https://github.com/ggml-org/llama.cpp"
OFFICIAL_INDEX = "https://pypi.org/simple"
#: Where PyPI's simple pages link their files.
PYPI_FILES = "https://files.pythonhosted.org"


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/").removesuffix(".git").lower()


def is_official_git(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_GIT.lower()


def is_official_index(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_INDEX


def has_credentials(url: str) -> bool:
    """Whether a URL carries a user or a token (https://user:token@host/...); over ssh a user alone
    (ssh://git@host/...) is a login name, not a secret."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "@" in url
    if not parts.netloc or "@" not in parts.netloc:
        return False
    userinfo = parts.netloc.rsplit("@", 1)[0]
    return parts.scheme.lower() not in ("ssh", "git+ssh") or ":" in userinfo


def redact_url(url: str) -> str:
    """A URL without the user and password of its address, for anything recorded or printed."""
    if not has_credentials(url):
        return url
    try:
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
    except ValueError:
        return "***"


def url_problem(url: str, *, local_ok: bool = False) -> str | None:
    """Why a URL a manifest names cannot be used at all (whatever the user trusts), or None.

    local_ok: a plain path is allowed too (a git repository on this machine, which --trust-source may name)."""
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in url):
        return "contains spaces or control characters"
    if has_credentials(url):
        return "carries credentials; a manifest is shared: keep them in a git credential helper, ~/.netrc or pip's " \
               "configuration"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        return f"is not a valid URL ({e})"
    if not parts.scheme or len(parts.scheme) == 1:  # "C:" is a drive, not a scheme
        return None if local_ok and not url.startswith("-") else "is not a URL (no scheme://)"
    if parts.scheme not in ("https", "http", "file", "ssh", "git"):
        return f"has the scheme {parts.scheme!r}; expected https"
    if parts.scheme != "file" and not parts.hostname:
        return "names no host"
    return None


def untrusted_reason(url: str, official: str) -> str | None:
    """Why a URL needs the user's word (--trust-source): not https, or not the official host; None for the
    official one."""
    if _norm_url(url) == _norm_url(official):
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return f"not https ({parts.scheme or 'a local path'})"
    return f"not the official {official}"


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str, int | None]:
    default = {"https": 443, "http": 80}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def link_problem(index: str, link: str) -> str | None:
    """Why the kit does not follow a link (or redirect) an index gave, or None: it must stay on the index's own
    scheme, host and port (PyPI's also on files.pythonhosted.org); from a file:// index, inside its folder."""
    try:
        base, there = urllib.parse.urlsplit(index), urllib.parse.urlsplit(link)
        there_origin = _origin(there)
    except ValueError as e:
        return f"not a valid URL ({e})"
    if has_credentials(link):
        return "it carries credentials"
    if base.scheme == "file":
        if there.scheme != "file" or there.netloc not in ("", "localhost"):
            return "a file:// index links only to files inside its own folder"
        root = Path(os.path.realpath(urllib.request.url2pathname(base.path.rstrip("/")))).parent
        target = Path(os.path.realpath(urllib.request.url2pathname(there.path)))
        if root == Path("/") or not target.is_relative_to(root):
            return f"it lies outside the index's folder {root}"
        return None
    allowed = [_origin(base)]
    if is_official_index(index):
        allowed.append(_origin(urllib.parse.urlsplit(PYPI_FILES)))
    if there_origin not in allowed:
        hosts = " or ".join(f"{s}://{h}" + (f":{p}" if p not in (None, 443, 80) else "") for s, h, p in allowed)
        return f"links are followed only to {hosts}"
    return None


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Redirects are links too: followed only where `link_problem` allows."""

    def __init__(self, index: str) -> None:
        self.index = index

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        problem = link_problem(self.index, newurl)
        if problem:
            raise urllib.error.URLError(f"redirected to {redact_url(newurl)[:200]}: {problem}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def open_link(index: str, url: str, timeout_s: float, accept: str | None = None) -> Any:
    """Open a URL that `index` (or the index itself) named, by the rule above: the link and every redirect must
    stay where the index is; a file:// target must be a regular file (a folder is read through its
    index.html, as pip does). Raises urllib.error.URLError with the reason."""
    if url != index:
        problem = link_problem(index, url)
        if problem:
            raise urllib.error.URLError(problem)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        raise urllib.error.URLError(f"unsupported URL scheme {parts.scheme!r}")
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        if path.is_dir():
            path = path / "index.html"
        if not path.is_file():  # /dev/zero, a FIFO: read forever; a folder without index.html: nothing
            raise urllib.error.URLError(FileNotFoundError(f"{path} is not a regular file"))
        url = path.as_uri()
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    return urllib.request.build_opener(_SameOrigin(index)).open(req, timeout=timeout_s)
