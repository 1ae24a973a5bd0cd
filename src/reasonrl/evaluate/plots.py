"""Training-curve plots: one PNG per panel, every run on the same axes.

Used for the plots of a single run (``RUN_DIR/plots``) and by ``reasonrl report``.
Noisy per-step curves are drawn faintly with an exponential moving average on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Panel name → the metric keys it shows (first present key family wins per run).
PANELS: dict[str, list[str]] = {
    "reward": ["reward/mean"],
    "accuracy": ["eval/accuracy"],
    "entropy": ["entropy"],
    "kl": ["kl"],
    "response_length": ["response_length/mean"],
    "clip_fraction": ["clip_fraction"],
    "sampling_throughput": ["perf/sample_tokens_per_s"],
    "training_throughput": ["perf/train_tokens_per_s"],
}
_SMOOTH_ABOVE = 20  # points; shorter curves are drawn as they are
_STYLES = ["-", "--", ":", "-."]


@dataclass
class Series:
    label: str
    rows: list[dict[str, Any]]
    color_index: int = 0
    style_index: int = 0


def ema(values: list[float], alpha: float) -> list[float]:
    out, running = [], None
    for v in values:
        running = v if running is None else alpha * v + (1 - alpha) * running
        out.append(running)
    return out


def points(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def plot_panel(name: str, keys: list[str], series: list[Series], path: Path,
               max_step: int | None = None) -> bool:
    """Draw ``keys`` of every series on one axes; returns False if nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = False
    for s in series:
        for key_index, key in enumerate(keys):
            xs, ys = points(s.rows, key)
            if not xs:
                continue
            drawn = True
            color = colors[s.color_index % len(colors)]
            style = _STYLES[(s.style_index + key_index) % len(_STYLES)]
            label = s.label if len(keys) == 1 else f"{s.label}: {key}"
            if len(xs) > _SMOOTH_ABOVE:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8, linestyle=style)
                ax.plot(xs, ema(ys, 2 / (1 + len(xs) / 10)), color=color, linestyle=style, label=label)
            else:
                ax.plot(xs, ys, color=color, linestyle=style, marker="o", markersize=3, label=label)
    if not drawn:
        plt.close(fig)
        return False
    if max_step:
        ax.set_xlim(0, max_step)
    ax.set_xlabel("step")
    ax.set_title(name if len(keys) > 1 else f"{name} ({keys[0]})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_plots(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """The standard panels of one run, as PNGs in ``out_dir`` (panels never logged are skipped)."""
    written = []
    for name, keys in PANELS.items():
        path = out_dir / f"{name}.png"
        if plot_panel(name, keys, [Series("run", rows)], path):
            written.append(path)
    return written
