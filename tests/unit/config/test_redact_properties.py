"""Properties of ctu's one redaction function over drawn URLs: userinfo with any characters, URLs without a scheme,
secret-looking query keys in any case and spelling, after ``?``, ``&`` or ``;``; and nothing else changed."""

import json
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ctu.config.redact import REDACTED, forget, is_secret_key, redact, remember, url_problem

MANY = settings(max_examples=200, deadline=None)
SECRET_WORDS = ["token", "access_token", "accessToken", "ACCESS-TOKEN", "api_key", "apiKey", "api-key", "APIKEY",
                "key", "secret", "client_secret", "clientSecret", "password", "Password", "passwd", "pwd", "auth",
                "authorization", "sig", "signature", "X-Amz-Signature", "X-Amz-Credential", "credential",
                "refresh_token", "session_id", "jwt", "private-key", "token2"]
PLAIN_WORDS = ["model", "page", "limit", "format", "v", "max_tokens", "api_key_env", "keyword", "region", "stream"]


def not_space(c: str) -> bool:
    return re.match(r"\s", c) is None


ANY_CHAR = st.characters(blacklist_categories=("Cs",)).filter(not_space)
# what a password may hold for the output to be exact (not merely safe): no '=' (it would start a key=value pair)
EXACT_CHAR = ANY_CHAR.filter(lambda c: c != "=")
VALUE_CHAR = EXACT_CHAR.filter(lambda c: c not in "&;#@")  # a query value ends at & ; # (and '@' ends a userinfo)
SAFE_TEXT = st.text(st.characters(codec="ascii", categories=("L", "N")) | st.sampled_from("-._"), min_size=1,
                    max_size=8)


def cased(word: str):
    return st.sampled_from([word, word.lower(), word.upper()])


@st.composite
def urls(draw, password_char=EXACT_CHAR, scheme=None):
    """(url, what redact should make of it, its secrets)."""
    scheme = draw(st.sampled_from(["http://", "https://", "HTTPS://", "postgres://", ""])) if scheme is None else scheme
    # a URL without a scheme is told from text by its userinfo: none of these (JSON around an e-mail address)
    char = password_char if scheme else password_char.filter(lambda c: c not in "\"'<>(){}[],")
    user = draw(SAFE_TEXT)
    password = draw(st.text(char, min_size=3, max_size=24))
    host = draw(st.sampled_from(["localhost", "127.0.0.1", "[::1]", "llm.example.com", "h"]))
    port = draw(st.sampled_from(["", ":1", ":8443"]))
    path = draw(st.sampled_from(["", "/", "/v1", "/openai/v1/"]))
    if not scheme and not port and not path:
        path = "/v1"
    query, expected_query, secrets = [], [], [password]
    for i, secret in enumerate(draw(st.lists(st.booleans(), max_size=4))):
        key = draw(st.sampled_from(SECRET_WORDS if secret else PLAIN_WORDS).flatmap(cased))
        value = draw(st.text(VALUE_CHAR, min_size=3, max_size=16) if secret else SAFE_TEXT)
        sep = "?" if i == 0 else draw(st.sampled_from("&;"))
        query.append(f"{sep}{key}={value}")
        expected_query.append(f"{sep}{key}={REDACTED if secret else value}")
        if secret:
            secrets.append(value)
    url = f"{scheme}{user}:{password}@{host}{port}{path}{''.join(query)}"
    expected = f"{scheme}{REDACTED}@{host}{port}{path}{''.join(expected_query)}"
    assume(not any(secret in expected for secret in secrets))  # so that finding a secret in the output is a leak
    return url, expected, secrets


@MANY
@given(urls())
def test_a_url_loses_its_userinfo_and_secret_values_and_nothing_else(case):
    url, expected, _ = case
    assert redact(url) == expected


@MANY
@given(urls(password_char=ANY_CHAR, scheme="https://"))
def test_a_password_of_any_characters_never_survives(case):
    url, _, secrets = case
    out = redact(url)
    for secret in secrets:
        assert secret not in out


@MANY
@given(urls(password_char=ANY_CHAR), st.sampled_from(["{} failed", "'{}'", "url={}.", "(see {})", '"{}"']))
def test_a_url_inside_text_never_shows_its_secrets(case, frame):
    url, _, secrets = case
    out = redact(f"Invalid URL {frame.format(url)}: retrying")
    for secret in secrets:
        assert secret not in out


@MANY
@given(urls(), st.text(st.characters(blacklist_characters="@="), max_size=20).map(lambda s: s + " "))
def test_text_around_a_url_is_kept(case, before):
    url, expected, _ = case
    assume("://" not in before)
    assert redact(f"{before}{url} and more") == f"{before}{expected} and more"


@MANY
@given(st.text(st.characters(blacklist_characters="@=", blacklist_categories=("Cs",))))
def test_text_without_at_or_equals_is_unchanged(text):
    assert redact(text) == text


@MANY
@given(st.emails().filter(lambda e: "=" not in e))
def test_e_mail_addresses_stay(email):
    for text in (email, f"write to {email} today", json.dumps({"email": email, "zip": "1"}, separators=(",", ":"))):
        assert redact(text) == text


@MANY
@given(urls(password_char=ANY_CHAR))
def test_redaction_is_idempotent(case):
    once = redact(f"x {case[0]} y")
    assert redact(once) == once


@given(st.sampled_from(SECRET_WORDS).flatmap(cased), st.sampled_from(["", "x_", "X-", "my", "client."]))
def test_secret_keys_in_any_case_and_spelling(word, prefix):
    assert is_secret_key(prefix + word)


@given(st.sampled_from(PLAIN_WORDS).flatmap(cased))
def test_plain_keys_are_not_secret(word):
    assert not is_secret_key(word)


@MANY
@given(st.text(ANY_CHAR, min_size=4, max_size=20), st.text(max_size=30), st.text(max_size=30))
def test_a_remembered_secret_is_removed_wherever_it_appears(secret, before, after):
    try:
        remember(secret)
        assert secret not in redact(before + secret + after)
    finally:
        forget()


def test_url_problems_never_quote_the_url():
    for url, problem in [("https://user:s3cr/etPW@host:1/v1", "'@' after the host"),
                         ("https://user:s3cr#etPW@host:1/v1", "'@' after the host"),
                         ("https://user:s3cr?etPW@host:1/v1", "'@' after the host"),
                         ("https://user:p@ss@host:1/v1", "more than one"),
                         ("user:secret@localhost:1/v1", "http:// or https://"),
                         ("https://user:my secret@host/v1", "whitespace")]:
        message = url_problem(url)
        assert message is not None and problem in message, url
        assert "etPW" not in message and "secret" not in message and "ss@" not in message
    assert url_problem("https://user:s3cr%2FetPW@host:1/v1?api_key=a%40b") is None
    assert url_problem("http://127.0.0.1:8000/v1") is None
