# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout gate (plugins/module_utils/bench/gate.py) on simulated rounds: how often it passes, regresses or
cannot tell, and how many rounds it takes, at true regressions of 0, 5, 10 and 20%.

The spreads come from the repository's recorded repeated rounds, where two clients measured one server in turn,
interleaved, round after round (paired log ratios, as the gate's rounds are), or from --spread. Each simulated round
measures the reference and then the candidate (the other order in the next round, as the harnesses interleave), and
each measurement's log is:

    log(level) + drift of the machine at that slot + independent noise

The drift follows an AR(1) process over the slots (lag-one correlation --drift-correlation) with the spread of one
server's own rounds; interleaving cancels most of it. The independent noise is Student t with --tail-df degrees of
freedom (heavy tails: most rounds close, a few far out), scaled so that the paired log ratio's standard deviation is
the recorded spread. The gate is the collection's own code, called as a module would call it.

Three more tables weigh rounds whose speed runs in spells (--correlated): the gate against the old instance measured
first (one server's rounds on one AR(1) process, the baseline's window, then the candidate's after the switch,
--gap-rounds; the baseline's own correlation is the gate's least, as the module takes it), against a peer on another
machine (each machine on its own AR(1) process, nothing common), and against that peer given the correlation an
earlier gate between the two measured.

usage: python3 benchmarks/gate_simulation.py [--gates N] [--seed S] [--spread SD ...] [--seconds-per-round S]
                                             [--correlated SPREAD:CORRELATION ...] [--gap-rounds N]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# gate.py by its path: the bench folder on sys.path would put its statistics.py in place of the standard library's.
_SPEC = importlib.util.spec_from_file_location("gate", ROOT / "plugins" / "module_utils" / "bench" / "gate.py")
gate = importlib.util.module_from_spec(_SPEC)
sys.modules["gate"] = gate
_SPEC.loader.exec_module(gate)

REGRESSIONS_PERCENT = (0, 5, 10, 20)
# The harnesses' two clients: their ratio per round is the paired log ratio whose spread the gate meets.
REFERENCE_CLIENT = "vllm bench serve"
CANDIDATE_CLIENT = "vllm_bench"
METRIC_DIRECTIONS = {"output_throughput": gate.HIGHER_IS_BETTER, "median_ttft_ms": gate.LOWER_IS_BETTER}
WIDE_ROUND = re.compile(
    r"^round (?P<round>\d+)\s+C=(?P<concurrency>\d+)\s+(?P<client>vllm bench serve|vllm_bench)\s+output\s+"
    r"(?P<output_throughput>[\d.]+) tok/s\s+median TTFT\s+(?P<median_ttft_ms>[\d.]+) ms"
)


def harness_rounds(path: Path) -> dict:
    """{(concurrency, metric): (reference rounds, candidate rounds)} from a GPU harness's serve_bench runs."""
    runs = json.loads(path.read_text())["serve_bench"]["runs"]
    series = {}
    for concurrency, reference in runs[REFERENCE_CLIENT].items():
        candidate = runs[CANDIDATE_CLIENT][concurrency]
        for metric in METRIC_DIRECTIONS:
            series[(int(concurrency), metric)] = ([r[metric] for r in reference], [r[metric] for r in candidate])
    return series


def wide_rounds(path: Path) -> dict:
    """The same from compare_vllm_bench.py's log on the CPU build (warm-up rounds left out, as it leaves them)."""
    by_client = {}
    for line in path.read_text().splitlines():
        found = WIDE_ROUND.match(line)
        if found:
            for metric in METRIC_DIRECTIONS:
                key = (int(found["concurrency"]), metric, found["client"])
                by_client.setdefault(key, {})[int(found["round"])] = float(found[metric])
    series = {}
    for (concurrency, metric, client), rounds in by_client.items():
        if client == REFERENCE_CLIENT:
            candidate = by_client[(concurrency, metric, CANDIDATE_CLIENT)]
            series[(concurrency, metric)] = (
                [rounds[n] for n in sorted(rounds)],
                [candidate[n] for n in sorted(rounds)],
            )
    return series


RECORDS = {
    "CPU build, wide, 10 rounds": ("compare-vllm-bench-wide.txt", wide_rounds),
    "H200, compiled, 4 rounds": ("gpu-harness-bench.json", harness_rounds),
    "H200, eager (host_a), 2 rounds": ("gpu-harness-bench-host-a.json", harness_rounds),
}


def pooled_sd(samples: list) -> float:
    """The standard deviation pooled over samples, each weighted by its degrees of freedom."""
    squares = sum((len(sample) - 1) * statistics.variance(sample) for sample in samples)
    return math.sqrt(squares / sum(len(sample) - 1 for sample in samples))


def recorded_spreads() -> list:
    """One row per record and metric: paired and unpaired spreads pooled over levels, and the widest level's."""
    rows = []
    for record, (file_name, read) in RECORDS.items():
        series = read(RESULTS / file_name)
        for metric, direction in METRIC_DIRECTIONS.items():
            levels = sorted(concurrency for concurrency, name in series if name == metric)
            paired = {c: [math.log(b / a) for a, b in zip(*series[(c, metric)], strict=True)] for c in levels}
            own = [[math.log(v) for v in side] for c in levels for side in series[(c, metric)]]
            widest = max(levels, key=lambda c: statistics.stdev(paired[c]))
            rows.append(
                {
                    "source": f"{record}, {metric}",
                    "file": file_name,
                    "direction": direction,
                    "spread": pooled_sd(list(paired.values())),
                    "drift": pooled_sd(own),
                    "levels": {c: round(statistics.stdev(paired[c]), 3) for c in levels},
                    "widest": widest,
                }
            )
    return rows


class RoundModel:
    """Paired rounds with drift common to the machine and heavy-tailed independent noise, both in log space."""

    def __init__(self, spread: float, drift: float, drift_correlation: float, tail_df: int):
        # The paired log ratio's variance: 2 (1 - rho) drift^2 from the drift between a round's two slots, plus 2
        # noise^2. Where the drift alone would exceed the recorded spread, it is cut to fit.
        drift_share = 2 * (1 - drift_correlation) * drift**2
        if drift_share > spread**2:
            drift = spread / math.sqrt(2 * (1 - drift_correlation))
            drift_share = spread**2
        self.drift = drift
        self.noise = math.sqrt((spread**2 - drift_share) / 2)
        self.correlation = drift_correlation
        self.tail_df = tail_df
        self.t_scale = math.sqrt((tail_df - 2) / tail_df)  # Student t of unit variance

    def heavy_tailed(self, rng: random.Random) -> float:
        normal = rng.gauss(0.0, 1.0)
        chi_square = rng.gammavariate(self.tail_df / 2, 2.0)
        return normal / math.sqrt(chi_square / self.tail_df) * self.t_scale

    def rounds(self, rng: random.Random, worsening_log: float, direction: str):
        """Endless (reference, candidate) rounds of values around 1000, the candidate worse by `worsening_log`."""
        candidate_shift = -worsening_log if direction == gate.HIGHER_IS_BETTER else worsening_log
        innovation = self.drift * math.sqrt(1 - self.correlation**2)
        drift = rng.gauss(0.0, self.drift)
        reference_first = True
        while True:
            slots = []
            for _slot in range(2):
                slots.append(drift + self.noise * self.heavy_tailed(rng))
                drift = self.correlation * drift + rng.gauss(0.0, innovation)
            reference_log, candidate_log = slots if reference_first else slots[::-1]
            reference_first = not reference_first
            yield 1000 * math.exp(reference_log), 1000 * math.exp(candidate_log + candidate_shift)


class OldInstanceFirst:
    """(baseline, candidate) rounds of one server's values around 1000, as a gate against the old instance measured
    first sees them: the baseline's rounds, then `gap` rounds' time for the switch, then the candidate's, all on one
    AR(1) process in log space of standard deviation `spread` and lag-one correlation `correlation`.

    The baseline is whole before the gate starts, so its own rounds' correlation is the gate's least (as
    rounds.baseline_rounds sets it for the module)."""

    def __init__(self, rng, spread, correlation, baseline_rounds, gap, worsening_log, direction):
        self.rng = rng
        self.correlation = correlation
        self.innovation = spread * math.sqrt(1 - correlation**2)
        self.level = rng.gauss(0.0, spread)
        self.baseline = [self.step() for _round in range(baseline_rounds)]
        for _round in range(gap):
            self.step()
        self.candidate_shift = -worsening_log if direction == gate.HIGHER_IS_BETTER else worsening_log
        self.next_round = 0

    def step(self) -> float:
        value = self.level
        self.level = self.correlation * self.level + self.rng.gauss(0.0, self.innovation)
        return value

    def least_correlation(self) -> float:
        return gate.serial_correlation(self.baseline)

    def __iter__(self):
        return self

    def __next__(self):
        reference_log = self.baseline[self.next_round]
        self.next_round += 1
        return 1000 * math.exp(reference_log), 1000 * math.exp(self.step() + self.candidate_shift)


class PeerRounds:
    """(reference, candidate) rounds of two servers on two machines, measured in the same rounds, each machine's log
    values on its own AR(1) process: no drift is common to both, so none cancels.

    With `earlier_rounds`, an earlier gate of as many rounds between the same two machines (no change) measured
    their correlation first, and the gate is given it (the module's serial_correlation)."""

    def __init__(self, rng, spread, correlation, worsening_log, direction, earlier_rounds=0):
        self.rng = rng
        self.spread = spread
        self.correlation = correlation
        self.innovation = spread * math.sqrt(1 - correlation**2)
        self.candidate_shift = 0.0
        self.levels = [rng.gauss(0.0, spread), rng.gauss(0.0, spread)]
        earlier = [next(self) for _round in range(earlier_rounds)]
        self.earlier = gate.serial_correlation([math.log(after / before) for before, after in earlier])
        self.levels = [rng.gauss(0.0, spread), rng.gauss(0.0, spread)]
        self.candidate_shift = -worsening_log if direction == gate.HIGHER_IS_BETTER else worsening_log

    def least_correlation(self) -> float:
        return self.earlier

    def __iter__(self):
        return self

    def __next__(self):
        reference, candidate = self.levels
        self.levels = [self.correlation * level + self.rng.gauss(0.0, self.innovation) for level in self.levels]
        return 1000 * math.exp(reference), 1000 * math.exp(candidate + self.candidate_shift)


def worsening_log(percent: float, direction: str) -> float:
    """A true regression of `percent` as the gate reckons it: throughput times (1 - p), latency times (1 + p)."""
    return gate.regression_log_threshold(percent, direction) if percent else 0.0


def one_gate(model, settings, direction, percent, metrics, rng) -> tuple[str, int]:
    """A gate run until it finishes: (decision, rounds run). The regression is the first metric's; others unchanged.

    The gate is asked at min_rounds and then each time the rounds have doubled, not after every round: a call over
    n rounds decides as calls after each of them would (each metric stops at its first boundary, the gate at the
    first regression or when all have passed), so the answer is the same and the simulation quicker.
    """
    sources = [
        model(rng, worsening_log(percent, direction) if index == 0 else 0.0, direction) for index in range(metrics)
    ]
    if hasattr(sources[0], "least_correlation"):
        settings = dataclasses.replace(settings, least_correlation=sources[0].least_correlation())
    series = [
        {"name": f"metric {index}", "direction": direction, "reference": [], "candidate": []}
        for index in range(metrics)
    ]
    count = settings.min_rounds
    while True:
        for metric, source in zip(series, sources, strict=True):
            while len(metric["reference"]) < count:
                reference, candidate = next(source)
                metric["reference"].append(reference)
                metric["candidate"].append(candidate)
        result = gate.gate(series, settings)
        if result["finished"]:
            return result["decision"], stopping_round(result, settings)
        count = min(2 * count, settings.max_rounds)


def stopping_round(result: dict, settings) -> int:
    """The round after which a gate asked round by round stops: the first regression, else the last metric to pass."""
    regressed = [m["rounds"] for m in result["metrics"] if m["decision"] == gate.REGRESS]
    if regressed:
        return min(regressed)
    return result["rounds"] if result["decision"] == gate.PASS else settings.max_rounds


def simulate_cell(model, settings, direction, percent, metrics, gates, rng) -> dict:
    counts = {gate.PASS: 0, gate.REGRESS: 0, gate.UNKNOWN: 0}
    rounds_used = []
    for _gate in range(gates):
        decision, rounds = one_gate(model, settings, direction, percent, metrics, rng)
        counts[decision] += 1
        rounds_used.append(rounds)
    return {
        "rates": {decision: count / gates for decision, count in counts.items()},
        "mean_rounds": statistics.fmean(rounds_used),
        "max_rounds": max(rounds_used),
    }


TABLE_HEAD = [
    "| spread source | spread | metrics | max rounds | true regression | regress | pass | unknown | mean rounds |"
    " max rounds used | mean time | max time |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


def decided(model, settings, direction, metrics, args, rng):
    """Per true regression: (percent, the gates' outcome, its regress, pass and unknown rates as table columns)."""
    for percent in REGRESSIONS_PERCENT:
        cell = simulate_cell(model, settings, direction, percent, metrics, args.gates, rng)
        rates = cell["rates"]
        columns = f"{100 * rates[gate.REGRESS]:.1f}% | {100 * rates[gate.PASS]:.1f}% | {100 * rates[gate.UNKNOWN]:.1f}%"
        yield percent, cell, columns


def table_lines(row, settings, metrics, args, rng) -> list:
    """One line per true regression: how the gate decided over `args.gates` simulated gates."""
    model = RoundModel(row["spread"], row["drift"], args.drift_correlation, args.tail_df).rounds
    return [
        f"| {row['source']} | {row['spread']:.3f} | {metrics} | {settings.max_rounds} | {percent}% | {columns} |"
        f" {cell['mean_rounds']:.1f} | {cell['max_rounds']} |"
        f" {minutes(cell['mean_rounds'] * args.seconds_per_round)} |"
        f" {minutes(cell['max_rounds'] * args.seconds_per_round)} |"
        for percent, cell, columns in decided(model, settings, row["direction"], metrics, args, rng)
    ]


CORRELATED_HEAD = [
    "| one server's round spread | lag-one correlation | max rounds | true regression | regress | pass | unknown |"
    " mean rounds |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
]


def correlated_lines(rounds_of, spread, correlation, settings, args, rng) -> list:
    """One line per true regression, `args.gates` gates each, on rounds from rounds_of(rng, worsening, direction)."""
    return [
        f"| {spread:.3f} | {correlation:.2f} | {settings.max_rounds} | {percent}% | {columns} |"
        f" {cell['mean_rounds']:.1f} |"
        for percent, cell, columns in decided(rounds_of, settings, gate.HIGHER_IS_BETTER, 1, args, rng)
    ]


def correlated_tables(settings, args) -> list:
    """Tables 4-6: (title, rounds_of(rng, spread, correlation, worsening, direction)) each."""
    max_rounds = settings.max_rounds
    return [
        (
            f"4. Unpaired, one metric: the old instance's {max_rounds} rounds measured first, {args.gap_rounds} rounds'"
            " time for the switch, then the candidate's, round N against round N; one server's log values on an AR(1)"
            " process of the given spread and lag-one correlation:",
            lambda rng, spread, correlation, worsening, direction: OldInstanceFirst(
                rng, spread, correlation, max_rounds, args.gap_rounds, worsening, direction
            ),
        ),
        (
            "5. A peer on another machine, one metric: both measured in the same rounds, each machine's log values on"
            " its own AR(1) process of the given spread and lag-one correlation:",
            PeerRounds,
        ),
        (
            f"6. The peer of table 5, given the correlation that an earlier gate of {max_rounds} rounds between the"
            " same two machines measured (serial_correlation):",
            lambda rng, spread, correlation, worsening, direction: PeerRounds(
                rng, spread, correlation, worsening, direction, max_rounds
            ),
        ),
    ]


def spread_and_correlation(text: str) -> tuple[float, float]:
    spread, _colon, correlation = text.partition(":")
    return float(spread), float(correlation or 0)


def planned(row, settings, metrics) -> dict:
    """gate.plan_rounds for the row's spread, without the refusal: what it would take."""
    unlimited = gate.GateSettings(
        smallest_regression_percent=settings.smallest_regression_percent,
        false_alarm_rate=settings.false_alarm_rate,
        miss_rate=settings.miss_rate,
        min_rounds=settings.min_rounds,
        max_rounds=10**6,
    )
    return gate.plan_rounds(row["spread"], unlimited, metrics=metrics)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def spread_rows(args) -> list:
    if not args.spread:
        return recorded_spreads()
    return [
        {
            "source": "--spread",
            "file": None,
            "direction": gate.HIGHER_IS_BETTER,
            "spread": spread,
            "drift": args.drift if args.drift is not None else spread,
        }
        for spread in args.spread
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--gates", type=int, default=4000, help="simulated gates per cell")
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--spread", type=float, nargs="+", help="paired log ratio spreads instead of the records")
    parser.add_argument("--drift", type=float, help="one server's own round spread with --spread (default: equal)")
    parser.add_argument("--drift-correlation", type=float, default=0.8, help="drift's lag-one correlation over slots")
    parser.add_argument("--tail-df", type=int, default=3, help="Student t degrees of freedom of the noise")
    parser.add_argument("--metrics", type=int, default=3, help="metrics gated at once in the second table")
    parser.add_argument("--seconds-per-round", type=float, default=60.0, help="one round of both servers")
    parser.add_argument("--min-rounds", type=int, default=gate.GateSettings.min_rounds)
    parser.add_argument("--max-rounds", type=int, default=gate.GateSettings.max_rounds)
    parser.add_argument(
        "--correlated",
        type=spread_and_correlation,
        nargs="*",
        # One server's rounds on an H100 (benchmarks/results/gate-gpu-host-h100.md), and the same spreads uncorrelated.
        default=[(0.167, 0.23), (0.208, 0.30), (0.123, 0.48), (0.167, 0.0), (0.123, 0.0)],
        help="SPREAD:CORRELATION of one server's rounds, for tables 4 (the old instance first) and 5 (a peer)",
    )
    parser.add_argument(
        "--gap-rounds", type=int, default=20, help="rounds' time between the baseline and the candidate"
    )
    args = parser.parse_args()
    if args.tail_df <= 2:
        parser.error("--tail-df must be above 2: Student t has no variance to scale otherwise")
    rng = random.Random(args.seed)
    settings = gate.GateSettings(min_rounds=args.min_rounds, max_rounds=args.max_rounds)
    began = time.monotonic()
    rows = spread_rows(args)

    print(f"Settings: {settings}; {args.gates} gates per cell, seed {args.seed}, {args.seconds_per_round:g} s a round.")
    print(
        f"Noise: AR(1) drift over slots (correlation {args.drift_correlation}) with one server's own round spread,"
        f" plus Student t noise ({args.tail_df} df) sized so that the paired log ratio spreads as recorded;"
        " reference and candidate alternate their order round by round."
    )
    print()
    print("Spreads: the standard deviation of ln(candidate / reference) over rounds, pooled over levels.")
    print()
    print("| source | file | direction | paired spread | one server's own spread | per level (C: spread) |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for row in rows:
        print(
            f"| {row['source']} | {row.get('file') or '-'} | {row['direction']} is better | {row['spread']:.3f} |"
            f" {row['drift']:.3f} | {row.get('levels', '-')} |"
        )
    print()
    print("What the gate plans (gate.plan_rounds; it refuses where the most rounds exceed max_rounds):")
    print()
    print("| source | spread | metrics | expected rounds, no change | expected rounds, regression | most rounds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        for metrics in (1, args.metrics):
            plan = planned(row, settings, metrics)
            print(
                f"| {row['source']} | {row['spread']:.3f} | {metrics} | {plan['expected_rounds_no_change']} |"
                f" {plan['expected_rounds_regression']} | {plan['most_rounds']} |"
            )
    print()
    print(f"1. One metric, the default settings (max_rounds {settings.max_rounds}):")
    print()
    print("\n".join(TABLE_HEAD))
    for row in rows:
        print("\n".join(table_lines(row, settings, 1, args, rng)))
    fitting = [row for row in rows if planned(row, settings, args.metrics)["most_rounds"] <= settings.max_rounds]
    if fitting:
        print()
        print(
            f"2. {args.metrics} metrics gated at once, the regression in one of them (false alarms split evenly),"
            " where the plan fits max_rounds:"
        )
        print()
        print("\n".join(TABLE_HEAD))
        for row in fitting:
            print("\n".join(table_lines(row, settings, args.metrics, args, rng)))
    beyond = [row for row in rows if planned(row, settings, 1)["most_rounds"] > settings.max_rounds]
    if beyond:
        print()
        print("3. One metric, where the plan does not fit: max_rounds raised to the most rounds that the plan asks:")
        print()
        print("\n".join(TABLE_HEAD))
        for row in beyond:
            enough = gate.GateSettings(
                min_rounds=settings.min_rounds, max_rounds=planned(row, settings, 1)["most_rounds"]
            )
            print("\n".join(table_lines(row, enough, 1, args, rng)))
    if args.correlated:
        for title, rounds_of in correlated_tables(settings, args):
            print()
            print(title)
            print()
            print("\n".join(CORRELATED_HEAD))
            for spread, correlation in args.correlated:

                def source(model_rng, worsening, direction, spread=spread, correlation=correlation, of=rounds_of):
                    return of(model_rng, spread, correlation, worsening, direction)

                print("\n".join(correlated_lines(source, spread, correlation, settings, args, rng)))
    print()
    print(f"Ran in {time.monotonic() - began:.0f} s.")


if __name__ == "__main__":
    main()
