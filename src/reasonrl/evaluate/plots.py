"""Training-curve plots: one PNG per panel, every run on the same axes, and the same curves as
data for the report page's interactive plots (:func:`panel_series`).

The PNGs are the plots of a single run (``RUN_DIR/plots``) and the static copies ``reasonrl
report`` writes beside its page. Noisy per-step curves are drawn faintly with an exponential
moving average on top, in both.
"""

from __future__ import annotations

import math
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
MAX_POINTS = 1500  # per curve in the page: more cannot be told apart at its width, and would only swell the file
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


def smoothing(num_points: int) -> float:
    """The EMA weight of a curve of ``num_points`` points: about a tenth of the run per time constant."""
    return 2 / (1 + num_points / 10)


def panel_series(keys: list[str], series: list[Series]) -> list[dict[str, Any]]:
    """The curves of one panel as the page draws them: per series (``run``: its index) and key,
    the steps ``x``, the values ``y`` and, past ``_SMOOTH_ABOVE`` points, their moving average
    ``s`` (computed over every point before thinning, as in the PNG). Non-finite values are left
    out (JSON has no NaN); more than ``MAX_POINTS`` points are thinned evenly, keeping both ends;
    values keep 6 significant digits."""
    out = []
    for index, s in enumerate(series):
        for key in keys:
            xs, ys = points(s.rows, key)
            finite = [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
            if not finite:
                continue
            xs, ys = [p[0] for p in finite], [p[1] for p in finite]
            smooth = ema(ys, smoothing(len(xs))) if len(xs) > _SMOOTH_ABOVE else None
            keep = _evenly(len(xs), MAX_POINTS)
            out.append({"run": index, "key": key, "x": [xs[i] for i in keep], "y": [_short(ys[i]) for i in keep],
                        "s": None if smooth is None else [_short(smooth[i]) for i in keep]})
    return out


def _evenly(n: int, most: int) -> list[int]:
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


def _short(value: float) -> float:
    return float(f"{value:.6g}")


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
                ax.plot(xs, ema(ys, smoothing(len(xs))), color=color, linestyle=style, label=label)
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
