"""The report of the CALM experiment (`templm.experiments.calm.run_calm`): report.md, learner vs baseline overall and
per class, and loss.png, both models' per-batch losses over the stream with the class switches marked.

`write_calm_report(results, out_dir)` needs only the results dict and the run's folder: the per-batch losses it plots
are read back from the run's loss logs (`learner.jsonl`, `baseline.jsonl`; `templm.data.calm_log`).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

import numpy as np

from templm import console
from templm import paths as storage  # `paths` names the report's files
from templm.data.calm_log import read_loss_log
from templm.data.calm_stream import switch_points
from templm.errors import DataError
from templm.io import atomic_write
from templm.reports.figures import pyplot, save_figure
from templm.reports.tables import fmt_number, markdown_table

REPORT_METRICS = ("loss", "total_pp", "ppl@sw", "rec")
MODELS = ("learner", "baseline")


def _fmt(x: Any) -> str:
    return fmt_number(x, 3, missing="-")


def format_report(results: Dict[str, Any]) -> str:
    """Markdown: the run in a paragraph, then learner vs baseline overall and per class."""
    cfg, corpus, stream = results["config"], results["corpus"], results["stream"]
    metrics = results["metrics"]
    model = cfg["model"]
    if cfg["baseline"] == "pretrained":
        base = (f"the same architecture and initialisation, pre-trained with Adam (lr {cfg['pretrain_lr']}) on the "
                f"first {cfg['pretrain_batches']} batches of the stream ({cfg['pretrain_passes']} pass(es)), then "
                f"frozen; the learner starts from the same pre-trained parameters")
    else:
        base = "the same architecture and initialisation, untrained and frozen"
    lines = [
        "# CALM: Transformer-XL online learner vs static baseline",
        "",
        f"Corpus `{corpus['dir']}`: {len(corpus['classes'])} classes ({', '.join(corpus['classes'])}), "
        f"{cfg['model_level']} level, vocabulary {corpus['vocab_size']}. Stream: {stream['batches']} batches of "
        f"{cfg['batch_size']} x {cfg['window_size']} tokens in {stream['segments']} segments (mean "
        f"{stream['mean_segment_length']:.2f} batches, {cfg.get('segment_lengths', 'original')} law; switch_frequency "
        f"{cfg['switch_frequency']}, nswitches {cfg['nswitches']}, seed {cfg['seed']}).",
        "",
        f"Learner: Transformer-XL ({model['n_layer']} layers, d_model {model['d_model']}, {model['n_head']} heads, "
        f"memory {model['mem_len']}; {results['parameters']:,} parameters) with the dynamic-evaluation step: each "
        f"batch is scored, then one `{cfg['rule']}` step (lr {cfg['lr']}) on it updates the `{cfg['which']}` "
        f"parameters. Baseline: {base}.",
        "",
        "Metrics (calm.compute_metrics) drop the first 50 segments; loss is nats per token, total_pp = exp(loss), "
        "ppl@sw = exp of the mean loss over the first 10 batches after a switch, rec = batches until the loss falls "
        "below the class's previous segment mean.",
        "",
    ]
    if not metrics["learner"]:
        lines.append("The log has fewer than 100 segments: CALM reports no metrics.")
        return "\n".join(lines) + "\n"
    align = "l" + "r" * len(REPORT_METRICS)
    lines.append(markdown_table(("model", *REPORT_METRICS),
                                [(name, *(_fmt(metrics[name].get(k)) for k in REPORT_METRICS)) for name in MODELS],
                                align=align))
    per_class = [(c, name, *(_fmt(metrics[name].get(f"{k}_{c}")) for k in REPORT_METRICS))
                 for c in corpus["classes"] for name in MODELS]
    lines += ["", "## Per class", "", markdown_table(("class", "model", *REPORT_METRICS), per_class, align="l" + align)]
    wrapped = {c: n for c, n in stream.get("wraps", {}).items() if n}
    if wrapped:
        lines += ["", "Note: some classes ran out of text and started again ("
                  + ", ".join(f"{c} {n}x" for c, n in wrapped.items())
                  + "), so the learner met text it had trained on."]
    lines += ["", f"Time: pre-training {results['timing']['pretrain_s']:.1f}s, stream "
                  f"{results['timing']['stream_s']:.1f}s ({results['timing']['batches_per_s']:.1f} batches/s, both "
                  f"models), total {results['timing']['total_s']:.1f}s."]
    return "\n".join(lines) + "\n"


def read_model_losses(learner_log: str, baseline_log: str) -> Dict[str, np.ndarray]:
    """Both models' per-batch losses from their loss logs, which must cover the same batches: {"learner",
    "baseline": float64 [batches], "domain", "sequence": int64 [batches]} (class index and segment id per batch)."""
    learner, baseline = read_loss_log(learner_log), read_loss_log(baseline_log)
    if len(learner) != len(baseline):
        raise DataError(f"{len(baseline)} batches, but the learner's log {learner_log} has {len(learner)}; expected "
                        f"the logs of one run", baseline_log)
    for lineno, (a, b) in enumerate(zip(learner, baseline), 1):
        if a[1:] != b[1:]:
            raise DataError(f"class {b[2]!r} segment {b[3]} here, but class {a[2]!r} segment {a[3]} on this line of "
                            f"the learner's log {learner_log}; expected the logs of one run", baseline_log, lineno)
    return {"learner": np.asarray([r[0] for r in learner], np.float64),
            "baseline": np.asarray([r[0] for r in baseline], np.float64),
            "domain": np.asarray([r[1] for r in learner], np.int64),
            "sequence": np.asarray([r[3] for r in learner], np.int64)}


def plot_losses(losses: Mapping[str, np.ndarray], class_names: Sequence[str], path: str, burn_in_batches: int = 0,
                pretrain_batches: int = 0, smooth: int = 10) -> None:
    """loss.png: both models' per-batch losses (thin) and their running means over `smooth` batches, a vertical
    line at every switch, the burn-in (not scored) shaded and the pre-training prefix marked. `losses` as
    `read_model_losses` returns them."""
    plt = pyplot()

    learner, baseline, domain = losses["learner"], losses["baseline"], losses["domain"]
    x = np.arange(len(learner))
    fig, ax = plt.subplots(figsize=(13, 5))
    if burn_in_batches:
        ax.axvspan(-0.5, burn_in_batches - 0.5, color="0.92", zorder=-2, label="burn-in (not scored)")
    for i in switch_points(losses["sequence"]):
        ax.axvline(i - 0.5, color="0.55", lw=0.5, alpha=0.6, zorder=-1)
    if pretrain_batches:
        ax.axvline(pretrain_batches - 0.5, color="k", ls=":", lw=1.2, label="end of the pre-training prefix")
    for name, values, color in (("learner (dynamic eval)", learner, "tab:blue"),
                                ("baseline (static)", baseline, "tab:orange")):
        ax.plot(x, values, color=color, lw=0.6, alpha=0.35)
        k = max(1, min(smooth, len(values)))
        running = np.convolve(values, np.ones(k) / k, mode="valid")
        ax.plot(x[k - 1:], running, color=color, lw=1.6, label=f"{name}, mean of {k}")
    # Class of each batch as a coloured strip along the bottom.
    colors = plt.get_cmap("tab10")
    lo = min(learner.min(), baseline.min())
    hi = max(learner.max(), baseline.max())
    strip = lo - 0.04 * (hi - lo + 1e-9)
    for d, name in enumerate(class_names):
        sel = domain == d
        ax.scatter(x[sel], np.full(sel.sum(), strip), marker="|", s=40, color=colors(d % 10), label=f"class {name}")
    ax.set_xlabel("batch (grey lines: class switches)")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title("CALM: loss over the stream, each batch scored before the learner trains on it")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    fig.tight_layout()
    save_figure(fig, path, dpi=90)


def write_calm_report(results: Dict[str, Any], out_dir: str) -> Dict[str, str]:
    """Writes out_dir/loss.png (from the run's loss logs in `out_dir`) and out_dir/report.md (from `results`), each
    through a temporary file renamed into place. Returns {"report.md": path, "loss.png": path}."""
    paths = {name: storage.join(out_dir, name) for name in ("report.md", "loss.png")}
    losses = read_model_losses(storage.join(out_dir, "learner.jsonl"), storage.join(out_dir, "baseline.jsonl"))
    plot_losses(losses, results["corpus"]["classes"], paths["loss.png"], results["stream"]["burn_in_batches"],
                results["config"]["pretrain_batches"])
    atomic_write(paths["report.md"], format_report(results))
    console.say(f"CALM: wrote {paths['report.md']}, {paths['loss.png']}")
    return paths
