"""Bar charts of benchmark results (`python -m bench ... --plot FILE.png`)."""
from __future__ import annotations

from typing import Mapping


def bar_chart(values: Mapping[str, float], path: str, *, title: str, ylabel: str,
              ratios: bool = True) -> str:
    """One bar per path; with `ratios`, each bar is labelled with its value over the smallest
    (for rows/s: how many times faster than the slowest path). Writes a PNG and returns its
    path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(values)
    heights = [float(values[n]) for n in names]
    floor = min((h for h in heights if h > 0), default=1.0)
    figure, axes = plt.subplots(figsize=(max(4.0, 1.1 * len(names) + 1.5), 3.6), dpi=100)
    bars = axes.bar(names, heights, color="#4878a8")
    labels = [f"{h:,.0f}" + (f"\n{h / floor:.1f}x" if ratios else "") if h >= 100 else
              f"{h:.3g}" for h in heights]
    axes.bar_label(bars, labels=labels, fontsize=8, padding=2)
    axes.set_title(title, fontsize=10)
    axes.set_ylabel(ylabel)
    axes.set_ylim(0, max(heights + [0]) * 1.25 or 1)
    axes.tick_params(axis="x", labelrotation=30, labelsize=8)
    for label in axes.get_xticklabels():
        label.set_horizontalalignment("right")
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
