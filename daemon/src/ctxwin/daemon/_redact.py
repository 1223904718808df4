"""Store URLs as the daemon shows them: without any credential.

A Redis URL may carry a password as ``user:password@`` or as a query
parameter (``?password=...``, which redis-py reads too). Everything the
daemon shows of a URL (``stats``, logs, ``inspect``, error messages) goes
through :func:`redact_url` first. Parameter names are compared as redis-py
reads them, percent-decoded (``?pass%77ord=`` is ``password``).
"""

from __future__ import annotations

from urllib.parse import unquote_plus

__all__ = ["redact_url"]

_SECRET_PARAMETERS = frozenset({"password", "pass", "passwd", "pwd", "secret", "token", "auth"})
"""Query parameters whose value is a credential (compared lower-case)."""

REDACTED = "***"


def redact_url(url: str) -> str:
    """``url`` with the password of its user info dropped and credential parameters masked.

    ``redis://user:pw@host:6379/0?password=pw&db=1`` becomes
    ``redis://user@host:6379/0?password=***&db=1``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, hash_sep, fragment = rest.partition("#")
    location, query_sep, query = rest.partition("?")
    userinfo, at, host = location.rpartition("@")
    if at:
        user = userinfo.split(":", 1)[0]
        location = f"{user + '@' if user else ''}{host}"
    if query_sep:
        parameters = []
        for parameter in query.split("&"):
            name, equals, _ = parameter.partition("=")
            if equals and unquote_plus(name).strip().lower() in _SECRET_PARAMETERS:
                parameter = f"{name}={REDACTED}"
            parameters.append(parameter)
        query = "&".join(parameters)
    if hash_sep:
        fragment = REDACTED if fragment else ""
    return f"{scheme}://{location}{query_sep}{query}{hash_sep}{fragment}"
