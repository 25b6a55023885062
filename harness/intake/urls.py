"""URLs a manifest names (a git repository, a package index): which are the official ones, and credentials, which a
shared manifest must not carry and which are redacted wherever a URL is recorded or printed."""

from __future__ import annotations

import urllib.parse

OFFICIAL_GIT = "https://github.com/ggml-org/llama.cpp"
OFFICIAL_INDEX = "https://pypi.org/simple"


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/").removesuffix(".git").lower()


def is_official_git(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_GIT.lower()


def is_official_index(url: str) -> bool:
    return _norm_url(url) == OFFICIAL_INDEX


def has_credentials(url: str) -> bool:
    """Whether an http(s) URL carries a user or a token (https://user:token@host/...)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and "@" in parts.netloc


def redact_url(url: str) -> str:
    """A URL without the user and password of its http(s) address, for anything recorded or printed."""
    if not has_credentials(url):
        return url
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
