"""The cost model: a tree ensemble predicting log(time / roofline floor), with uncertainty.

A row is a dict of named numeric features — the op's features, the candidate's variant
(one-hot) and config values, the kernel's resources and the device state — so rows from
packs, counter logs and live samples line up by name, and an absent column is 0. The
target is ``log(time_ms / floor_ms)``: how far from the roofline a candidate runs, which
carries across sizes far better than raw time. The spread of the ensemble's trees is the
uncertainty the policy explores with.

This module imports scikit-learn at the top; ``import adaptive`` never imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.utils.validation import check_is_fitted

from adaptive.policy.features import FEATURE_VERSION, Rows, store_rows  # noqa: F401 (re-export)
from adaptive.policy.features import row as features_row  # noqa: F401 (re-export)
from adaptive.observation import Observation

log = logging.getLogger(__name__)

MIN_SIGMA = 0.03      # log units: below this, two predictions are indistinguishable anyway

# the rows are built by the one feature builder (adaptive/policy/features.py)
candidate_row = features_row


def target(time_ms: float, floor_ms: float) -> float:
    """log(time / floor); with no floor known, log(time in ms)."""
    return math.log(time_ms / floor_ms) if floor_ms > 0 else math.log(time_ms)


def input_key(op: str, features: Mapping[str, float], dtype: str = "") -> tuple:
    """Group rows by input (for held-out evaluation): op, dtype and rounded features."""
    return (op, dtype, tuple(sorted((k, round(float(v), 4)) for k, v in features.items())))


@dataclasses.dataclass(frozen=True)
class TrainingSet:
    """Rows, targets and the input each row belongs to."""

    rows: list[dict]
    y: np.ndarray
    groups: list[tuple]
    labels: list[str]     # "op/variant[config]" per row: which candidate

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, index: Sequence[int]) -> TrainingSet:
        return TrainingSet([self.rows[i] for i in index], self.y[list(index)],
                           [self.groups[i] for i in index], [self.labels[i] for i in index])


def training_set(observations: Sequence[Observation],
                 resources: Callable[[Observation], Mapping] | None = None,
                 geometry: Callable[[Observation], Mapping] | None = None) -> TrainingSet:
    """Model rows from measurement rows (a pack, a counter log, a benchmark table).

    Rows with a non-finite or non-positive time are failures: they stay out of the fit
    (the policy never explores a candidate that failed).
    """
    rows, ys, groups, labels = [], [], [], []
    for obs in observations:
        if not (math.isfinite(obs.time_ms) and obs.time_ms > 0):
            continue
        res = resources(obs) if resources else {}
        geo = geometry(obs) if geometry else None
        rows.append(candidate_row(obs.features, obs.op, obs.variant, obs.config, res, obs.device,
                                  geo))
        ys.append(target(obs.time_ms, obs.floor_ms))
        groups.append(input_key(obs.op, obs.features, obs.dtype))
        cfg = ",".join(f"{k}={v}" for k, v in sorted(obs.config.items()))
        labels.append(f"{obs.op}/{obs.variant}[{cfg}]" if cfg else f"{obs.op}/{obs.variant}")
    return TrainingSet(rows, np.asarray(ys, dtype=np.float64), groups, labels)


class CostModel(RegressorMixin, BaseEstimator):
    """Regression of log(time / floor) with a per-prediction uncertainty.

    Follows scikit-learn's contract: ``__init__`` only stores, ``fit`` sets trailing-underscore
    attributes and returns ``self``, ``predict`` checks it is fitted. ``X`` is either a list
    of feature dicts (see :func:`candidate_row`; names are fixed at fit, unknown ones are
    ignored, absent ones are 0) or a 2-D numeric array.

    With ``groups`` (which input each row measures) the target is split in two: an input
    level (the input's best target, predicted from the input's ``op.*`` and ``dev.*``
    features by a small second ensemble) and each candidate's offset from it, how much
    slower than the input's best it runs (the main ensemble). Ranking the candidates of one
    input only needs the offsets, so the main ensemble spends its splits on what tells
    candidates apart instead of on how slow the input is (on the H200 corpus: spmm top-1
    within 5% 37% -> 47%, softmax 31% -> 42%). Offsets are capped at ``offset_cap``: the
    policy explores within a regret bound of the best, so a candidate 3x slower than the
    input's best is as useless as one 30x slower, and squared error on how much slower it
    is would spend the splits on the worst candidates instead of ordering the fast ones
    (on the H200 corpus, 10 folds by input over 8 fold seeds, best level and cap log 3
    against median level and no cap: spmm committed within 5% 80-90% -> 86-94%, gemm 96%
    -> 99%). An input with fewer than ``min_group_rows`` rows (a live key: only its
    explored candidates) takes the predicted level, not its own best of a few.

    Args:
        n_estimators: trees in the ensemble; their spread is the uncertainty.
        min_samples_leaf: smallest leaf (larger: smoother, more spread).
        random_state: seed of the ensemble.
        min_group_rows: rows an input needs for its own best to be its level.
        offset_cap: the most an offset from the input's level counts, in log units (None:
            no cap; only where an input level is fitted: with ``groups``, two inputs or
            more with ``min_group_rows``).

    Example:
        >>> m = CostModel().fit(ts.rows, ts.y)
        >>> mean, sigma = m.predict_dist(rows)     # log(time / floor), log units
    """

    def __init__(self, n_estimators: int = 48, min_samples_leaf: int = 2,
                 random_state: int = 0, min_group_rows: int = 8,
                 offset_cap: float | None = math.log(3.0)):
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state
        self.min_group_rows = min_group_rows
        self.offset_cap = offset_cap

    def _matrix(self, X, fitting: bool = False) -> np.ndarray:
        if isinstance(X, Rows):   # one input's rows, kept as their parts
            if not fitting and getattr(self, "feature_names_", None) is not None:
                return X.matrix(self._names_index())
            X = list(X)
        is_dicts = len(X) > 0 and isinstance(X[0], Mapping) if isinstance(X, (list, tuple)) \
            else False
        if not is_dicts:
            M = np.asarray(X, dtype=np.float64)
            if M.ndim != 2:
                raise ValueError(f"CostModel expects a 2-D array or a list of feature dicts, "
                                 f"got an array of shape {M.shape}")
            if fitting:
                self.feature_names_ = None
            elif getattr(self, "feature_names_", None) is not None:
                raise ValueError("this CostModel was fitted on feature dicts; pass dicts")
            return M
        if fitting:
            self.feature_names_ = sorted(set().union(*(r.keys() for r in X)))
            self._index = None
        elif self.feature_names_ is None:
            raise ValueError("this CostModel was fitted on an array; pass an array")
        index = self._names_index()
        M = np.zeros((len(X), len(index)))
        store_rows(M, X, index)   # per key order (1.6 -> 1.1 ms of a decide, name by name)
        return M

    def _names_index(self) -> dict[str, int]:
        """Each feature name's column (names are fixed at fit, which clears this)."""
        index = self.__dict__.get("_index")
        if index is None:
            index = self._index = {name: j for j, name in enumerate(self.feature_names_)}
        return index

    def fit(self, X, y, sample_weight=None, groups: Sequence | None = None) -> CostModel:
        """Fit on rows ``X`` and targets ``y`` (log(time / floor)); returns ``self``.
        ``groups``: the input of each row (see the class doc); None: one ensemble on ``y``."""
        M = self._matrix(X, fitting=True)
        y = np.asarray(y, dtype=np.float64)
        if M.shape[0] != y.shape[0]:
            raise ValueError(f"X has {M.shape[0]} rows but y has {y.shape[0]} values")
        if M.shape[0] < 2:
            raise ValueError(f"CostModel needs at least 2 rows to fit, got {M.shape[0]}")
        if not np.all(np.isfinite(y)):
            raise ValueError("y has NaN or Inf; drop failed measurements before fitting")
        if groups is not None and len(groups) != len(y):
            raise ValueError(f"groups has {len(groups)} entries but y has {len(y)} values")
        if self.offset_cap is not None and not self.offset_cap > 0:
            raise ValueError(f"offset_cap must be > 0 (log units) or None, got "
                             f"{self.offset_cap!r}")
        self.level_ = None
        # columns that never vary (a device state no row reported) cannot split; leaving
        # them out keeps the ensemble's random draws, and so its fit, what they would be
        # without them
        self.used_ = np.flatnonzero(np.ptp(M, axis=0) > 0)
        if len(self.used_) == 0:   # nothing varies: one column, the trees predict the mean
            self.used_ = np.arange(min(1, M.shape[1]))
        if groups is not None:
            y = y - self._fit_level(M, y, groups)
            if self.offset_cap is not None and self.level_ is not None:  # y are offsets
                y = np.minimum(y, self.offset_cap)
        self.ensemble_ = self._ensemble(self.n_estimators).fit(
            M[:, self.used_], y, sample_weight=sample_weight)
        self.n_features_in_ = M.shape[1]
        self.n_rows_ = M.shape[0]
        self.feature_version_ = FEATURE_VERSION
        return self

    def _ensemble(self, n: int) -> ExtraTreesRegressor:
        return ExtraTreesRegressor(n_estimators=n, min_samples_leaf=self.min_samples_leaf,
                                   bootstrap=True, random_state=self.random_state, n_jobs=1)

    def _input_columns(self) -> list[int]:
        names = self.feature_names_ or []
        used = set(self.used_.tolist())
        return [j for j, n in enumerate(names) if n.startswith(("op.", "dev.")) and j in used]

    def _fit_level(self, M: np.ndarray, y: np.ndarray, groups: Sequence) -> np.ndarray:
        """Fit the input-level ensemble; return each row's level (its input's best target
        when the input has enough rows, else the predicted level)."""
        cols = self._input_columns() if self.feature_names_ is not None else []
        index: dict = {}
        for i, g in enumerate(groups):
            index.setdefault(g, []).append(i)
        full = [ix for ix in index.values() if len(ix) >= self.min_group_rows]
        if not cols or len(full) < 2:
            return np.zeros_like(y)
        self.level_cols_ = cols
        level_X = np.stack([M[ix[0], cols] for ix in full])
        level_y = np.array([float(np.min(y[ix])) for ix in full])
        self.level_ = self._ensemble(max(8, self.n_estimators // 3)).fit(level_X, level_y)
        out = self.level_.predict(M[:, cols])
        for ix in full:
            out[ix] = float(np.min(y[ix]))
        return out

    def _level(self, M: np.ndarray) -> np.ndarray:
        level = getattr(self, "level_", None)
        if level is None:
            return np.zeros(len(M))
        cols = M[:, self.level_cols_]
        # the rows of a miss share one input: predict its level once
        if len(cols) > 1 and np.all(cols == cols[0]):
            return np.full(len(M), float(_forest_mean(level, cols[:1])[0]))
        return _forest_mean(level, cols)

    def predict(self, X) -> np.ndarray:
        """Predicted log(time / floor) per row."""
        check_is_fitted(self, "ensemble_")
        M = self._matrix(X)
        return _forest_mean(self.ensemble_, M[:, self.used_]) + self._level(M)

    def predict_dist(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sigma) per row in log units, from the trees' spread; one batched call."""
        check_is_fitted(self, "ensemble_")
        M = np.ascontiguousarray(self._matrix(X), dtype=np.float32)
        if M.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {M.shape[1]} features; this CostModel was fitted on "
                             f"{self.n_features_in_}")
        # the trees' own low-level predict: ~20x faster than each estimator's checked
        # predict, and a miss has a budget of a few ms (sklearn's trees split in float32)
        used = np.ascontiguousarray(M[:, self.used_])
        per_tree = np.stack([t.tree_.predict(used).reshape(len(M))
                             for t in self.ensemble_.estimators_])
        return (per_tree.mean(axis=0) + self._level(M),
                np.maximum(per_tree.std(axis=0), MIN_SIGMA))


def _forest_mean(forest, X: np.ndarray) -> np.ndarray:
    """``forest.predict(X)`` of a single-output tree ensemble, from the trees' low-level
    predict: the same sum in the same order, without the per-call input checks and the
    thread pool that made the level's predict take ~3 ms of a miss."""
    X = np.ascontiguousarray(X, dtype=np.float32)   # the trees split in float32
    total = np.zeros(len(X))
    for tree in forest.estimators_:
        total += tree.tree_.predict(X).reshape(len(X))
    return total / len(forest.estimators_)


class LiveModel:
    """A :class:`CostModel` refitted in a background thread as rows arrive.

    Readers call :meth:`predict_dist` and always see one whole model: a refit builds a new
    model off the calling thread and swaps it in with one assignment. Pack rows (``base``)
    are kept; live rows are kept up to ``max_rows``, newest last.

    Args:
        base: rows to start from (a pack's measurements); fitted at once if 2 or more.
        refit_every: refit after this many new rows.
        background: refit on a daemon thread (False: refit inline; tests, benchmarks).
    """

    def __init__(self, base: TrainingSet | None = None, refit_every: int = 24,
                 max_rows: int = 20000, background: bool = True,
                 make: Callable[[], CostModel] = CostModel):
        self.refit_every = refit_every
        self.max_rows = max_rows
        self.background = background
        self._make = make
        self._base_rows: list[dict] = []
        self._base_y: list[float] = []
        self._base_w: list[float] = []
        self._base_g: list = []
        self._rows: list[dict] = []
        self._y: list[float] = []
        self._g: list = []
        self._pending = 0
        self._counted = 0             # live rows that may start a refit (see add)
        self._dirty = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.model: CostModel | None = None
        self.generation = 0
        self.refit_s = 0.0            # seconds spent fitting, all refits (a serving
        self.last_error: str = ""     # process's background CPU, beside its requests)
        if base is not None:
            self.extend_base(base)

    @property
    def base_size(self) -> int:
        """Rows always kept (a pack's measurements)."""
        return len(self._base_rows)

    @property
    def first_fit_pending(self) -> bool:
        """Base rows given (a pack's), no model yet and the fit not failed: a learned
        policy's miss waits for that fit (``Learned``'s ``FIRST_FIT_WAIT_S``)."""
        return self.model is None and len(self._base_rows) >= 2 and not self.last_error

    def predict_dist(self, rows: list[dict]) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, sigma) from the current model, or None before the first fit."""
        model = self.model   # one read: a concurrent swap cannot mix two models
        return None if model is None else model.predict_dist(rows)

    def extend_base(self, ts: TrainingSet, weight: float = 1.0) -> None:
        """Add rows that are always kept (a pack's measurements; ``weight`` < 1: another
        device) and refit now (in the background when ``background``)."""
        with self._lock:
            self._base_rows += ts.rows
            self._base_y += [float(v) for v in ts.y]
            self._base_w += [float(weight)] * len(ts)
            self._base_g += list(ts.groups)
        self._start_refit(force=True)

    def add(self, rows: Sequence[dict], y: Sequence[float],
            groups: Sequence | None = None, refit: bool = True) -> None:
        """Queue rows (``groups``: each row's input, see :class:`CostModel`; None: each row
        its own); start a refit once ``refit_every`` have arrived since the last one.
        ``refit=False``: the rows are kept for the next refit but never start one (a
        committed key's steady samples: one candidate's time per input ranks nothing,
        and a refit while serving takes the interpreter from the serving threads: one
        refit of run S37's batch-1 generate() made its tokens 1.5x slower)."""
        with self._lock:
            self._rows += rows
            self._y += [float(v) for v in y]
            self._g += list(groups) if groups is not None else [
                ("live", id(r)) for r in rows]
            if len(self._rows) > self.max_rows:
                del self._rows[: -self.max_rows], self._y[: -self.max_rows]
                del self._g[: -self.max_rows]
            if not refit:
                return
            self._pending += len(rows)
            self._counted = min(self._counted + len(rows), len(self._rows))
        self._start_refit()

    def _start_refit(self, force: bool = False) -> None:
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            # refit after refit_every new rows, or a quarter of what the model has seen
            # when that is more (rows that never start a refit not counted)
            total = self._counted + len(self._base_rows)
            wanted = force or self._pending >= max(self.refit_every, total // 4)
            if running and wanted:
                self._dirty = True
            due = wanted and not running
            if due:
                self._pending = 0
                if self.background:
                    self._thread = threading.Thread(target=self._refit, daemon=True,
                                                    name="adaptive-model-refit")
                    self._thread.start()
        if due and not self.background:
            self._refit()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Wait for a running refit; True when none is running afterwards."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            return not thread.is_alive()
        return True

    def _refit(self) -> None:
        while True:
            with self._lock:
                self._dirty = False
                rows = self._base_rows + self._rows
                y = np.asarray(self._base_y + self._y, dtype=np.float64)
                w = np.asarray(self._base_w + [1.0] * len(self._rows))
                groups = self._base_g + self._g
            if len(rows) < 2:
                return
            t0 = time.perf_counter()
            try:
                fitted = self._make().fit(rows, y, sample_weight=w, groups=groups)
            except Exception as exc:  # noqa: BLE001 (a failed refit keeps the previous model)
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("the cost model's fit of %d rows failed (%s): %s", len(rows),
                            self.last_error, "the previous model stays" if self.model
                            is not None else "the policy decides without a model")
                return
            finally:
                self.refit_s += time.perf_counter() - t0
            self.model = fitted   # the atomic swap
            self.generation += 1
            with self._lock:
                if not self._dirty:   # rows that arrived during the fit get their own refit
                    return


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """Ranking quality on held-out inputs, beside a baseline that ignores the input."""

    keys: int
    spearman: float
    top1: float
    top3: float
    baseline_spearman: float
    baseline_top1: float
    baseline_top3: float

    def __str__(self) -> str:
        return (f"model accuracy on {self.keys} held-out inputs: spearman {self.spearman:.2f} "
                f"(baseline {self.baseline_spearman:.2f}), top-1 {self.top1:.0%} "
                f"(baseline {self.baseline_top1:.0%}), top-3 {self.top3:.0%} "
                f"(baseline {self.baseline_top3:.0%})")


def ranking_scores(pred: np.ndarray, ts: TrainingSet) -> tuple[float, float, float, int]:
    """Mean per-input Spearman correlation, top-1 and top-3 hit rates of ``pred``."""
    by_key: dict[tuple, list[int]] = {}
    for i, g in enumerate(ts.groups):
        by_key.setdefault(g, []).append(i)
    rhos, top1, top3, n = [], 0, 0, 0
    for index in by_key.values():
        if len(index) < 2:
            continue
        p, t = pred[index], ts.y[index]
        n += 1
        best = int(np.argmin(t))
        order = np.argsort(p, kind="stable")
        top1 += int(order[0] == best or t[order[0]] <= t[best])
        top3 += int(best in order[:3])
        if np.ptp(p) > 0 and np.ptp(t) > 0:
            rhos.append(float(np.corrcoef(rankdata(p), rankdata(t))[0, 1]))
        else:
            rhos.append(0.0)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    return float(np.mean(rhos)), top1 / n, top3 / n, n


def held_out_accuracy(ts: TrainingSet, test_fraction: float = 0.3, seed: int = 0,
                      make: Callable[[], CostModel] = CostModel,
                      test: TrainingSet | None = None) -> Accuracy:
    """Fit on some inputs, rank the candidates of the others; compare with a baseline.

    The baseline predicts each candidate's mean target over the training inputs (the
    "best fixed candidate" order), so it knows candidates but not inputs.
    """
    if test is None:
        keys = sorted(set(ts.groups))
        rng = np.random.default_rng(seed)
        held = set(map(tuple, [keys[i] for i in rng.permutation(len(keys))[
            : max(1, int(round(test_fraction * len(keys))))]]))
        train = ts.subset([i for i, g in enumerate(ts.groups) if g not in held])
        test = ts.subset([i for i, g in enumerate(ts.groups) if g in held])
    else:
        train = ts
    if len(train) < 2 or len(test) < 2:
        raise ValueError(f"held-out accuracy needs rows on both sides, got {len(train)} train "
                         f"and {len(test)} test rows")
    model = make().fit(train.rows, train.y, groups=train.groups)
    spearman, top1, top3, n = ranking_scores(model.predict(test.rows), test)
    means: dict[str, list[float]] = {}
    for label, y in zip(train.labels, train.y):
        means.setdefault(label, []).append(y)
    fallback = float(train.y.mean())
    base = np.array([float(np.mean(means[lb])) if lb in means else fallback
                     for lb in test.labels])
    b_spearman, b_top1, b_top3, _ = ranking_scores(base, test)
    return Accuracy(n, spearman, top1, top3, b_spearman, b_top1, b_top3)
