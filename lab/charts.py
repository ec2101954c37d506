"""A dependency-free SVG line chart of test accuracy over heads, one line per experiment."""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["accuracy_svg"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def accuracy_svg(lineage: dict[str, list[dict[str, Any]]], target: float, width: int = 640, height: int = 360) -> str:
    left, right, top, bottom = 50, 20, 20, 40
    windows = max((len(heads) - 1 for heads in lineage.values()), default=1) or 1

    def x(window: int) -> float:
        return left + (width - left - right) * window / windows

    def y(accuracy: float) -> float:
        return top + (height - top - bottom) * (1.0 - accuracy)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.2f}</text>')
    parts.append(
        f'<line x1="{left}" x2="{width - right}" y1="{y(target):.1f}" y2="{y(target):.1f}" stroke="#999" stroke-dasharray="4 3"/>'
    )
    for i, (key, heads) in enumerate(sorted(lineage.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        points = " ".join(f"{x(h['window']):.1f},{y(h['test_accuracy']):.1f}" for h in heads if "test_accuracy" in h)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{left + 10}" y="{top + 16 + 16 * i}" fill="{colour}">{escape(key)}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">window (head)</text>')
    parts.append("</svg>")
    return "\n".join(parts)
