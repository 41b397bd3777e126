"""`dppipeline tune`: contribution bounds and clipping bounds recommended from the data, privately.

Bounds decide accuracy as much as epsilon does: bounds too tight drop rows (bias), bounds too
loose add noise. `tune` spends a stated budget, recorded in the ledger like any release, on
three DP statistics of one query's rows (filter and keys applied), all noised by pipeline-dp /
PyDP secure mechanisms and split by a pipeline-dp accountant:

1. `partitions_per_unit`: per privacy unit, the number of partitions it contributes to, as a
   histogram. Each unit adds 1 to one bin: L1 sensitivity 1.
2. `rows_per_pair`: the sizes of each unit's (unit, partition) pairs, as a histogram in which
   each unit's pairs weigh 1 / (its number of pairs): a unit moves the histogram by at most 1
   in total (L1 sensitivity 1). It estimates the average unit's pair-size distribution.
3. `values`: a histogram of the values, ten bins per decade (mirrored below zero), each unit's
   rows weighing 1 / (its number of rows): L1 sensitivity 1. The clipping bounds are the bin
   edges where the noisy cumulative share passes 0.5% and 99.5%. (PyDP's quantile tree was
   tried first: over a public range wide enough for unknown amounts, [0, 10000], its noise on
   the many empty nodes put the 99.5th percentile of amounts below 200 at 8,824.)

From the noisy histograms (post-processing only) it estimates, for every
candidate (L0, Linf), the share of rows bounding keeps, assuming a unit's number of partitions
and its pairs' sizes are independent, and the count noise the job's own budget would give with
those bounds; it recommends the candidate with the smallest sqrt(bias^2 + noise^2) per
partition, bias = rows dropped / partitions. For a query that releases a mean, only candidates
whose mean noise at the typical partition (the plan's noise on the centred sum over the rows that
partition keeps) stays within MEAN_NOISE_SHARE of the value range are recommended: looser
bounds lower the count's bias but divide more noise by a count that grows less, and a mean lost
in its noise is released clamped to a bound.

`tune` never fails once it has read data: whether it fails would depend on the data, and the
spend could not be released. When the noise hides a statistic it recommends what it can,
names what it could not and the tune epsilon that would do, and exits 0. Everything that can
refuse (flags, the job, the input's days, the output file, the ledger's cap) is checked
before the first byte is read, and such a refusal spends nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from dppipeline.core.plan import MechanismBudget
from dppipeline.core.tasks import plan_tasks
from dppipeline.engines.in_process import task_rows, validated_rows
from dppipeline.errors import UsageError
from dppipeline.ledger import Reservation
from dppipeline.lifecycle.charge import charged
from dppipeline.lifecycle.public_keys import read_key_files
from dppipeline.lifecycle.runner import (
    budget_policy,
    input_days,
    ledger_line,
    make_plan,
    open_ledger,
    release_key,
    settle_expired,
)
from dppipeline.spec.limits import MIN_EPSILON
from dppipeline.spec.model import JobSpec, QuerySpec

# Histogram bins: exact small values, then coarser; the last bin is open-ended.
BIN_EDGES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300)
CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 75, 100, 150, 200)
# Value histogram edges, ten per decade (non-negative side; mirrored below zero): 0.1 .. 8e6.
VALUE_EDGES = tuple(
    round(m * 10.0**e, 6) for e in range(-1, 7) for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
)
EMPTY_BIN_RISK = 1e-6  # chance that any empty bin of a histogram keeps noise mass
TAIL = 0.005  # share of the value distribution the clipping bounds may cut on each side
# A mean is useful when its noise at the typical partition is at most this share of the value
# range: a mean a quarter of the range from a bound then reaches it with Laplace probability
# 0.5 exp(-0.25 / 0.05 * sqrt(2)) = 0.04%.
MEAN_NOISE_SHARE = 0.05


@dataclass(frozen=True)
class Candidate:
    l0: int
    linf: int
    kept_share: float
    bias: float
    noise_std: float
    mean_noise_std: float | None = None  # at the typical partition's kept rows; None: no mean

    @property
    def error(self) -> float:
        return math.hypot(self.bias, self.noise_std)


@dataclass(frozen=True)
class Tuning:
    """Everything `tune` found: DP statistics only, and what follows from them."""

    query: str
    epsilon: float
    partitions_per_unit: list[float]
    rows_per_pair: list[float]
    values: list[float]
    partitions: int
    candidates: list[Candidate]
    best: Candidate | None  # None: the noise hides the contribution histograms
    min_value: float | None  # None: not needed, or the noise hides the value histogram
    max_value: float | None
    hidden: tuple[str, ...] = ()  # what the noise hides, for the user
    needed_epsilon: float | None = None  # the tune epsilon that would show it
    mean_limit: float | None = None  # the largest mean noise recommended (queries with mean)
    needs_values: bool = True  # the query has value bounds to recommend

    def recommendation(self) -> dict[str, float | int]:
        """The bounds recommended: only those the DP statistics support."""
        out: dict[str, float | int] = {}
        if self.best is not None:
            out["max_partitions_contributed"] = self.best.l0
            out["max_contributions_per_partition"] = self.best.linf
        if self.min_value is not None and self.max_value is not None:
            out["min_value"] = self.min_value
            out["max_value"] = self.max_value
        return out

    def to_json(self) -> dict:
        return {
            "query": self.query,
            "epsilon": self.epsilon,
            "bin_edges": list(BIN_EDGES),
            "partitions_per_unit": self.partitions_per_unit,
            "rows_per_pair": self.rows_per_pair,
            "value_edges": value_edges(),
            "values": self.values,
            "partitions": self.partitions,
            "recommendation": self.recommendation(),
            "hidden_by_noise": list(self.hidden),
            "needed_tune_epsilon": self.needed_epsilon,
        }


def bin_index(values: np.ndarray) -> np.ndarray:
    """Bin of each value >= 1: bin i holds [BIN_EDGES[i], BIN_EDGES[i + 1])."""
    return np.searchsorted(np.asarray(BIN_EDGES), values, side="right") - 1


def _mechanism(name: str, spec) -> MechanismBudget:
    return MechanismBudget(name, "laplace", spec.eps, 0.0, 1, 1.0, None)


def contribution_histograms(frame: pl.DataFrame, unit: str, keys: list[str]) -> tuple:
    """Exact (partitions per unit, weighted pair sizes) histograms: never released as such."""
    pairs = frame.group_by([unit, *keys]).agg(pl.len().alias("rows"))
    per_unit = pairs.group_by(unit).agg(pl.len().alias("pairs"))
    h1 = np.bincount(bin_index(per_unit["pairs"].to_numpy()), minlength=len(BIN_EDGES))
    weighted = pairs.join(per_unit, on=unit).with_columns((1 / pl.col("pairs")).alias("w"))
    h2 = np.bincount(
        bin_index(weighted["rows"].to_numpy()),
        weights=weighted["w"].to_numpy(),
        minlength=len(BIN_EDGES),
    )
    return h1.astype(np.float64), h2


def value_edges() -> list[float]:
    return [-e for e in reversed(VALUE_EDGES)] + [0.0, *VALUE_EDGES]


def value_histogram(frame: pl.DataFrame, unit: str) -> np.ndarray:
    """Exact weighted histogram of the values (each unit's rows weigh 1 / its rows) over the
    bins between `value_edges()` (and beyond both ends): never released as such."""
    weighted = frame.select(unit, "_value").with_columns((1 / pl.len().over(unit)).alias("w"))
    bins = np.searchsorted(np.array(value_edges()), weighted["_value"].to_numpy(), side="left")
    return np.bincount(bins, weights=weighted["w"].to_numpy(), minlength=len(value_edges()) + 1)


def clipping_bounds(hist: Sequence[float]) -> tuple[float, float]:
    """(min_value, max_value): the bin edges where the cumulative share passes TAIL and
    1 - TAIL; min_value is 0 unless more than TAIL of the mass is below zero."""
    edges = value_edges()
    share = np.cumsum(hist) / max(float(np.sum(hist)), 1e-12)
    high = edges[min(int(np.searchsorted(share, 1 - TAIL)), len(edges) - 1)]
    lower = int(np.searchsorted(share, TAIL))  # bin i covers (edges[i - 1], edges[i]]
    low = edges[max(lower - 1, 0)] if lower < len(VALUE_EDGES) else 0.0
    return min(low, 0.0), high


def noisy(mechanism: MechanismBudget, exact: np.ndarray, *, tails: bool = False) -> list[float]:
    """The histogram with Laplace noise (L1 sensitivity 1). Left unclamped by default: the
    row estimates are linear in the bins, and clamping negative noise at 0 would add phantom
    mass to every empty bin (seen: 43% of rows estimated kept where 62% were). With `tails`
    (the value histogram, whose tails decide the clipping bounds) every bin below the level
    that an empty bin's noise passes with probability EMPTY_BIN_RISK over the histogram is
    set to 0 (seen without it: clipping bounds of [-20000, 1e6] for amounts in [0, 200])."""
    from pipeline_dp import dp_computations  # noqa: PLC0415 (1.3 s of start-up: tune only)

    additive = dp_computations.create_additive_mechanism(
        mechanism.build_spec(), dp_computations.Sensitivities(l0=1, linf=1.0)
    )
    b = float(additive.std) / math.sqrt(2)
    # n * P(Lap(b) > level) = risk
    level = b * math.log(len(exact) / (2 * EMPTY_BIN_RISK)) if tails else 0.0
    released = [additive.add_noise(float(x)) for x in exact]
    if not tails:
        return released  # unclamped: the linear estimates below stay unbiased
    return [x if x > level else 0.0 for x in released]


def representative(index: int) -> float:
    """A bin's typical size: its lower edge for exact bins, the middle for coarse ones."""
    low = BIN_EDGES[index]
    high = BIN_EDGES[index + 1] if index + 1 < len(BIN_EDGES) else low * 1.5
    return float(low) if high - low == 1 else (low + high - 1) / 2


def kept_share(h1: Sequence[float], h2: Sequence[float], l0: int, linf: int) -> float:
    """Expected share of rows kept by (L0, Linf), from the two histograms."""
    sizes = np.array([representative(i) for i in range(len(BIN_EDGES))])
    q = np.asarray(h2) / max(sum(h2), 1e-12)
    row_per_pair, kept_per_pair = float(q @ sizes), float(q @ np.minimum(sizes, linf))
    pairs = np.array([representative(i) for i in range(len(BIN_EDGES))])
    units = np.asarray(h1)
    total = float(units @ pairs) * row_per_pair
    kept = float(units @ np.minimum(pairs, l0)) * kept_per_pair
    return kept / total if total > 0 else 1.0


def total_rows(h1: Sequence[float], h2: Sequence[float]) -> float:
    sizes = np.array([representative(i) for i in range(len(BIN_EDGES))])
    q = np.asarray(h2) / max(sum(h2), 1e-12)
    return float(np.asarray(h1) @ sizes) * float(q @ sizes)


def tune(
    spec: JobSpec,
    *,
    query_name: str | None,
    epsilon: float | None,
    partitions: int | None,
    ledger: str | None,
    output: Path | None,
    progress: Callable[[str], None] = print,
) -> tuple[Tuning, Path | None]:
    """Spends `epsilon` (default: a tenth of the job's) on the DP statistics above, records it
    in the ledger and returns them with the recommendation; writes them to the JSON file
    `output` only when one is given (never a file nobody asked for), returned beside them."""
    if spec.input.path is None:
        raise UsageError("--input: required (or input.path in the job spec)")
    queries = {q.name: q for q in spec.queries}
    name = query_name or spec.queries[0].name
    if name not in queries:
        raise UsageError(f"--query: no query {name!r} in the job ({', '.join(queries)})")
    query: QuerySpec = queries[name]
    eps = epsilon if epsilon is not None else spec.budget.epsilon / 10
    if not (math.isfinite(eps) and eps >= MIN_EPSILON):
        raise UsageError(
            f"--tune-epsilon: must be finite and >= 2^-50 (~{MIN_EPSILON:.2g}), got {eps:g}"
        )
    plan = make_plan(spec, require_bounds=False)  # its bounds are what tune recommends
    days = input_days(spec)
    task = plan_tasks(spec, plan, days, read_key_files(spec)).task(name)
    if partitions is None:
        if task.public_keys is None:
            raise UsageError(
                "--partitions: required for a query with private selection (how many "
                "partitions there are, e.g. the number of terminals: public knowledge)"
            )
        partitions = len(task.public_keys)
    run_id = "tune-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + uuid.uuid4().hex[:6]
    target = output
    if target is not None:
        refuse_to_replace(target)  # before anything is reserved or read
    book = open_ledger(ledger) if ledger else None
    spend: Reservation | None = None
    key = None
    if book is not None:
        request = json.dumps([spec.spec_hash(), name, eps]).encode()
        key = release_key(spec, days, "tune:" + hashlib.sha256(request).hexdigest())
        settle_expired(book, key.scope, progress)
        spend = Reservation(
            book, key, run_id=run_id, job=f"tune:{spec.name}", epsilon=eps, delta=0.0,
            output=str(target.resolve()) if target else "-", policy=budget_policy(spec),
        )  # fmt: skip
    # The charge sequence of a release (`lifecycle.charge`): reserved, reading before the
    # first byte, committed before the statistics are written where the user sees them.
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
    measure = functools.partial(
        _measure, spec, query, task, days, eps=eps, partitions=partitions, progress=progress
    )
    result = charged(spend, _TuneFile(measure, target, run_id))
    if book is not None and key is not None:
        progress(ledger_line(book, f"committed {run_id}: epsilon={eps:g} in scope {key.scope!r}"))
    return result, target


class _TuneFile:
    """Tune's statistics as the charge sequence drives them: measured, written to a hidden
    file beside `target`, renamed onto it once committed (no file at all without `target`)."""

    def __init__(self, measure: Callable[[], Tuning], target: Path | None, run_id: str):
        self._measure, self._target = measure, target
        self._partial = None if target is None else target.with_name(f".{target.name}.{run_id}.tmp")

    def prepare(self) -> None:
        return None

    def stage(self) -> Tuning:
        result = self._measure()
        if self._partial is not None:
            self._partial.write_text(json.dumps(result.to_json(), indent=1) + "\n")
        return result

    def seal(self) -> None:
        return None

    def publish(self) -> None:
        if self._partial is not None and self._target is not None:
            try:
                self._partial.replace(self._target)
            finally:
                self.discard()

    def discard(self) -> None:
        if self._partial is not None:
            self._partial.unlink(missing_ok=True)


# A recommendation needs the privacy units the histograms count to stand out of their noise:
# SIGNAL_TO_NOISE times the std of the noise on that count.
SIGNAL_TO_NOISE = 10.0
VALUES_HIDDEN = "most of the value histogram below its noise level"


def _hidden_by_noise(
    *,
    eps: float,
    eps_units: float,
    h1: Sequence[float],
    h2: Sequence[float],
    values: Sequence[float] | None,
) -> tuple[list[str], float | None]:
    """What the noise hides of the histograms (all bins zeroed, fewer privacy units than
    SIGNAL_TO_NOISE noise stds, or, when the query needs clipping bounds, a value histogram
    whose tails cut more than half of its mass), and the tune epsilon that would show it
    (None when nothing is hidden). Post-processing of the noisy histograms only: the caller
    reports it instead of failing, since a failure after reading could not be refunded."""
    units = float(sum(h1))
    noise = math.sqrt(2 * len(h1)) / eps_units  # std of the noise on sum(h1): Laplace b = 1/eps
    hidden = []
    if not units >= SIGNAL_TO_NOISE * noise:
        hidden.append(f"about {max(units, 0.0):,.0f} privacy units against a noise of {noise:,.0f}")
    if not float(sum(h2)) > 0:
        hidden.append("every bin of rows per (unit, partition) pair below its noise level")
    if values is not None and not float(sum(values)) >= 0.5 * units:
        hidden.append(VALUES_HIDDEN)
    if not hidden:
        return [], None
    # Noise scales as 1/epsilon: the units' signal-to-noise says how much more is needed (1.5x:
    # the units counted are noisy too); a histogram zeroed by its noise level needs at least its
    # mass spread over its bins to clear that level. Never less than twice the epsilon spent.
    level = math.log(len(h2) / (2 * EMPTY_BIN_RISK)) / eps_units
    needed = max(
        2.0 * eps,
        1.5 * eps * SIGNAL_TO_NOISE * noise / max(units, noise),
        eps * level * len(h2) / max(units, 1.0) if float(sum(h2)) <= 0 else 0.0,
    )
    return hidden, needed


def refuse_to_replace(target: Path) -> None:
    """--tune-output may name a new file or an earlier tune result, nothing else: the
    result replaces the file, and another file there (the ledger itself) would be lost."""
    if not target.exists() and not target.is_symlink():
        return
    content = None
    if target.is_file() and not target.is_symlink():
        try:
            with target.open("rb") as handle:
                content = json.loads(handle.read(1 << 20))  # a tune result is a few kB
        except (OSError, ValueError):
            content = None
    if not (isinstance(content, dict) and content.keys() >= TUNE_RESULT_FIELDS):
        raise UsageError(
            f"--tune-output: {target} exists and is not a tune result; give a new file"
        )


TUNE_RESULT_FIELDS = frozenset({"query", "epsilon", "bin_edges", "recommendation"})


def _measure(spec, query, task, days, *, eps, partitions, progress) -> Tuning:
    progress(f"[tune] reading {len(days)} days for query {query.name}")
    unit = spec.privacy_unit
    # The raw value (no clipping: the quantiles choose the clipping bounds); the rows the run
    # bounds: filter applied, unlisted public keys dropped.
    raw = replace(task, clip=(-math.inf, math.inf))
    rows = validated_rows(spec, days, [raw])
    frame = task_rows(rows, raw, unit)
    keys = task.key_names or ["_all"]
    if not task.key_names:
        frame = frame.with_columns(pl.lit(0).alias("_all"))
    import pipeline_dp  # noqa: PLC0415 (1.3 s of start-up: tune only)
    from pipeline_dp.aggregate_params import MechanismType  # noqa: PLC0415

    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=eps, total_delta=0.0)
    specs = [
        accountant.request_budget(MechanismType.LAPLACE, name=n)
        for n in ("partitions_per_unit", "rows_per_pair", "values")
    ]
    accountant.compute_budgets()
    h1, h2 = contribution_histograms(frame, unit, keys)
    noisy_h1 = noisy(_mechanism("partitions_per_unit", specs[0]), h1, tails=True)
    noisy_h2 = noisy(_mechanism("rows_per_pair", specs[1]), h2, tails=True)
    values = noisy(_mechanism("values", specs[2]), value_histogram(frame, unit), tails=True)
    progress("[tune] DP histograms computed; scoring candidates")
    needs_values = query.needs_value_bounds
    hidden, needed = _hidden_by_noise(
        eps=eps, eps_units=specs[0].eps, h1=noisy_h1, h2=noisy_h2,
        values=values if needs_values else None,
    )  # fmt: skip
    values_hidden = VALUES_HIDDEN in hidden
    min_value = max_value = None
    if needs_values and not values_hidden:
        min_value, max_value = clipping_bounds(values)
    candidates: list[Candidate] = []
    best = None
    mean_limit = None
    if not [h for h in hidden if h != VALUES_HIDDEN]:
        # The mean's noise is judged on the value bounds the run will use: those recommended
        # here, else the job's own.
        clip = (min_value, max_value) if min_value is not None else None
        if "mean" in query.metrics and (clip or query.bounds.max_value is not None):
            low, high = clip or (query.bounds.min_value, query.bounds.max_value)
            mean_limit = MEAN_NOISE_SHARE * (float(high) - float(low))
        total = total_rows(noisy_h1, noisy_h2)
        for l0 in CANDIDATES if task.key_names else (1,):
            for linf in CANDIDATES:
                share = kept_share(noisy_h1, noisy_h2, l0, linf)
                bounds = {"max_partitions_contributed": l0, "max_contributions_per_partition": linf}
                count_std, centred_std = _candidate_noise(spec, query, bounds, clip)
                kept = total * share / partitions  # rows the typical partition keeps
                mean_std = None
                if mean_limit is not None:
                    mean_std = centred_std / kept if kept >= 1 else math.inf
                candidates.append(Candidate(
                    l0, linf, share, total * (1 - share) / partitions, count_std, mean_std,
                ))  # fmt: skip
        useful = [
            c for c in candidates
            if c.mean_noise_std is None or mean_limit is None or c.mean_noise_std <= mean_limit
        ]  # fmt: skip
        if useful:
            best = min(useful, key=lambda c: (c.error, c.l0 * c.linf))
        else:  # no candidate gives a useful mean at the job's epsilon: the least noisy mean
            best = min(candidates, key=lambda c: (c.mean_noise_std or 0.0, c.error))
    return Tuning(
        query=query.name, epsilon=eps, partitions_per_unit=noisy_h1, rows_per_pair=noisy_h2,
        values=values, partitions=partitions, candidates=candidates, best=best,
        min_value=min_value, max_value=max_value, hidden=tuple(hidden), needed_epsilon=needed,
        mean_limit=mean_limit, needs_values=needs_values,
    )  # fmt: skip


