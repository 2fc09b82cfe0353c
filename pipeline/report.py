"""`tfrp report`: one self-contained HTML page of a pipeline run, to look at rather than read.

Per-split feature statistics from StatisticsGen's proto (type, count, missing share,
mean/std/min/max or top values, a small histogram), the schema as a table, the anomalies, the
evaluation metrics and blessing, and the Trainer's input-wait share per epoch as a chart.
Everything is inline (SVG histograms, the chart as a PNG data URI, one <style>): the page
loads nothing from anywhere, so it opens offline and from an artifact store alike. TFDV's
Facets view is not used: it loads scripts from the network and relies on HTML imports, which
Chromium removed.
"""
from __future__ import annotations

import base64
import html
import io
from typing import Optional

from tensorflow_metadata.proto.v0 import schema_pb2

from components.example_gen import artifacts as tfx_artifacts
from tfrecord_shards import fileio
from tfrecord_shards.codec import parser, schema_file
from tfrecord_shards.memory import objects_frozen
from components.trainer import fit
from pipeline import run_summary

REPORT_FILE = "report.html"
_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.missing-high { color: #b00; font-weight: bold; } .ok { color: #070; } .bad { color: #b00; }
.bar { fill: #4a7ab5; } code { background: #f4f4f4; padding: 0 3px; }
"""


def _e(value) -> str:
    return html.escape(str(value))


def _histogram_svg(buckets: list[tuple[float, float, float]], width: int = 120,
                   height: int = 28) -> str:
    """A histogram's buckets (low, high, count) as a tiny inline bar chart."""
    if not buckets:
        return ""
    top = max(count for _, _, count in buckets) or 1.0
    step = width / len(buckets)
    bars = "".join(
        f'<rect class="bar" x="{i * step:.1f}" y="{height - height * count / top:.1f}" '
        f'width="{max(step - 1, 1):.1f}" height="{height * count / top:.1f}">'
        f"<title>{low:.4g} to {high:.4g}: {count:.0f}</title></rect>"
        for i, (low, high, count) in enumerate(buckets))
    return f'<svg class="histogram" width="{width}" height="{height}">{bars}</svg>'


def _statistics_table(split: str, dataset) -> str:
    rows = []
    for feature in dataset.features:
        name = ".".join(feature.path.step) or feature.name
        kind = feature.WhichOneof("stats")
        stats = getattr(feature, kind)
        common = stats.common_stats
        present = common.num_non_missing
        total = present + common.num_missing
        missing = common.num_missing / total if total else 0.0
        if kind == "num_stats":
            summary = (f"{stats.mean:.4g}", f"{stats.std_dev:.4g}", f"{stats.min:.4g}",
                       f"{stats.max:.4g}")
            standard = [h for h in stats.histograms if h.type == h.STANDARD] or \
                list(stats.histograms)
            picture = _histogram_svg([(b.low_value, b.high_value, b.sample_count)
                                      for b in standard[0].buckets] if standard else [])
        else:
            top = ", ".join(f"{_e(v.value)} ({v.frequency:.0f})" for v in stats.top_values[:3])
            summary = (f"{stats.unique} unique", "", "", top)
            ranks = stats.rank_histogram.buckets[:20]
            picture = _histogram_svg([(b.low_rank, b.high_rank, b.sample_count)
                                      for b in ranks])
        css = ' class="missing-high"' if missing > 0.2 else ""
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{_e(feature.Type.Name(feature.type))}</td>"
            f"<td>{present:,}</td><td{css}>{missing:.1%}</td>"
            + "".join(f"<td>{cell}</td>" for cell in summary) + f"<td>{picture}</td></tr>")
    return (f'<h3>Split {_e(split)}: {dataset.num_examples:,} examples</h3>'
            f'<table class="statistics" data-split="{_e(split)}"><tr><th>feature</th>'
            "<th>type</th><th>count</th><th>missing</th><th>mean / unique</th><th>std</th>"
            "<th>min</th><th>max / top values</th><th>histogram</th></tr>"
            + "".join(rows) + "</table>")


def _statistics(artifacts: dict) -> str:
    parts = []
    for artifact in artifacts.get("ExampleStatistics", []):
        for split in run_summary.split_names(artifact):
            path = fileio.join(artifact.uri, f"Split-{split}", "FeatureStats.pb")
            if fileio.exists(path):
                parts.append(_statistics_table(
                    split, tfx_artifacts.load_statistics(path).datasets[0]))
    return "".join(parts) or "<p>No statistics in this run.</p>"


def _schema(summary: run_summary.RunSummary) -> str:
    if not summary.schema_path or not fileio.exists(summary.schema_path):
        return "<p>No schema in this run.</p>"
    schema = schema_file.load_schema(summary.schema_path)
    rows = []
    for feature in schema.feature:
        domain = feature.domain or (
            "int [{}, {}]".format(feature.int_domain.min, feature.int_domain.max)
            if feature.HasField("int_domain") else "")
        rows.append(f"<tr><td>{_e(feature.name)}</td>"
                    f"<td>{_e(_type_name(feature.type))}</td>"
                    f"<td>{'scalar' if parser.is_scalar(feature) else 'list'}</td>"
                    f"<td>{feature.presence.min_fraction:.0%}</td><td>{_e(domain)}</td></tr>")
    return ('<table class="schema"><tr><th>feature</th><th>type</th><th>shape</th>'
            "<th>min presence</th><th>domain</th></tr>" + "".join(rows) + "</table>")


def _type_name(value: int) -> str:
    return schema_pb2.FeatureType.Name(value)


def _anomalies(summary: run_summary.RunSummary) -> str:
    found = [(split, item) for split, items in summary.anomalies.items() for item in items]
    if not found:
        return '<p class="ok" id="anomalies">No anomalies.</p>'
    return ('<ul id="anomalies">' + "".join(
        f"<li><b>{_e(split)}</b>: {_e(item)}</li>" for split, item in found) + "</ul>")


def _evaluation(summary: run_summary.RunSummary) -> str:
    if not summary.evaluation:
        return "<p>No evaluation in this run.</p>"
    rows = "".join(f"<tr><td>{_e(name)}</td><td>{value:.4g}</td></tr>"
                   for name, value in sorted(summary.evaluation.items()))
    blessed = {True: '<p class="ok">Blessed by the Evaluator.</p>',
               False: '<p class="bad">Not blessed by the Evaluator.</p>',
               None: ""}[summary.blessed]
    pushed = f"<p>Pushed to <code>{_e(summary.pushed_model)}</code>.</p>" \
        if summary.pushed_model else "<p>Not pushed.</p>"
    return (f'<table class="metrics"><tr><th>metric (eval split)</th><th>value</th></tr>'
            f"{rows}</table>{blessed}{pushed}")


def _input_report(artifacts: dict) -> Optional[dict]:
    for artifact in artifacts.get("ModelRun", []):
        report = fileio.read_json(fileio.join(artifact.uri, fit.REPORT_FILE))
        if report:
            return report
    return None


def _input_wait_chart(report: Optional[dict]) -> str:
    if not report or not report.get("epochs"):
        return "<p>No input report in this run.</p>"
    # matplotlib: switching it to Agg is a process-wide side effect; only a chart does it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [e["epoch"] for e in report["epochs"]]
    shares = [100 * e["input_wait_share"] for e in report["epochs"]]
    figure, axes = plt.subplots(figsize=(6, 2.6), dpi=100)
    axes.bar(epochs, shares, color="#4a7ab5")
    for threshold, label in ((5, "moderately input-bound"), (20, "highly input-bound")):
        axes.axhline(threshold, color="#b00" if threshold == 20 else "#d80", lw=1, ls="--")
        axes.text(epochs[-1] + 0.4, threshold, label, va="bottom", ha="right", fontsize=8)
    axes.set_xlabel("epoch")
    axes.set_ylabel("time waiting for input (%)")
    axes.set_ylim(0, max(25, max(shares) * 1.15))
    axes.set_xticks(epochs)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    overall = report["overall"]
    data = base64.b64encode(buffer.getvalue()).decode()
    return (f'<img id="input-wait-chart" alt="input wait share per epoch" '
            f'src="data:image/png;base64,{data}">'
            f"<p>Overall {100 * overall['input_wait_share']:.1f} % of step time waiting for "
            f"input: {_e(overall['label'])}.</p>")


def _production(summary: run_summary.RunSummary) -> str:
    """The data this run read, and how its model fared against the one in production."""
    lines = []
    if len(summary.spans) > 1:
        lines.append(f"ExampleGen read spans {summary.spans[0]}-{summary.spans[-1]}.")
    elif summary.span != (0, 0):
        lines.append(f"ExampleGen read span {summary.span[0]}, version {summary.span[1]}.")
    if summary.analysed_spans or summary.cached_spans:
        lines.append("Transform analysed span(s) "
                     f"{', '.join(map(str, summary.analysed_spans)) or 'none'}; "
                     f"{', '.join(map(str, summary.cached_spans)) or 'none'} from the "
                     "analyzer cache.")
    if summary.baseline_model:
        compared = "".join(
            f"<tr><td>{_e(name)}</td><td>{summary.evaluation.get(name, float('nan')):.4g}</td>"
            f"<td>{value:.4g}</td></tr>"
            for name, value in sorted(summary.baseline_evaluation.items()))
        lines.append(f"Compared with the model in production <code>{_e(summary.baseline_model)}"
                     "</code> on the same eval rows:")
        table = ('<table class="baseline"><tr><th>metric</th><th>this model</th>'
                 f"<th>production</th></tr>{compared}</table>")
    else:
        lines.append("No blessed model yet: judged by the bounds alone.")
        table = ""
    verdict = "".join(f'<li class="bad">{_e(failure)}</li>'
                      for failure in summary.validation_failures)
    return ("".join(f"<p>{line}</p>" for line in lines) + table +
            (f'<ul id="refusals">{verdict}</ul>' if verdict else ""))


def _history(points: list) -> str:
    """A line per run of the task metric (blessed runs filled, refused ones hollow), and the
    same as a table."""
    scored = [p for p in points if p.value is not None]
    if not scored:
        return "<p>No evaluated run yet.</p>"
    # matplotlib: switching it to Agg is a process-wide side effect; only a chart does it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 2.6), dpi=100)
    runs = list(range(1, len(scored) + 1))
    axes.plot(runs, [p.value for p in scored], color="#4a7ab5", lw=1)
    for run, point in zip(runs, scored):
        axes.plot(run, point.value, "o", color="#4a7ab5",
                  markerfacecolor="#4a7ab5" if point.blessed else "white")
    axes.set_xticks(runs)
    axes.set_xticklabels([f"span {p.span}" if p.span else str(r)
                          for r, p in zip(runs, scored)], fontsize=8)
    axes.set_ylabel(scored[-1].metric)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode()
    rows = "".join(
        f"<tr><td>{_e(p.run_id)}</td><td>{p.span}</td><td>{_e(p.metric)}</td>"
        f"<td>{p.value:.4g}</td><td>{'yes' if p.blessed else 'no'}</td>"
        f"<td>{'yes' if p.pushed else 'no'}</td></tr>" for p in scored)
    return (f'<img id="metric-history-chart" alt="the task metric per run" '
            f'src="data:image/png;base64,{data}">'
            '<table id="metric-history"><tr><th>run</th><th>span</th><th>metric</th>'
            f"<th>value</th><th>blessed</th><th>pushed</th></tr>{rows}</table>")


def render(summary: run_summary.RunSummary, pipeline_name: str,
           history: Optional[list] = None) -> str:
    components = "".join(f"<tr><td>{_e(node)}</td><td>{_e(state)}</td></tr>"
                         for node, state in summary.components.items())
    rows = ", ".join(f"{split} {count:,}" for split, count in summary.rows_per_split.items())
    artifacts = summary.artifacts
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{_e(pipeline_name)}: run {_e(summary.run_id)}</title><style>{_STYLE}</style></head>
<body>
<h1>{_e(pipeline_name)}</h1>
<p>Run <code>{_e(summary.run_id)}</code>. Rows: {_e(rows or "unknown")}.</p>
<table class="components"><tr><th>component</th><th>state</th></tr>{components}</table>
<h2 id="statistics">Feature statistics</h2>{_statistics(artifacts)}
<h2 id="schema">Schema</h2>{_schema(summary)}
<h2>Anomalies</h2>{_anomalies(summary)}
<h2 id="evaluation">Evaluation</h2>{_evaluation(summary)}
<h2 id="production">Data and production model</h2>{_production(summary)}
<h2 id="history">Over time</h2>{_history(history or [])}
<h2 id="input">Training input</h2>{_input_wait_chart(_input_report(artifacts))}
</body></html>
"""


def write_report(metadata_path: str, pipeline_name: str, output_path: str,
                 run_id: Optional[str] = None) -> str:
    """Writes the page for the run (default: the latest) and returns its path."""
    # TFMA and TFX are imported: reading each run's manifests in this process walks their
    # objects at every full pass of the garbage collector unless they are frozen.
    with objects_frozen():
        summary = run_summary.summarize(metadata_path, pipeline_name, run_id)
        page = render(summary, pipeline_name, run_summary.history(metadata_path, pipeline_name))
    output_path = fileio.absolute(output_path)
    fileio.makedirs(fileio.dirname(output_path))
    if fileio.is_remote(output_path):  # an object appears whole when its upload ends
        fileio.write_text(output_path, page)
        return output_path
    partial = output_path + ".partial"
    fileio.write_text(partial, page)
    fileio.rename(partial, output_path)
    return output_path


def default_path(output_root: str, pipeline_name: str) -> str:
    return fileio.join(output_root, "reports", pipeline_name, REPORT_FILE)

