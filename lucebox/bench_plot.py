"""The bench result as a PNG: tok/s per suite and mode, and the accept-length histogram per mode.

matplotlib is an optional extra (`pip install 'lucebox[plot]'`): without it `save_plot` returns
False and the caller says the plot was skipped.
"""
from __future__ import annotations

from pathlib import Path

from .bench import MODE_LABELS

INSTALL_HINT = "pip install 'lucebox[plot]' (matplotlib)"


def run_label(run: dict) -> str:
    return f"{MODE_LABELS[run['mode']]} b{run['budget']}"


def accept_length_shares(result: dict) -> dict[str, list[float]]:
    """run label -> share of verify steps that committed n tokens (index n), over every suite."""
    import numpy as np

    histograms: dict[str, list[list[int]]] = {}
    for suite in result["suites"]:
        for run in suite["runs"]:
            histograms.setdefault(run_label(run), []).append(run.get("al_histogram", []))
    shares = {}
    for label, hists in histograms.items():
        width = max(len(h) for h in hists)
        total = sum(np.pad(np.asarray(h, np.int64), (0, width - len(h))) for h in hists)
        shares[label] = (total / max(int(total.sum()), 1)).tolist()
    return shares


def save_plot(result: dict, path: str | Path) -> bool:
    """Write the figure to `path`; False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False

    suites = result["suites"]
    labels = ["AR"] + ([run_label(r) for r in suites[0]["runs"]] if suites else [])
    fig, (speed, accept) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        values = [s["ar"]["tok_s"] if i == 0 else s["runs"][i - 1]["tok_s"] for s in suites]
        speed.bar([x + i * width for x in range(len(suites))], values, width, label=label)
    speed.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(suites))], [s["name"] for s in suites])
    speed.set_ylabel("tok/s")
    speed.set_title("Decode speed per suite")
    speed.legend(fontsize="small")

    shares = accept_length_shares(result)
    width = 0.8 / max(len(shares), 1)
    for i, (label, share) in enumerate(shares.items()):
        offset = (i - (len(shares) - 1) / 2) * width  # each run's bars around the integer count
        # the run's colour in the speed plot (C0 is AR)
        accept.bar([n + offset for n in range(1, len(share))], share[1:], width, label=label, color=f"C{i + 1}")
    accept.xaxis.set_major_locator(MaxNLocator(integer=True))
    accept.set_xlabel("tokens committed per verify step")
    accept.set_ylabel("share of steps")
    accept.set_title("Accept length (all suites)")
    if shares:
        accept.legend(fontsize="small")

    settings = result.get("settings", {})
    meta = result.get("meta", {})
    fig.suptitle(f"lucebox bench: n_gen {settings.get('n_gen', '?')}, temperature {settings.get('temperature', 0):g}"
                 + (f", {meta['device']}" if meta.get("device") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
