# Copyright: llmops.vllm contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rollout gate over paired rounds: pass, regress or unknown, with stated error rates.

One bench run against a saved baseline cannot gate a rollout: rounds of the same server differ by up to a third, and
two machines of one kind by more. So the reference and the candidate are measured in the same window, interleaved
(reference then candidate in one round, the other order in the next), and each round gives one paired log ratio
per metric, ln(candidate / reference); drift common to both cancels in it.

Per metric, a sequential probability ratio test (Wald's SPRT; as in Stockfish's fishtest, a generalized likelihood
ratio with the variance estimated from the rounds) weighs "no regression" against "a regression of at least the
smallest size worth a rollback", round after round from `min_rounds` on, and stops at the first boundary: clear
cases after a few rounds, unclear ones at `max_rounds` as unknown. The false-alarm rate is split evenly over the
metrics gated (Bonferroni), so that it holds for the gate as a whole; the miss rate holds per metric, half of it
for wrong passes and half for unknowns at `max_rounds` (sized by `plan_rounds`).

Rounds are not always independent: a machine's speed runs in spells of several rounds, which the pairing cancels
only where both servers share them. Each test therefore estimates the rounds' lag-one correlation and weighs the
rounds as the fewer independent rounds they are worth (n (1 - r) / (1 + r), as an AR(1) process's mean is), in its
evidence and in its interval: spells widen the interval and ask for more rounds instead of raising false alarms.
A correlation estimated from a few rounds is often low by chance, just where the rounds mislead; one measured
before (`least_correlation`: an earlier gate's, or a saved baseline's own rounds) holds it up.

Pure functions on plain data, standard library only: it runs inside Ansible modules on any host.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass

HIGHER_IS_BETTER = "higher"
LOWER_IS_BETTER = "lower"
DIRECTIONS = (HIGHER_IS_BETTER, LOWER_IS_BETTER)

PASS = "pass"
REGRESS = "regress"
UNKNOWN = "unknown"

# A miss is a pass or an unknown where the candidate regressed: half the miss rate goes to the test's pass boundary,
# half to the rounds running out, which plan_rounds sizes max_rounds for.
WRONG_PASS_SHARE = 0.5
# Rounds' worth of evidence the likelihood ratio forgoes for the variance it estimates (see log_likelihood_ratio).
SMALL_SAMPLE_ROUNDS = 2
# Fewer rounds leave no evidence after that correction.
FEWEST_ROUNDS = SMALL_SAMPLE_ROUNDS + 1
# The highest lag-one correlation of the rounds that the gate believes: at 0.9 forty rounds are worth two.
MOST_CORRELATION = 0.9


@dataclass(frozen=True)
class GateSettings:
    """What the user asks of the gate; checked when made, each refusal naming its setting."""

    smallest_regression_percent: float = 10.0
    false_alarm_rate: float = 0.05
    miss_rate: float = 0.05
    min_rounds: int = 5
    max_rounds: int = 40
    least_correlation: float = 0.0

    def __post_init__(self):
        check_number("smallest_regression_percent", self.smallest_regression_percent, 0, 100)
        value = self.least_correlation
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MOST_CORRELATION:
            raise ValueError(
                f"least_correlation must be a lag-one correlation from 0 to {MOST_CORRELATION:g}, got {value!r}"
            )
        check_number("false_alarm_rate", self.false_alarm_rate, 0, 0.5)
        check_number("miss_rate", self.miss_rate, 0, 0.5)
        for name in ("min_rounds", "max_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be a whole number of rounds, got {value!r}")
        if self.min_rounds < FEWEST_ROUNDS:
            raise ValueError(
                f"min_rounds must be at least {FEWEST_ROUNDS}, got {self.min_rounds}: fewer rounds cannot estimate "
                "how much the rounds spread"
            )
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds ({self.max_rounds}) must be at least min_rounds ({self.min_rounds})")


def check_number(name: str, value, low: float, high: float) -> None:
    """Refuse a setting that is not a number strictly between `low` and `high`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise ValueError(f"{name} must be a number above {low:g} and below {high:g}, got {value!r}")


def normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with a whole number of degrees of freedom, in closed form.

    Abramowitz and Stegun 26.7.3 (odd df) and 26.7.4 (even df): A(t|df) = P(|T| <= t) is a finite series in
    theta = atan(t / sqrt(df)); with theta signed, (1 + A) / 2 is the distribution function on both sides.
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"degrees of freedom must be a whole number of at least 1, got {df!r}")
    theta = math.atan(t / math.sqrt(df))
    cos_squared = math.cos(theta) ** 2
    if df % 2:
        term = math.cos(theta)
        series = 0.0
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= cos_squared * (2 * k) / (2 * k + 1)
        both_sides = 2 / math.pi * (theta + math.sin(theta) * series)
    else:
        term = 1.0
        series = 0.0
        for k in range(df // 2):
            series += term
            term *= cos_squared * (2 * k + 1) / (2 * k + 2)
        both_sides = math.sin(theta) * series
    return (1 + both_sides) / 2


@functools.lru_cache(maxsize=1024)
def student_t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p, by bisection of the distribution function (monotonic, so it cannot miss)."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile's probability must lie between 0 and 1, got {p!r}")
    if p < 0.5:
        return -student_t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2
    for _step in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def regression_log_threshold(percent: float, direction: str) -> float:
    """The smallest regression, as a worsening log ratio: 10% less throughput is ln(1/0.9), 10% more TTFT ln(1.1)."""
    fraction = percent / 100
    return -math.log(1 - fraction) if direction == HIGHER_IS_BETTER else math.log(1 + fraction)


def paired_log_ratios(reference: list, candidate: list) -> list:
    """ln(candidate / reference) per round."""
    return [math.log(after / before) for before, after in zip(reference, candidate, strict=True)]


def worsening(log_ratios: list, direction: str) -> list:
    """The log ratios signed so that a positive value is a worse candidate."""
    sign = -1.0 if direction == HIGHER_IS_BETTER else 1.0
    return [sign * value for value in log_ratios]


def serial_correlation(values: list) -> float:
    """The rounds' lag-one correlation, corrected for its bias in few rounds, held within [0, MOST_CORRELATION].

    The sample autocorrelation r of n values around their own mean falls short of an AR(1) process's rho by about
    (1 + 3 rho) / n; (n r + 1) / (n - 3) undoes that. A negative correlation (the interleaved order alternating) is
    read as none: it would only lend the rounds more weight than independent ones.
    """
    count = len(values)
    if count <= 3:
        return 0.0
    mean = math.fsum(values) / count
    deviations = [value - mean for value in values]
    squares = math.fsum(value * value for value in deviations)
    if squares == 0:
        return 0.0
    lagged = math.fsum(first * second for first, second in itertools.pairwise(deviations))
    corrected = (count * lagged / squares + 1) / (count - 3)
    return min(max(corrected, 0.0), MOST_CORRELATION)


def weighed_correlation(values: list, least_correlation: float) -> float:
    """The correlation the test weighs the rounds by: their own estimate, or the one measured before where higher."""
    return max(serial_correlation(values), least_correlation)


def effective_rounds(count: int, correlation: float) -> float:
    """What `count` rounds of an AR(1) process with this lag-one correlation are worth in independent rounds."""
    return count * (1 - correlation) / (1 + correlation)


def log_likelihood_ratio(
    count: int, total: float, total_of_squares: float, threshold: float, correlation: float = 0.0
) -> float:
    """Log likelihood ratio of "a regression of `threshold` or more" against "none or an improvement".

    Normal rounds of unknown variance, each hypothesis at its best-fitting mean (the rounds' mean, held to at most 0,
    or at least the threshold) and variance: (n/2) ln(S0 / S1), where Sk = S + n (mean - mu_k)^2 is the sum of
    squared deviations from hypothesis k's mean, S the rounds' own. Fitting within each side, not at the two points,
    lets a large regression or a clear improvement decide in a few rounds, where point hypotheses both fit badly and
    absorb the misfit into the variance.
    The factor is (n - 2)/2, not n/2: estimated from few rounds, the variance makes the plain ratio cross too soon
    (false alarms of 7% where 5% were asked, at spreads twice the threshold); two rounds' worth of evidence less
    keeps them under (benchmarks/results/gate-simulation.md).
    Rounds correlated in time: their mean wanders n / effective_rounds times as far as independent rounds' would, so
    each distance n (mean - mu_k)^2 is weighed against that much more variance. Near the boundaries, where the
    decision is close, the ratio then shrinks by that factor; a clear case, far from them, still decides at once.
    """
    mean = total / count
    none_mean = min(mean, 0.0)
    regression_mean = max(mean, threshold)
    own = total_of_squares - 2 * mean * total + count * mean**2
    inflation = count / effective_rounds(count, correlation)
    from_none = own + count * (mean - none_mean) ** 2 / inflation
    from_regression = own + count * (mean - regression_mean) ** 2 / inflation
    if from_regression <= 0:
        return math.inf
    if from_none <= 0:
        return -math.inf
    return (count - SMALL_SAMPLE_ROUNDS) / 2 * math.log(from_none / from_regression)


def boundaries(false_alarm_rate: float, miss_rate: float) -> tuple[float, float]:
    """Wald's boundaries in the form that bounds the error rates rather than approximates them: (lower, upper)."""
    return math.log(miss_rate), math.log(1 / false_alarm_rate)


def sequential_test(
    worse_log_ratios: list,
    threshold: float,
    false_alarm_rate: float,
    miss_rate: float,
    min_rounds: int,
    least_correlation: float = 0.0,
):
    """Wald's SPRT over the rounds in order: (decision, rounds used, log likelihood ratio at that round).

    The decision is pass or regress at the first round from `min_rounds` on where the ratio leaves Wald's boundaries,
    else unknown after all the rounds given. The rounds' serial correlation is estimated anew at each round, and
    taken as `least_correlation` where it comes out lower.
    """
    lower, upper = boundaries(false_alarm_rate, miss_rate)
    total = total_of_squares = 0.0
    ratio = 0.0
    for count, value in enumerate(worse_log_ratios, start=1):
        total += value
        total_of_squares += value * value
        if count < min_rounds:
            continue
        correlation = weighed_correlation(worse_log_ratios[:count], least_correlation)
        ratio = log_likelihood_ratio(count, total, total_of_squares, threshold, correlation)
        if ratio >= upper:
            return REGRESS, count, ratio
        if ratio <= lower:
            return PASS, count, ratio
    return UNKNOWN, len(worse_log_ratios), ratio


def spread_of(log_ratios: list) -> float:
    """The sample standard deviation (n - 1) in floats: statistics.stdev's exact fractions cost a simulation minutes."""
    mean = math.fsum(log_ratios) / len(log_ratios)
    return math.sqrt(math.fsum((value - mean) ** 2 for value in log_ratios) / (len(log_ratios) - 1))


def change_interval(
    log_ratios: list, spread: float, confidence: float, correlation: float = 0.0
) -> tuple[float, float, float]:
    """The candidate's change in percent, with a two-sided t interval on the mean log ratio: (estimate, low, high).

    Rounds correlated in time count as the independent rounds they are worth in the interval's width.
    """
    count = len(log_ratios)
    mean = math.fsum(log_ratios) / count
    worth = effective_rounds(count, correlation)
    half_width = student_t_quantile((1 + confidence) / 2, count - 1) * spread / math.sqrt(worth)
    return tuple(100 * math.expm1(value) for value in (mean, mean - half_width, mean + half_width))


def check_series(series: list, settings: GateSettings) -> None:
    """Refuse measurements that the gate cannot weigh, saying which metric and which round."""
    if not isinstance(series, list) or not series:
        raise ValueError("the gate needs at least one metric: a list of {name, direction, reference, candidate}")
    names = set()
    for index, metric in enumerate(series):
        if not isinstance(metric, dict):
            raise ValueError(f"metric {index} must be a mapping of name, direction, reference and candidate")
        missing = [key for key in ("name", "direction", "reference", "candidate") if key not in metric]
        if missing:
            raise ValueError(f"metric {metric.get('name', index)!r} lacks {', '.join(missing)}")
        name = metric["name"]
        if name in names:
            raise ValueError(f"metric {name!r} is given twice")
        names.add(name)
        if metric["direction"] not in DIRECTIONS:
            raise ValueError(
                f"metric {name!r}: direction must be {HIGHER_IS_BETTER!r} (throughput) or {LOWER_IS_BETTER!r}"
                f" (latency), got {metric['direction']!r}"
            )
        reference, candidate = metric["reference"], metric["candidate"]
        if not isinstance(reference, list) or not isinstance(candidate, list) or len(reference) != len(candidate):
            raise ValueError(
                f"metric {name!r}: reference and candidate must be lists of one value per round, paired, of the same "
                "length"
            )
        if len(reference) > settings.max_rounds:
            raise ValueError(
                f"metric {name!r}: {len(reference)} rounds given, more than max_rounds ({settings.max_rounds})"
            )
        for side, values in (("reference", reference), ("candidate", candidate)):
            for round_number, value in enumerate(values, start=1):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                    raise ValueError(
                        f"metric {name!r}: the {side}'s value of round {round_number} must be a positive number,"
                        f" got {value!r}"
                    )
    counts = {len(metric["reference"]) for metric in series}
    if len(counts) > 1:
        raise ValueError(f"every metric must have the same rounds; the metrics have {sorted(counts)} rounds")


def judge_metric(metric: dict, settings: GateSettings, false_alarm_rate: float) -> dict:
    """One metric's decision, its change with a (1 - false_alarm_rate) interval, and the rounds it used."""
    direction = metric["direction"]
    log_ratios = paired_log_ratios(metric["reference"], metric["candidate"])
    threshold = regression_log_threshold(settings.smallest_regression_percent, direction)
    decision, rounds_used, ratio = sequential_test(
        worsening(log_ratios, direction),
        threshold,
        false_alarm_rate,
        WRONG_PASS_SHARE * settings.miss_rate,
        settings.min_rounds,
        settings.least_correlation,
    )
    judged = {
        "name": metric["name"],
        "direction": direction,
        "decision": decision,
        "rounds": rounds_used,
        "log_likelihood_ratio": ratio,
        "confidence": 1 - false_alarm_rate,
        "change_percent": None,
        "interval_percent": None,
        "spread": None,
        "serial_correlation": None,
        "effective_rounds": None,
    }
    used = log_ratios[:rounds_used]
    if len(used) >= 2:
        spread = spread_of(used)
        correlation = weighed_correlation(used, settings.least_correlation)
        estimate, low, high = change_interval(used, spread, 1 - false_alarm_rate, correlation)
        judged.update(
            change_percent=estimate,
            interval_percent=[low, high],
            spread=spread,
            serial_correlation=correlation,
            effective_rounds=effective_rounds(len(used), correlation),
        )
    judged["sentence"] = describe_metric(judged, settings)
    return judged


def describe_metric(judged: dict, settings: GateSettings) -> str:
    worse = "less" if judged["direction"] == HIGHER_IS_BETTER else "more"
    limit = f"a regression is {settings.smallest_regression_percent:g}% {worse} or worse"
    if judged["change_percent"] is None:
        measured = "no change measured yet"
    else:
        low, high = judged["interval_percent"]
        measured = (
            f"candidate {judged['change_percent']:+.1f}% against the reference, "
            f"{100 * judged['confidence']:g}% interval [{low:+.1f}%, {high:+.1f}%]"
        )
        if judged["serial_correlation"]:
            measured += (
                f"; rounds correlated in time ({judged['serial_correlation']:.2f}), worth"
                f" {judged['effective_rounds']:.1f} independent rounds"
            )
    return (
        f"{judged['name']}: {judged['decision']} after {judged['rounds']} of at most {settings.max_rounds} rounds"
        f" ({measured}; {limit})"
    )


def gate(series: list, settings: GateSettings | None = None) -> dict:
    """Weigh paired rounds of one or more metrics: pass, regress or unknown, for each and for the whole.

    `series`: one mapping per metric, {name, direction ('higher' or 'lower' is better), reference, candidate},
    the two lists one value per round, measured in the same rounds. Overall: regress where any metric regresses,
    pass where all pass, else unknown. `finished` is false while more rounds could still decide (fewer than
    `max_rounds` so far and no regression); the caller then runs another round and asks again.
    """
    settings = settings or GateSettings()
    check_series(series, settings)
    rounds_given = len(series[0]["reference"])
    # Bonferroni: each metric may raise a false alarm at most this often, so that the gate does at most as asked.
    false_alarm_rate = settings.false_alarm_rate / len(series)
    judged = [judge_metric(metric, settings, false_alarm_rate) for metric in series]
    decisions = {metric["decision"] for metric in judged}
    if REGRESS in decisions:
        decision = REGRESS
    elif decisions == {PASS}:
        decision = PASS
    else:
        decision = UNKNOWN
    finished = decision != UNKNOWN or rounds_given >= settings.max_rounds
    rounds_used = max(metric["rounds"] for metric in judged)
    return {
        "decision": decision,
        "finished": finished,
        "rounds": rounds_used,
        "rounds_given": rounds_given,
        "false_alarm_rate_per_metric": false_alarm_rate,
        "metrics": judged,
        "sentence": describe_gate(decision, finished, rounds_given, judged, settings),
    }


def describe_gate(decision: str, finished: bool, rounds_given: int, judged: list, settings: GateSettings) -> str:
    deciding = [metric for metric in judged if metric["decision"] == decision] if decision != UNKNOWN else judged
    if decision == UNKNOWN and not finished:
        opening = f"unknown so far after {rounds_given} rounds: run another round (at most {settings.max_rounds})"
    elif decision == UNKNOWN:
        opening = (
            f"unknown after the maximum of {settings.max_rounds} rounds: the rounds spread too much to tell a"
            f" {settings.smallest_regression_percent:g}% regression from none"
        )
    else:
        opening = f"{decision}"
    return (
        f"{opening}; false alarms at most {100 * settings.false_alarm_rate:g}% over {len(judged)} metric(s), misses"
        f" at most {100 * settings.miss_rate:g}% each. " + "; ".join(metric["sentence"] for metric in deciding)
    )


def rounds_to_leave(boundary: float, error_rate: float, effect: float) -> float:
    """Rounds after which the ratio lies beyond `boundary` with probability 1 - error_rate, under the hypothesis that
    it moves towards.

    After n rounds the ratio is about normal, mean n effect^2 / 2 towards the boundary and standard deviation
    sqrt(n) effect (effect: threshold / spread); the round n solves mean - z sd = |boundary|. Paths that crossed
    the other boundary before count as still inside, so it bounds the rounds from above.
    """
    z = normal_quantile(1 - error_rate)
    return ((z + math.sqrt(z**2 + 2 * abs(boundary))) / effect) ** 2


def correlation_words(correlation: float) -> str:
    return f", correlated in time by {correlation:g}" if correlation else ""


def plan_rounds(
    spread: float,
    settings: GateSettings | None = None,
    metrics: int = 1,
    seconds_per_round: float | None = None,
    time_budget_s: float | None = None,
) -> dict:
    """How many rounds the gate expects and at most needs on a host whose paired log ratio spreads by `spread`.

    `spread` is the standard deviation of ln(candidate / reference) over rounds, about the coefficient of variation
    of the paired ratio, measured on the host. Expected rounds are Wald's approximations for a normal mean of known
    variance, with no change and with the smallest regression. The rounds needed at most are those after which the
    test has left its boundaries, under either hypothesis, but for the share of the miss rate left to unknowns
    (WRONG_PASS_SHARE), bounded with the normal law of the log likelihood ratio at that round. Rounds correlated in
    time (settings.least_correlation) bring less evidence each, as the fewer independent rounds they are worth.
    Refuses, with a ValueError that names the setting to change, settings whose rounds exceed max_rounds or whose
    time exceeds time_budget_s.
    """
    settings = settings or GateSettings()
    check_number("spread", spread, 0, math.inf)
    if isinstance(metrics, bool) or not isinstance(metrics, int) or metrics < 1:
        raise ValueError(f"metrics must be the whole number of metrics gated, at least 1, got {metrics!r}")
    if seconds_per_round is not None:
        check_number("seconds_per_round", seconds_per_round, 0, math.inf)
    if time_budget_s is not None:
        check_number("time_budget_s", time_budget_s, 0, math.inf)
        if seconds_per_round is None:
            raise ValueError("time_budget_s needs seconds_per_round, the time of one round of both servers")
    false_alarm_rate = settings.false_alarm_rate / metrics
    wrong_pass_rate = WRONG_PASS_SHARE * settings.miss_rate
    unknown_rate = settings.miss_rate - wrong_pass_rate
    # Throughput's threshold is the larger of the two directions' (ln(1/0.9) > ln(1.1)); plan for the smaller.
    threshold = regression_log_threshold(settings.smallest_regression_percent, LOWER_IS_BETTER)
    lower, upper = boundaries(false_alarm_rate, wrong_pass_rate)
    # Evidence per round: the log likelihood ratio moves by +-threshold^2 / (2 spread^2) on average, after the
    # rounds that the small-sample correction forgoes; rounds in spells weigh as independent ones of a wider spread.
    independent_spread = spread / math.sqrt(effective_rounds(1, settings.least_correlation))
    evidence_per_round = threshold**2 / (2 * independent_spread**2)
    expected_no_change = (false_alarm_rate * upper + (1 - false_alarm_rate) * lower) / -evidence_per_round
    expected_regression = ((1 - wrong_pass_rate) * upper + wrong_pass_rate * lower) / evidence_per_round
    most = max(
        rounds_to_leave(upper, unknown_rate, threshold / independent_spread),
        rounds_to_leave(lower, unknown_rate, threshold / independent_spread),
    )
    floor = settings.min_rounds
    plan = {
        "spread": spread,
        "metrics": metrics,
        "false_alarm_rate_per_metric": false_alarm_rate,
        "expected_rounds_no_change": max(floor, math.ceil(expected_no_change) + SMALL_SAMPLE_ROUNDS),
        "expected_rounds_regression": max(floor, math.ceil(expected_regression) + SMALL_SAMPLE_ROUNDS),
        "most_rounds": max(floor, math.ceil(most) + SMALL_SAMPLE_ROUNDS),
        "seconds": None,
    }
    if plan["most_rounds"] > settings.max_rounds:
        raise ValueError(
            f"max_rounds ({settings.max_rounds}) is too few: with rounds that spread by {spread:g} (log ratio"
            f"{correlation_words(settings.least_correlation)}), the"
            f" gate needs up to {plan['most_rounds']} rounds to tell a {settings.smallest_regression_percent:g}%"
            f" regression from none with false alarms below {100 * settings.false_alarm_rate:g}% over {metrics}"
            f" metric(s) and misses below {100 * settings.miss_rate:g}%; raise max_rounds, raise"
            " smallest_regression_percent, accept higher false_alarm_rate or miss_rate, gate fewer metrics, or steady"
            " the host"
        )
    if seconds_per_round is not None:
        plan["seconds"] = {
            "expected_no_change": plan["expected_rounds_no_change"] * seconds_per_round,
            "expected_regression": plan["expected_rounds_regression"] * seconds_per_round,
            "most": plan["most_rounds"] * seconds_per_round,
        }
        if time_budget_s is not None and plan["seconds"]["most"] > time_budget_s:
            raise ValueError(
                f"time_budget_s ({time_budget_s:g}) is too short: the gate may need {plan['most_rounds']} rounds of"
                f" {seconds_per_round:g} s, {plan['seconds']['most']:g} s; raise time_budget_s, shorten a round, or"
                " relax smallest_regression_percent, false_alarm_rate or miss_rate"
            )
    return plan