def _candidate_noise(
    spec: JobSpec, query: QuerySpec, bounds: dict, clip: tuple[float, float] | None
) -> tuple[float, float]:
    """Noise std of the count, and of the mean's centred sum (0 without a mean), with these
    bounds (and clipping bounds, when given) under the job's own budget split."""
    update = {**bounds, "max_contributions": None}
    if clip is not None:
        update |= {"min_value": clip[0], "max_value": clip[1]}
    tuned = query.model_copy(update={
        "bounds": query.bounds.model_copy(update=update),
        "metrics": ("count", *[m for m in query.metrics if m != "count"]),
    })  # fmt: skip
    # PLD's search takes ~0.3 s a plan and tune scores up to 256 candidates: RDP (zCDP) gives
    # the same ranking with a noise at most a few percent higher, in milliseconds.
    accounting = "zcdp" if spec.accounting == "pld" else spec.accounting
    job = spec.model_copy(update={"accounting": accounting, "queries": tuple(
        tuned if q.name == query.name else q for q in spec.queries)})  # fmt: skip
    plan = make_plan(job, require_bounds=False).query(query.name).plan
    centred = plan.mechanism("centred_sum").noise_stddev if plan.has("centred_sum") else 0.0
    return float(plan.metric_noise_stddev("count") or 0.0), float(centred or 0.0)


