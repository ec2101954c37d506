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

from .url_lists import url_list

__all__ = ["MAX_EDGE_URLS", "MAX_URL_CHARS", "edge_urls"]

MAX_EDGE_URLS = 16
MAX_URL_CHARS = 256


def edge_urls(listed: str | Sequence[str]) -> list[str]:
    """The edge URLs of ``listed`` (the rules above); an empty list when it names none."""
    return url_list(
        listed,
        what="edge URL",
        form=f"http(s)://host[:port] of at most {MAX_URL_CHARS} characters",
        max_urls=MAX_EDGE_URLS,
        accepts=_accepted,
        trim="/",
    )


def _accepted(url: str) -> bool:
    parts = urlsplit(url) if len(url) <= MAX_URL_CHARS else None
    return (
        parts is not None
        and parts.scheme in ("http", "https")
        and bool(parts.netloc)
        and not (parts.query or parts.fragment)
    )
