"""Learning curves as PNG, from SQL over a run's log (matplotlib Agg; live runs too, through a
snapshot). Each metric is one query returning (x, y, version, n): points coloured by weight version,
a line through the per-x means; ``engine_busy``, ``trainer_busy``, ``sandbox_busy`` and
``tokens_per_s`` plot the ``time_accounting`` view.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stacx.errors import ConfigError, StacxError
from stacx.store import db

# groups of a periodic eval during training (the recipe's [eval]): the "eval" panel, not the rest
PERIODIC = "SELECT group_id FROM task_scheduled t WHERE to_json(t)->>'role' = 'eval'"
METRICS: dict[str, tuple[str, str, str]] = {
    # name -> (x label, y label, SQL returning x, y, version, n)
    "reward": (
        "iteration (weights trained for that many steps in sync mode)",
        "mean reward",
        """
        SELECT iteration AS x, avg(reward) AS y, coalesce(first_weight_version, 0) AS version, count(*) AS n
        FROM episodes WHERE status = 'scored' AND group_id NOT IN ({PERIODIC}) GROUP BY ALL ORDER BY x, version""",
    ),
    "pass_rate": (
        "iteration",
        "pass rate (reward >= 1)",
        """
        SELECT iteration AS x, avg(CASE WHEN reward >= 1 THEN 1.0 ELSE 0.0 END) AS y,
               coalesce(first_weight_version, 0) AS version, count(*) AS n
        FROM episodes WHERE status = 'scored' AND group_id NOT IN ({PERIODIC}) GROUP BY ALL ORDER BY x, version""",
    ),
    "train_reward": (
        "train step",
        "reward mean of the step's batch",
        """
        SELECT step AS x, reward_mean AS y, weight_version AS version, n_samples AS n
        FROM train_steps WHERE reward_mean IS NOT NULL ORDER BY x""",
    ),
    "loss": (
        "train step",
        "loss",
        """
        SELECT step AS x, loss AS y, weight_version AS version, n_samples AS n FROM train_steps ORDER BY x""",
    ),
    "eval": (
        "weight version",
        "eval reward (periodic eval)",
        """
        SELECT weight_version AS x, reward_mean AS y, weight_version AS version, n_samples AS n
        FROM eval_curve WHERE n_samples > 0 ORDER BY x""",
    ),
    "turns": (
        "iteration",
        "turns per episode",
        """
        SELECT iteration AS x, avg(n_turns) AS y, coalesce(first_weight_version, 0) AS version, count(*) AS n
        FROM episodes WHERE status = 'scored' AND group_id NOT IN ({PERIODIC}) GROUP BY ALL ORDER BY x, version""",
    ),
    # where the time goes (events/views/50_time_accounting.sql): one point per weight version
    **{
        f"{role}_busy": (
            "weight version (the time from its publish to the next)",
            f"{role} busy fraction",
            f"""
        SELECT weight_version AS x, busy_frac AS y, weight_version AS version, n
        FROM time_accounting WHERE role = '{role}' AND window_s > 0 ORDER BY x""",
        )
        for role in ("engine", "trainer", "sandbox")
    },
    "tokens_per_s": (
        "weight version (the time from its publish to the next)",
        "generated tokens / s",
        """
        SELECT weight_version AS x, tokens_per_s AS y, weight_version AS version, n
        FROM time_accounting WHERE role = 'engine' AND window_s > 0 ORDER BY x""",
    ),
}
DEFAULT_METRICS = ("reward", "loss")  # and "eval" when the run has a periodic eval


def write_plot(
    run_dir: Path | str,
    out: Path | str | None = None,
    metrics: tuple[str, ...] | list[str] = DEFAULT_METRICS,
) -> Path:
    """Write one PNG with a panel per metric; return its path (default <run_dir>/curves.png)."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ConfigError(f"--metric {unknown[0]!r}: accepted: {', '.join(METRICS)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    metrics, data = _read(run_dir, metrics)
    if not any(data.values()):
        raise StacxError(f"{run_dir}: nothing to plot yet (no scored episodes, no train steps)")
    versions = sorted({int(r[2]) for rs in data.values() for r in rs if r[2] is not None}) or [0]
    cmap = plt.get_cmap("viridis", max(2, len(versions)))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(7, 3.2 * len(metrics)), squeeze=False)
    for ax, m in zip(axes[:, 0], metrics, strict=True):
        _panel(ax, m, data[m], lambda v: cmap(versions.index(v)))
    handles = [
        plt.Line2D([], [], marker="o", ls="", color=cmap(i), label=f"v{v}")
        for i, v in enumerate(versions)
    ]
    axes[0, 0].legend(handles=handles, title="weight version", fontsize=8, loc="best")
    axes[0, 0].set_title(f"{run_dir.name}")
    fig.tight_layout()
    target = Path(out) if out else run_dir / "curves.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def _read(
    run_dir: Path, metrics: tuple[str, ...] | list[str]
) -> tuple[tuple[str, ...] | list[str], dict[str, list[tuple[Any, ...]]]]:
    """Each metric's rows (x, y, weight version, count); the defaults gain "eval" with a periodic
    eval."""
    with db.connect_run(run_dir) as con:
        if tuple(metrics) == DEFAULT_METRICS and con.execute(METRICS["eval"][2]).fetchall():
            metrics = (*DEFAULT_METRICS, "eval")
        data = {
            m: con.execute(METRICS[m][2].replace("{PERIODIC}", PERIODIC)).fetchall()
            for m in metrics
        }
    return metrics, data


def _panel(ax: Any, metric: str, data: list[tuple[Any, ...]], color: Callable[[int], Any]) -> None:
    """One metric's panel: points coloured by version and sized by count, the mean at each x."""
    from matplotlib.ticker import MaxNLocator

    xlabel, ylabel, _sql = METRICS[metric]
    rows = [r for r in data if r[1] is not None]
    if rows:
        xs, ys = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
        colors = [color(int(r[2] or 0)) for r in rows]
        sizes = [20 + 6 * min(int(r[3] or 1), 30) for r in rows]
        ax.scatter(xs, ys, c=colors, s=sizes, zorder=3)
        means: dict[float, list[float]] = {}
        for x, y in zip(xs, ys, strict=True):
            means.setdefault(x, []).append(y)
        mx = sorted(means)
        ax.plot(mx, [sum(means[x]) / len(means[x]) for x in mx], color="grey", lw=1, zorder=2)
    else:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations and steps are counts
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
