"""PNG plots of a stage's main curves from its metrics.jsonl (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxswe.run.metrics import read_rows

# Curves drawn when present, in this order; each gets its own panel.
MAIN_CURVES = (
    "reward_mean",
    "pass_rate",
    "loss",
    "mean_turns",
    "submit_ratio",
    "entropy",
    "clip_fraction",
    "logprob_gap_mean_abs",
    "groups_kept",
    "tokens_per_s",
)


def plot_metrics(metrics_path: str | Path, out_path: str | Path, *, title: str = "") -> list[str]:
    """Draw every MAIN_CURVES key found in the rows against `step`; return the keys drawn."""
    import matplotlib  # imported here: slow, and only needed once a stage ends

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[dict[str, Any]] = read_rows(metrics_path)
    keys = [k for k in MAIN_CURVES if any(isinstance(r.get(k), int | float) for r in rows)]
    ncols = 3
    nrows = max(1, -(-len(keys) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 3 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    if not keys:
        axes.flat[0].text(0.5, 0.5, "no metrics", ha="center", va="center")
    fig.suptitle(title)
    fig.tight_layout()
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=80)
    plt.close(fig)
    return keys


def plot_eval(report: dict[str, Any], out_path: str | Path, *, title: str = "") -> list[tuple[str, float]]:
    """One bar per task (its success rate over the samples), the overall pass@1 and its 95% interval;
    returns the (task, rate) bars drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted(report.get("per_task", {}).items())
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(tasks) + 2), 3.5))
    ax.bar(range(len(tasks)), [t["rate"] for _, t in tasks], color="tab:blue")
    ax.set_xticks(range(len(tasks)), [name for name, _ in tasks], rotation=60, ha="right", fontsize=7)
    lo, hi = report["pass_at_1_ci95"]
    ax.axhline(report["pass_at_1"], color="black", label=f"pass@1 {report['pass_at_1']:.3f}")
    ax.axhspan(lo, hi, color="gray", alpha=0.25, label=f"95% interval [{lo:.3f}, {hi:.3f}]")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel(f"success rate ({report.get('num_episodes', '?')} episodes)")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=80)
    plt.close(fig)
    return [(name, t["rate"]) for name, t in tasks]
