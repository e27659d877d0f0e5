# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reports of vllm_bench results: JSON, CSV and Markdown text (standard library), and a PNG plot (matplotlib).

`results` maps a host name to what llmops.vllm.vllm_bench returned there (`summary`, `levels`, maybe
`comparisons`). Every function returns the file's content, so a caller can compare it before writing.
"""

from __future__ import annotations

import csv
import io
import json

from ansible_collections.llmops.vllm.plugins.module_utils.common.table import markdown_table

# The columns of the per-host Markdown table: (header, field, format).
MARKDOWN_COLUMNS = (
    ("C", "max_concurrency", "{}"),
    ("requests", "num_requests", "{}"),
    ("failed", "failed", "{}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("total tok/s", "total_token_throughput", "{:.1f}"),
    ("TTFT median ms", "median_ttft_ms", "{:.1f}"),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.1f}"),
    ("TPOT median ms", "median_tpot_ms", "{:.2f}"),
    ("ITL median ms", "median_itl_ms", "{:.2f}"),
    ("E2EL median ms", "median_e2el_ms", "{:.1f}"),
    ("client CPU s/1k tok", "client_cpu_seconds_per_1k_output_tokens", "{:.3f}"),
)


def result_json(result: dict) -> str:
    """The saved form of one host's result, which vllm_bench also reads back as a baseline."""
    saved = {key: result[key] for key in ("summary", "levels", "comparisons") if key in result}
    return json.dumps(saved, indent=2, sort_keys=True) + "\n"


def levels_csv(results: dict) -> str:
    """One row per host and level with every field; the first error texts joined into one cell."""
    fields = []
    for result in results.values():
        for level in result["levels"]:
            fields += [name for name in level if name not in fields]
    out = io.StringIO()
    writer = csv.DictWriter(out, ["host", *fields], lineterminator="\n")
    writer.writeheader()
    for host, result in sorted(results.items()):
        for level in result["levels"]:
            row = {**level, "host": host}
            if "errors" in level:  # not one of the fields a result must have (LEVEL_FIELDS)
                row["errors"] = " | ".join(level["errors"] or [])
            writer.writerow(row)
    return out.getvalue()


def cell(level: dict, field: str, fmt: str) -> str:
    value = level.get(field)
    return "-" if value is None else fmt.format(value)


def host_markdown(host: str, result: dict) -> str:
    """The table of one host's levels, under a line that says what was measured."""
    summary = result["summary"]
    title = (
        f"### {host}: {summary['model']} ({summary['endpoint']},"
        f" {summary['input_len']} in / {summary['output_len']} out,"
        f" {summary['prompt_source']} prompts)"
    )
    rows = [[cell(level, field, fmt) for _header, field, fmt in MARKDOWN_COLUMNS] for level in result["levels"]]
    headers = [column[0] for column in MARKDOWN_COLUMNS]
    return f"{title}\n\n" + markdown_table(headers, rows, numeric=tuple(range(len(headers))))


def fleet_markdown(results: dict) -> str:
    """Host x concurrency: output tokens per second and median TTFT (ms) in each cell; failures when any."""
    levels = sorted({level["max_concurrency"] for result in results.values() for level in result["levels"]})
    rows = []
    for host, result in sorted(results.items()):
        by_concurrency = {level["max_concurrency"]: level for level in result["levels"]}
        cells = []
        for concurrency in levels:
            level = by_concurrency.get(concurrency)
            if level is None:
                cells.append("-")
                continue
            text = f"{level['output_throughput']:.0f} tok/s, TTFT {level['median_ttft_ms']:.0f} ms"
            cells.append(text + (f", {level['failed']} failed" if level["failed"] else ""))
        rows.append([host, *cells])
    headers = ["host", *(f"C={concurrency}" for concurrency in levels)]
    return markdown_table(headers, rows, numeric=tuple(range(1, len(headers))))


def plot_png(results: dict) -> bytes:
    """Output throughput and latency (median TTFT, median TPOT) against concurrency, one line per host."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel

    figure, (throughput, latency) = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for host, result in sorted(results.items()):
        levels = sorted(result["levels"], key=lambda level: level["max_concurrency"])
        concurrency = [level["max_concurrency"] for level in levels]
        throughput.plot(concurrency, [level["output_throughput"] for level in levels], marker="o", label=host)
        latency.plot(concurrency, [level["median_ttft_ms"] for level in levels], marker="o", label=f"{host} TTFT")
        latency.plot(
            concurrency, [level["median_tpot_ms"] for level in levels], marker="s", linestyle="--", label=f"{host} TPOT"
        )
    for axes, title, unit in ((throughput, "Output throughput", "tokens/s"), (latency, "Median latency", "ms")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel(unit)
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    figure.tight_layout()
    out = io.BytesIO()
    # No metadata (matplotlib writes its version and the date otherwise): the same results give the same bytes.
    figure.savefig(out, format="png", dpi=100, metadata={"Software": None})
    pyplot.close(figure)
    return out.getvalue()
