"""PNG plots of a run's training curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOTS = {
    "reward": ["reward/mean"],
    "accuracy": ["reward/exact_answer", "eval/accuracy"],
    "entropy": ["entropy"],
    "kl": ["kl"],
    "response_length": ["response_length/mean"],
}


def write_plots(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(points) < 10 else None, label=key)
        if not ax.lines:
            ax.text(0.5, 0.5, f"'{name}' not logged in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("step")
        ax.set_title(name)
        if ax.lines:
            ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
