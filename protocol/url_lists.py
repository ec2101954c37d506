"""Lists of URLs as settings and messages give them: a string (or a sequence of strings), each possibly
comma-separated. ``url_list`` reads one: every entry accepted by the caller's rule, in order, each once, at
most a given number; anything else is an ``InvalidMessage`` naming the entry (never one with credentials:
it may hold a password). Edge URLs (``edge_urls``) and ICE servers (``ice``) are such lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .errors import InvalidMessage

__all__ = ["url_list"]


def url_list(
    listed: str | Sequence[str], *, what: str, form: str, max_urls: int, accepts: Callable[[str], bool], trim: str = ""
) -> list[str]:
    """The URLs of ``listed`` that ``accepts`` takes (each stripped of spaces and trailing ``trim``); an
    ``InvalidMessage`` saying an entry is not ``form``, or that there are more than ``max_urls``."""
    entries = [listed] if isinstance(listed, str) else list(listed)
    if len(entries) > max_urls or not all(isinstance(entry, str) for entry in entries):
        raise InvalidMessage(f"{what}s must be at most {max_urls} strings")
    found: list[str] = []
    for url in (part.strip().rstrip(trim) for entry in entries for part in entry.split(",")):
        if not url:
            continue
        if not accepts(url):
            shown = "a URL with credentials" if "@" in url else repr(url[:60])
            raise InvalidMessage(f"{what} {shown} is not {form}")
        if url not in found:
            found.append(url)
    if len(found) > max_urls:
        raise InvalidMessage(f"at most {max_urls} {what}s")
    return found
