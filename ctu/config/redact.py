"""The one redaction function: :func:`redact`, applied to everything ctu shows or writes.

It replaces with ``<redacted>``:

- every secret registered with :func:`remember` or :func:`remember_in` (API keys read from the environment, the
  passwords and secret query values of the config's URLs when it is loaded) as a whole, percent-decoded and
  percent-encoded, of at least 4 characters; its pieces only where a URL parser would split it (a raw ``/``, ``?``,
  ``#``, ``@`` or whitespace in a password: a URL the config refuses);
- the userinfo of a URL with a scheme: everything between ``://`` and the last ``@`` before whitespace, whatever
  characters it holds (``https://user:s3cr/etPW@host`` -> ``https://<redacted>@host``);
- the userinfo of a URL without a scheme (``user:secret@localhost:1/v1``) when it holds a ``:`` or the host is
  followed by a port or a path (so ``name@example.com`` stays);
- the value of every ``key=value`` whose key looks secret (:func:`is_secret_key`), after ``?``, ``&``, ``;``, ``#``,
  whitespace or at the start of the text.

:func:`redact_data` applies it to every string of nested data (and blanks string values under secret-looking keys);
:func:`url_problem` says what is wrong with a URL a config gives, without quoting it.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

REDACTED = "<redacted>"
MIN_REMEMBERED = 4  # shorter values cannot be told from ordinary text: they are redacted by shape only
_SECRET_ENDINGS = ("key", "token", "secret", "password", "passwd", "pwd", "pass", "auth", "authorization", "sig",
                   "signature", "credential", "credentials", "session", "sessionid", "jwt", "cookie", "bearer")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_WITH_SCHEME = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>\S*)@")
_NOT_USERINFO = "\\s\"'<>(){}\\[\\],"  # a scheme-less userinfo holds none of these (JSON around an e-mail address)
_WITHOUT_SCHEME = re.compile(
    rf"(?<![^{_NOT_USERINFO}])(?P<userinfo>[^{_NOT_USERINFO}]+)@"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%]+)(?P<port>:\d*)?(?P<path>[/?#])?")
# only ``key=`` is consumed, so that a pair inside a value that is not secret is seen too
_PAIR = re.compile(r"(?:^|(?<=[?&;#\s]))(?P<key>[^\s=&;#?]+)=(?=(?P<value>[^\s&;#]+))")
_known: set[str] = set()
_known_pattern: re.Pattern[str] | None = None


def is_secret_key(name: str) -> bool:
    """Whether a query or config key names a secret, in any case and spelling: ``token``, ``access_token``,
    ``accessToken``, ``api-key``, ``X-Amz-Signature``, ``client_secret``, ``pwd``, ``sig``... (the key, stripped of
    everything but letters and digits and of trailing digits, ends with a secret word). ``api_key_env`` (the name of a
    variable, not its value) and ``max_tokens`` are not."""
    normal = re.sub(r"[^a-z0-9]", "", unquote(name).lower()).rstrip("0123456789")
    return bool(normal) and normal.endswith(_SECRET_ENDINGS)


def _forms(secret: str) -> set[str]:
    """A secret as a whole: as given, percent-decoded, and percent-encoded (upper- and lower-case hex), never its
    pieces (a password ``Xy%2Fmini%2Ftest`` must not take every "mini" and "test" of the records with it)."""
    decoded = unquote(secret)
    encoded = quote(decoded, safe="")
    forms = {secret, decoded, encoded, re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), encoded)}
    return {form for form in forms if len(form) >= MIN_REMEMBERED}


def _parser_pieces(password: str) -> list[str]:
    """The pieces a URL parser quotes back from a password holding a raw ``/``, ``?``, ``#``, ``@`` or whitespace (it
    splits the URL there: ``Invalid port: 's3cr'`` for ``https://user:s3cr/etPW@host``); none for a well-formed one,
    whose delimiters are percent-encoded. The config refuses such URLs; a client built in code may still get one."""
    if not re.search(r"[\s/?#@]", password):
        return []
    return [piece for piece in re.split(r"[\s/?#@:]+", password) if piece]


def remember(*secrets: str | None) -> None:
    """Register secret values (an API key, a password) so that :func:`redact` removes them wherever they appear."""
    global _known_pattern
    new = set()
    for secret in secrets:
        if secret:
            new |= _forms(secret)
    if new - _known:
        _known.update(new)
        _known_pattern = re.compile("|".join(re.escape(s) for s in sorted(_known, key=len, reverse=True)))


def _secret_of(userinfo: str) -> str:
    """The password of ``user:password``; a userinfo without ``:`` is a token as a whole."""
    return userinfo.partition(":")[2] if ":" in userinfo else userinfo


def _spans(text: str, found: list[str]) -> list[tuple[int, int]]:
    """Where ``text`` holds a credential, by each rule applied to the original text (so that one rule's match cannot
    hide another's: ``https://u:p@h/v1?api_key=ab@cd``); the secrets found by shape are appended to ``found``."""
    spans = [m.span() for m in _known_pattern.finditer(text)] if _known_pattern is not None else []
    if "@" in text:
        for m in _WITH_SCHEME.finditer(text):
            spans.append(m.span("userinfo"))
            found += [_secret_of(m["userinfo"]), *_parser_pieces(_secret_of(m["userinfo"]))]
        for m in _WITHOUT_SCHEME.finditer(text):
            userinfo = m["userinfo"]
            if not _SCHEME.match(userinfo) and (":" in userinfo or m["port"] or m["path"]):
                spans.append(m.span("userinfo"))
                found += [_secret_of(userinfo), *_parser_pieces(_secret_of(userinfo))]
    if "=" in text:
        for m in _PAIR.finditer(text):
            if m["value"] != REDACTED and is_secret_key(m["key"]):
                spans.append(m.span("value"))
                found.append(m["value"])
    return [span for span in spans if span[1] > span[0]]


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    """Each run of overlapping or touching spans replaced by one ``<redacted>``."""
    out: list[str] = []
    pos = 0
    for start, end in sorted(spans):
        if start > pos or not out:
            out += [text[pos:start], REDACTED]
        pos = max(pos, end)
    return "".join(out) + text[pos:]


def redact(text: str) -> str:
    """``text`` with every credential removed (see the module's docstring): the one function every console line,
    log record, saved config, W&B config and command line, trajectory, report and error message goes through."""
    if not isinstance(text, str) or not text:
        return text
    spans = _spans(text, [])
    return _replace(text, spans) if spans else text


def secrets_in(text: str) -> list[str]:
    """The credentials :func:`redact` would remove from ``text`` by their shape (userinfo, secret query values)."""
    found: list[str] = []
    _spans(text, found)
    return [secret for secret in found if secret and secret != REDACTED]


def remember_in(node: Any) -> None:
    """Register the credentials in every string of nested data (a config's URLs): the passwords and secret query
    values :func:`redact` finds by shape, so that they are removed also where they appear without their URL."""
    if isinstance(node, dict):
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        for value in node:
            remember_in(value)
    elif isinstance(node, str):
        remember(*secrets_in(node))


def redact_data(node: Any) -> Any:
    """Nested dicts and lists with every string redacted, and non-empty strings under secret-looking keys
    (:func:`is_secret_key`) replaced whole."""
    if isinstance(node, dict):
        return {k: (REDACTED if isinstance(v, str) and v and is_secret_key(str(k)) else redact_data(v))
                for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [redact_data(v) for v in node]
    if isinstance(node, str):
        return redact(node)
    return node


def url_problem(url: str) -> str | None:
    """What keeps ``url`` from being a well-formed http(s) base URL whose credentials :func:`redact` finds (no
    fragment: ctu joins paths onto it; a query is kept as the query), in words that never quote it; None when it is
    fine."""
    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return "holds whitespace or a control character (percent-encode it: a space is %20)"
    match = re.match(r"https?://", url, re.I)
    if match is None:
        return "must start with http:// or https://"
    rest = url[match.end():]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in rest[len(authority):] or authority.count("@") > 1:
        return ("has an '@' after the host or more than one: inside user:password, percent-encode '/' as %2F, "
                "'?' as %3F, '#' as %23 and '@' as %40")
    if "#" in rest:
        return ("has a '#' fragment, which a server never receives (paths would be joined after it): remove it, "
                "or percent-encode '#' as %23")
    return None


def forget() -> None:
    """Clear what :func:`remember` registered (between tests; a command keeps it for its whole run)."""
    global _known_pattern
    _known.clear()
    _known_pattern = None
