"""Credentials out of URLs before they are shown or saved: userinfo (``user:password@``) and the values of
secret-looking query parameters (``api_key``, ``token``, ``sig``, ...) become ``<redacted>``."""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_SECRET_PARAM = re.compile(r"(^|[_-])(api[_-]?key|key|token|secret|password|passwd|pwd|sig|signature|auth|"
                           r"authorization|credential|credentials|session)$", re.I)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_AUTHORITY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#]*)(?P<rest>.*)$", re.S)


def _query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, eq, value = part.partition("=")
        parts.append(f"{name}={REDACTED}" if eq and value and _SECRET_PARAM.search(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with its userinfo and secret query values replaced; anything not a URL is returned unchanged."""
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    authority = match["authority"]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    rest, fragment = match["rest"], ""
    if "#" in rest:
        rest, fragment = rest.split("#", 1)
        fragment = "#" + fragment
    if "?" in rest:
        path, query = rest.split("?", 1)
        rest = f"{path}?{_query(query)}"
    return f"{match['scheme']}{authority}{rest}{fragment}"


def redact_urls(text: str) -> str:
    """Every URL inside free text (an error message, a log line) redacted as :func:`redact_url` does."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)
