"""PNG plots of an analysis result (needs matplotlib, an optional extra): per op, median latency
against size for each backend on log-log axes, with the crossover and its uncertainty marked."""
from __future__ import annotations

import os

_COLORS = {"cpu": "tab:blue", "gpu": "tab:red"}


def write_plots(res: dict, out_dir) -> list[str]:
    """Writes DIR/<op>.png for every op with size buckets; returns lines saying what was written (or why
    nothing was)."""
    try:
        import matplotlib  # deferred: matplotlib is optional and heavy
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: matplotlib is optional and heavy
    except ImportError:
        return ["plots skipped: matplotlib is not installed (pip install matplotlib)"]
    os.makedirs(out_dir, exist_ok=True)
    by_op = {}
    for r in res.get("speedup", []):
        by_op.setdefault(r["op"], []).append(r)
    cross = {c["op"]: c for c in res.get("crossover", [])}
    notes = []
    for op, rows in sorted(by_op.items(), key=lambda kv: str(kv[0])):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for backend in ("cpu", "gpu"):
            pts = [(r["size"], r[f"{backend}_p50_us"]) for r in rows if r[f"{backend}_p50_us"] is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-", color=_COLORS[backend], label=f"{backend.upper()} median")
        c = cross.get(op)
        if c and c["status"] == "crossover":
            ax.axvspan(c["low"], c["high"], color="0.85", label="crossover bracket")
            ax.axvline(c["size"], color="k", linestyle="--", label=f"crossover ~{c['size']:.3g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("size (op work units)")
        ax.set_ylabel("latency (us)")
        ax.set_title(f"{op}: latency vs size")
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
        path = os.path.join(out_dir, f"{op}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        notes.append(f"plot written: {path}")
    return notes or ["plots: no sized events to plot"]