def render(result: Tuning, top: int = 12, *, recorded: bool = True) -> str:
    """The candidates table (best first) and a YAML snippet to paste into the job spec; what
    the noise hides, if anything, and the tune epsilon that would show it."""
    where = "recorded in the ledger" if recorded else "NOT recorded: --no-ledger"
    lines = [f"query {result.query}: tuned with epsilon={result.epsilon:g} ({where})"]
    if result.min_value is not None:
        lines.append(
            f"  values: {1 - 2 * TAIL:.0%} of the value histogram's mass above the noise level "
            f"lies in [{result.min_value:g}, {result.max_value:g}] (ten bins per decade; sparse "
            "tails fall below that level: raise --tune-epsilon to see them)"
        )
    if result.candidates:
        mean = result.mean_limit is not None
        lines.append(
            f"  {'L0':>4} {'Linf':>5} {'rows kept':>10} {'bias/partition':>15} "
            f"{'noise std':>10} {'error':>10}" + (f" {'mean noise':>11}" if mean else "")
        )
        limit = result.mean_limit if mean else None
        ranked = sorted(  # the bounds that give a useful mean first
            result.candidates,
            key=lambda c: (limit is not None and (c.mean_noise_std or 0.0) > limit, c.error),
        )[:top]
        if result.best is not None and result.best not in ranked:
            ranked.append(result.best)
        for c in ranked:
            mark = "  <- recommended" if c == result.best else ""
            mean_cell = (
                f" {c.mean_noise_std:>11.4g}" if mean and c.mean_noise_std is not None else ""
            )
            lines.append(
                f"  {c.l0:>4} {c.linf:>5} {c.kept_share:>9.1%} {c.bias:>15.4g} "
                f"{c.noise_std:>10.4g} {c.error:>10.4g}{mean_cell}{mark}"
            )
        if mean and result.best is not None:
            best_mean = result.best.mean_noise_std or 0.0
            if best_mean <= (result.mean_limit or 0.0):
                lines.append(
                    f"  (recommended: the smallest error among the bounds whose mean noise at the "
                    f"typical partition is at most {result.mean_limit:.4g}, "
                    f"{MEAN_NOISE_SHARE:.0%} of the value range)"
                )
            else:
                lines.append(
                    f"  (no bounds keep the mean's noise within {result.mean_limit:.4g} "
                    f"({MEAN_NOISE_SHARE:.0%} of the value range) at the job's epsilon: "
                    "recommended the least noisy mean; raise budget.epsilon, or expect many "
                    "means clamped to a bound)"
                )
    recommended = result.recommendation()
    if recommended:
        lines += [
            "",
            "bounds:  # paste into the job spec (from DP statistics; error of the count per "
            "partition)",
        ]
        if result.best is not None:
            lines.append("  # L0 x Linf (tune does not tune max_contributions; these replace it)")
        lines += [f"  {name}: {value:g}" for name, value in recommended.items()]
    if result.hidden:
        missing = ["contribution bounds"] if result.best is None else []
        if result.needs_values and result.min_value is None:
            missing.append("value bounds")
        lines += [
            "",
            f"the noise hides part of query {result.query}'s data at tune epsilon "
            f"{result.epsilon:g} ({'; '.join(result.hidden)}): no {' and no '.join(missing)} "
            f"recommended; rerun with --tune-epsilon {result.needed_epsilon:.2g} or more",
        ]
    return "\n".join(lines)
