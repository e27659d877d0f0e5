# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tune's report: one Markdown table, an SVG plot of throughput against TTFT, and the JSON they come from.

Pure functions of the report's data (the shape that llmops.vllm.vllm_tune_report writes as HOST.json). The plot
is plain SVG text, so the controller needs no plotting library and a test can read what it marks.
"""

from __future__ import annotations

import html
import math

from ansible_collections.llmops.vllm.plugins.module_utils.tune.ledger import time_split
from ansible_collections.llmops.vllm.plugins.module_utils.tune.winner import pareto_front, score, slo_text

# Colours that stay apart for the usual kinds of colour blindness (Okabe and Ito).
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
WIDTH, HEIGHT = 990, 460
# The table's note keeps the start of a reason (a refusal names every layout that would pass); HOST.json has it all.
NOTE_LENGTH = 240
MARGIN = {"left": 70, "right": 460, "top": 40, "bottom": 55}


def levels_of(report):
    """The concurrency levels of the workload, in its order."""
    return list(report["workload"]["concurrency"])


def _cell(candidate, level):
    figures = {item["max_concurrency"]: item for item in candidate.get("levels") or []}.get(level)
    if not figures:
        return "-"
    return f"{figures['output_throughput']:.0f} ({figures['median_ttft_ms']:.0f})"


def _slo_met(candidate, objective):
    if candidate.get("verdict") != "measured":
        return "-"
    level = score(candidate["levels"], objective.get("concurrency", 0), objective.get("slo"))[0]
    if not objective.get("slo"):
        return "n/a"
    return f"yes, to C={level}" if level is not None else "no"


def short_reason(reason):
    """The start of a reason for the table: of a server that did not load, the errors its journal names first."""
    found, journal = reason.partition("Errors in its journal (the first is usually the cause):\n")[1:]
    if found:
        errors = [line.split(" [type=")[0].strip() for line in journal.split("\nLast lines")[0].splitlines()]
        reason = "did not load: " + " ".join(line for line in errors[:2] if line)
    return reason if len(reason) <= NOTE_LENGTH else reason[: NOTE_LENGTH - 3].rstrip() + "..."


def _seconds(value):
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def markdown(report):
    """The table (candidate, verdict, load, output tok/s and median TTFT per level, SLO met, why), winner, times."""
    levels = levels_of(report)
    objective = report["objective"]
    head = ["candidate", "verdict", "load s", *(f"C={level} tok/s (TTFT ms)" for level in levels), "SLO met", "note"]
    lines = [f"# Tune of {report['model']} on {report['host']} (instance {report['instance']})", ""]
    workload = report["workload"]
    requests = workload["num_requests"] or "4 x C (at least 16)"
    lines.append(
        f"Workload: at concurrency {', '.join(map(str, levels))}, {requests} requests of {workload['input_len']}"
        f" tokens in and {workload['output_len']} out each ({workload['endpoint']})."
    )
    lines.append(f"Objective: {objective_text(objective, levels)}.")
    lines += ["", "| " + " | ".join(head) + " |", "|" + "|".join(" --- " for column in head) + "|"]
    winner = report.get("winner") or {}
    for candidate in report["candidates"]:
        name = f"**{candidate['name']}**" if candidate["key"] == winner.get("key") else candidate["name"]
        note = short_reason(candidate.get("reason") or "")
        if candidate.get("resumed"):
            note = ("measured in an earlier run; " + note).rstrip("; ")
        row = [name, candidate["verdict"], _seconds(candidate.get("load_s")),
               *(_cell(candidate, level) for level in levels), _slo_met(candidate, objective), note]  # fmt: skip
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) + " |")
    lines += ["", f"Winner: {winner.get('reason', 'none')}."]
    if report.get("applied"):
        lines.append(f"Applied: {report['applied']}.")
    run = report.get("runs", [])[-1:] or [{}]
    split = time_split(run[0])
    lines.append(
        f"This run: {split['total_s']:g} s in all = loads {split['loads_s']:g} + benchmarks {split['benchmarks_s']:g}"
        f" + stops {split['stops_s']:g} + the collection's own {split['overhead_s']:g}; "
        f"{run[0].get('measured', 0)} candidate(s) run, {run[0].get('resumed', 0)} taken from earlier runs."
    )
    return "\n".join(lines) + "\n"


def objective_text(objective, levels):
    if objective.get("slo"):
        return f"the highest output throughput at the highest concurrency that meets {slo_text(objective['slo'])}"
    return f"the highest output throughput at C={objective.get('concurrency') or max(levels)}"


def _ticks(low, high, count=5):
    """About `count` round tick values from low to high."""
    span = high - low or 1.0
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(factor for factor in (1, 2, 5, 10) if raw <= step * factor)
    first = math.floor(low / step) * step
    return [first + step * index for index in range(int((high - first) / step) + 2) if first + step * index <= high]


def _number(value):
    return f"{value:g}" if value < 10000 else f"{value / 1000:g}k"


def svg(report):
    """Output tok/s against median TTFT, one line per measured candidate through its levels, the Pareto front
    (lower TTFT and higher throughput than any other point) ringed and joined, the winner named."""
    measured = [candidate for candidate in report["candidates"] if candidate.get("verdict") == "measured"]
    points = [
        (level["median_ttft_ms"], level["output_throughput"], candidate["name"], level["max_concurrency"])
        for candidate in measured
        for level in candidate["levels"]
    ]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{MARGIN["left"]}" y="22" font-size="15">'
        f"{html.escape(report['model'])} on {html.escape(report['host'])}: "
        "output throughput against median TTFT</text>",
    ]
    if not points:
        out.append(f'<text x="{MARGIN["left"]}" y="{HEIGHT // 2}">no candidate was measured</text></svg>')
        return "\n".join(out) + "\n"
    x_high = max(point[0] for point in points) * 1.1
    y_high = max(point[1] for point in points) * 1.1
    left, top = MARGIN["left"], MARGIN["top"]
    plot_w, plot_h = WIDTH - left - MARGIN["right"], HEIGHT - top - MARGIN["bottom"]

    def x(value):
        return round(left + value / x_high * plot_w, 1)

    def y(value):
        return round(top + plot_h - value / y_high * plot_h, 1)

    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>')
    for tick in _ticks(0, x_high):
        out.append(f'<line x1="{x(tick)}" y1="{top + plot_h}" x2="{x(tick)}" y2="{top + plot_h + 5}" stroke="#999"/>')
        out.append(f'<text x="{x(tick)}" y="{top + plot_h + 18}" text-anchor="middle">{_number(tick)}</text>')
    for tick in _ticks(0, y_high):
        out.append(f'<line x1="{left - 5}" y1="{y(tick)}" x2="{left + plot_w}" y2="{y(tick)}" stroke="#eee"/>')
        out.append(f'<text x="{left - 8}" y="{y(tick) + 4}" text-anchor="end">{_number(tick)}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{HEIGHT - 15}" text-anchor="middle">median TTFT (ms)</text>')
    out.append(
        f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" transform="rotate(-90 16 {top + plot_h / 2})">'
        "output tokens/s</text>"
    )
    winner = (report.get("winner") or {}).get("name")
    for index, candidate in enumerate(measured):
        colour = COLOURS[index % len(COLOURS)]
        path = " ".join(f"{x(item['median_ttft_ms'])},{y(item['output_throughput'])}" for item in candidate["levels"])
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for level in candidate["levels"]:
            cx, cy = x(level["median_ttft_ms"]), y(level["output_throughput"])
            out.append(f'<circle cx="{cx}" cy="{cy}" r="3.5" fill="{colour}"/>')
            out.append(
                f'<text x="{cx + 5}" y="{cy - 5}" font-size="10" fill="{colour}">C={level["max_concurrency"]}</text>'
            )
        label = candidate["name"] + (" (winner)" if candidate["name"] == winner else "")
        legend_y = top + 16 * index + 8
        out.append(f'<line x1="{left + plot_w + 15}" y1="{legend_y}" x2="{left + plot_w + 35}" y2="{legend_y}" '
                   f'stroke="{colour}" stroke-width="2"/>')  # fmt: skip
        out.append(f'<text x="{left + plot_w + 40}" y="{legend_y + 4}" font-size="11">{html.escape(label)}</text>')
    front = pareto_front(points)
    path = " ".join(f"{x(point[0])},{y(point[1])}" for point in front)
    out.append(f'<polyline class="pareto" points="{path}" fill="none" stroke="#444" stroke-dasharray="5,4"/>')
    for point in front:
        out.append(f'<circle class="pareto" cx="{x(point[0])}" cy="{y(point[1])}" r="7" fill="none" stroke="#444"/>')
    legend_y = top + 16 * len(measured) + 16
    out.append(f'<circle cx="{left + plot_w + 25}" cy="{legend_y}" r="6" fill="none" stroke="#444"/>')
    out.append(f'<text x="{left + plot_w + 40}" y="{legend_y + 4}">Pareto front ({len(front)} points)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
