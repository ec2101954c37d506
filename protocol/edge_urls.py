"""Lists of edge URLs: the edges a peer is given (``--edge``, tried in order), the edges an edge
follows (``--follow``) and the edges a page is told about (the relay welcome's ``mirrors``).

``edge_urls`` reads one such list, given as a sequence of strings, each possibly a comma-separated
list: every entry an ``http(s)://host[:port]`` URL (a path allowed, no query or fragment), at most
``MAX_EDGE_URLS`` of them, each at most ``MAX_URL_CHARS``, in order, each once, without a trailing
slash. Anything else is an ``InvalidMessage`` saying which entry: a list from the network is hostile.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from .errors import InvalidMessage

__all__ = ["MAX_EDGE_URLS", "MAX_URL_CHARS", "edge_urls"]

MAX_EDGE_URLS = 16
MAX_URL_CHARS = 256


def edge_urls(listed: str | Sequence[str]) -> list[str]:
    """The edge URLs of ``listed`` (the rules above); an empty list when it names none."""
    entries = [listed] if isinstance(listed, str) else list(listed)
    if len(entries) > MAX_EDGE_URLS or not all(isinstance(entry, str) for entry in entries):
        raise InvalidMessage(f"edge URLs must be at most {MAX_EDGE_URLS} strings")
    found: list[str] = []
    for url in (part.strip().rstrip("/") for entry in entries for part in entry.split(",")):
        if not url:
            continue
        parts = urlsplit(url) if len(url) <= MAX_URL_CHARS else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            shown = url[:40] if "@" not in url else "a URL with credentials"
            raise InvalidMessage(
                f"edge URL {shown!r} is not http(s)://host[:port] of at most {MAX_URL_CHARS} characters"
            )
        if url not in found:
            found.append(url)
    if len(found) > MAX_EDGE_URLS:
        raise InvalidMessage(f"at most {MAX_EDGE_URLS} edge URLs")
    return found
