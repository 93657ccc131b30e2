"""Blending finished jobs' predictions, and the submission writer. Pure functions over arrays keyed by row id.

Which rows each figure is scored on (one rule for every method):

- a job's score (``Blend.job_scores``, the job's own CV): on the out-of-fold rows that job predicts;
- a blend's score (``Blend.oof_score``): on every train row that at least one job predicts out of fold (the union,
  never the rows every job shares, so a one-fold job or a job cut to one fold does not shrink it). On each row the
  blend is the weighted mean of the jobs that predict it, the weights renormalised over them (a job without the row
  contributes nothing there); a row that no job of positive weight predicts takes the plain mean of the jobs that do
  (the limit of a vanishing equal weight on every job). So every candidate — a blend, or one job alone — predicts
  the same rows, and hill climbing, the weighted blend and the check below compare like with like.

Every method is fitted on those out-of-fold rows only, and the chosen blend is never worse there than any single job
alone on the same rows: when it loses, that job alone is the answer, with a note. For a job that predicts every row,
"alone on the same rows" is its own CV, the figure printed beside it; a job that predicts fewer rows is named in a note
with its row count and the blend's score on its rows (``Blend.on_job_rows``), so the two figures never silently
disagree.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from scheduler.core.scoring import REGRESSION, get as get_metric

METHODS = ("mean", "weighted", "rank", "hill_climb", "stack")
RANK_ONLY = frozenset({"auc"})  # metrics that read only the order of the predictions


@dataclass
class Predictions:
    """One job's finished work: out-of-fold rows (ids, probabilities) and test rows (ids, mean over folds)."""

    job: str
    oof_ids: np.ndarray
    oof_pred: np.ndarray  # (n, k)
    test_ids: np.ndarray
    test_pred: np.ndarray  # (m, k)
    classes: list


@dataclass
class Blend:
    method: str
    weights: dict[str, float]
    oof_score: float | None
    job_scores: dict[str, float]
    test_pred: np.ndarray  # rows in the order of ``test_ids``
    test_ids: np.ndarray
    classes: list
    notes: list[str] = field(default_factory=list)
    rows: int = 0  # the out-of-fold rows ``oof_score`` is scored on: every row some job predicts
    job_rows: dict[str, int] = field(default_factory=dict)  # each job's own out-of-fold rows (its score's rows)
    on_job_rows: dict[str, float] = field(default_factory=dict)  # for a job of fewer rows: the blend's score on them


def _aligned(preds: list[Predictions], truth: pd.Series) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """The OOF rows some job predicted (ids, what the metric compares with, per-job arrays in that row order, NaN on
    the rows a job did not predict)."""
    known = set(truth.index)
    ids = np.array(sorted(set().union(*(set(p.oof_ids.tolist()) for p in preds)) & known))
    arrays = []
    for p in preds:
        frame = pd.DataFrame(np.asarray(p.oof_pred, dtype=np.float64), index=p.oof_ids)
        arrays.append(frame[~frame.index.duplicated()].reindex(ids).to_numpy(dtype=np.float64))
    return ids, truth.loc[ids].to_numpy(), arrays


def _test_matrix(p: Predictions, test_ids: np.ndarray) -> np.ndarray:
    """``p``'s test predictions in the order of ``test_ids``; rows it lacks are NaN."""
    frame = pd.DataFrame(p.test_pred, index=p.test_ids)
    return frame.reindex(test_ids).to_numpy(dtype=np.float64)


def _combine(arrays: list[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Weighted mean, renormalised on each value over the jobs that predict it (a job's missing (NaN) value counts
    for nothing, the row is not lost); a value no job of positive weight predicts is the plain mean of the jobs that
    do; NaN only where no job does."""
    stack = np.stack(arrays)  # (jobs, rows, k)
    have = ~np.isnan(stack)
    values = np.where(have, stack, 0.0)
    w = np.where(have, np.asarray(weights, dtype=np.float64)[:, None, None], 0.0)
    total = w.sum(axis=0)
    count = have.sum(axis=0)
    fill = values.sum(axis=0) / np.maximum(count, 1)
    out = np.where(total > 0, (values * w).sum(axis=0) / np.where(total > 0, total, 1), fill)
    out[count == 0] = np.nan
    return out


def _ranks(a: np.ndarray) -> np.ndarray:
    """Each column's values as ranks scaled to [0, 1] (rank averaging, for metrics that only rank)."""
    out = np.empty_like(a, dtype=np.float64)
    for c in range(a.shape[1]):
        col = pd.Series(a[:, c])
        out[:, c] = col.rank(method="average").to_numpy() / max(1, int(col.notna().sum()))
    return out


def _hill_climb(arrays: list[np.ndarray], y: np.ndarray, metric, rounds: int = 50) -> np.ndarray:
    """Caruana's ensemble selection with replacement, starting from the best job alone; every trial is the blend
    ``_combine`` makes, scored on all the rows (``arrays`` hold NaN where a job has no prediction)."""
    have = [~np.isnan(a) for a in arrays]
    values = [np.where(h, a, 0.0) for a, h in zip(arrays, have)]
    count = np.sum(have, axis=0)
    fill = np.sum(values, axis=0) / np.maximum(count, 1)

    def mix(num, den):
        return np.where(den > 0, num / np.where(den > 0, den, 1), fill)

    scores = [metric.fn(y, mix(v, h.astype(np.float64))) for v, h in zip(values, have)]
    best = int(np.argmax(scores) if metric.greater_is_better else np.argmin(scores))
    counts = np.zeros(len(arrays))
    counts[best] = 1
    num, den, current_score = values[best].copy(), have[best].astype(np.float64), scores[best]
    for _ in range(rounds):
        trials = [(metric.fn(y, mix(num + v, den + h)), j) for j, (v, h) in enumerate(zip(values, have))]
        score, j = max(trials) if metric.greater_is_better else min(trials)
        if not metric.better(score, current_score):
            break
        counts[j] += 1
        num, den, current_score = num + values[j], den + have[j], score
    return counts / counts.sum()


def _filled(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Each job's array with the values it lacks taken from the plain mean of the jobs that have them (a stacker
    needs every input on every row)."""
    fill = _combine(arrays, np.zeros(len(arrays)))
    return [np.where(np.isnan(a), fill, a) for a in arrays]


def _shares(coef: np.ndarray, jobs: int) -> np.ndarray | None:
    """Each job's share of a stacker's coefficients (their absolute values, over the job's columns): what the stack
    reports as its weights (a stacker has no weight per job; a plain mean's 1/3 each was reported before, whatever
    it leaned on). None where every coefficient is 0."""
    mass = np.abs(np.atleast_2d(coef)).reshape(np.atleast_2d(coef).shape[0], jobs, -1).sum(axis=(0, 2))
    return mass / mass.sum() if mass.sum() > 0 else None


# One fit of the class stacker costs about rows × members × classes² (its inputs are every job's probability of every
# class, its outputs a logit per class). On 30,000 rows × 40 classes × 4 jobs (benchmarks/blend_time.py) a fit took
# 13 s on this 2-core machine and the stack (5 folds and the final fit) 85 s, where the reserve of a two-minute budget
# is 18 s; a fit is therefore given at most STACK_CELLS of that product, its rows drawn class by class (each class in
# its share, every class the rows hold at least once where the cap allows): all of them up to ~12,500 rows of 10
# classes and 4 jobs, 3,125 of 40 classes (there the stack took 7 s, 12 s predicted; it scored 0.588 where every row
# scored 0.636 in 43 s, and 7,812 rows 0.616 in 12 s: the time the reserve of a short budget can hold decides).
STACK_CELLS = 2.0e7
STACK_MIN_ROWS = 1000  # never fewer rows than this per fit (or all of them)


def stack_rows(rows: int, members: int, classes: int) -> int:
    """The rows one fit of the class stacker is given (``STACK_CELLS``): all ``rows``, or fewer for many classes."""
    per_row = max(1, members * classes * classes)
    return min(rows, max(STACK_MIN_ROWS, int(STACK_CELLS // per_row)))


def _drawn(y: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` positions of ``y``, sorted, each class in its share: rows are taken in order of their place within their
    class (shuffled) over the class's size, so every class comes once before any comes twice. All of them where
    ``n`` reaches ``len(y)``."""
    if n >= len(y):
        return np.arange(len(y))
    order = rng.permutation(len(y))
    labels = y[order]
    by_class = np.argsort(labels, kind="stable")
    _, starts, counts = np.unique(labels[by_class], return_index=True, return_counts=True)
    place = np.empty(len(y), dtype=np.float64)
    for start, count in zip(starts, counts):
        members = by_class[start:start + count]
        place[members] = np.arange(count) / count
    return np.sort(order[np.argsort(place, kind="stable")[:n]])


def _stack(arrays: list[np.ndarray], y: np.ndarray, tests: list[np.ndarray], regression: bool, seed: int = 0):
    """A second model on the jobs' OOF predictions, its own OOF from a 5-fold CV: a regularised logistic regression
    on the probabilities, or for numbers a linear regression with non-negative weights. Returns its out-of-fold and
    test predictions, each job's share of its coefficients (``_shares``) and a note (or None); Nones where it cannot
    be fitted. Each fit of the class stacker sees at most ``stack_rows`` rows (the note says so where it bites); every
    row still gets its out-of-fold prediction."""
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.model_selection import KFold, StratifiedKFold, cross_val_predict
    from threadpoolctl import threadpool_limits

    if regression:
        x, xt = np.hstack(arrays), np.hstack([np.nan_to_num(t, nan=float(np.nanmean(t))) for t in tests])
        if len(y) < 10:
            return None, None, None, None
        model = LinearRegression(positive=True)
        with threadpool_limits(1):
            oof = cross_val_predict(model, x, y, cv=KFold(5, shuffle=True, random_state=seed))
            test = model.fit(x, y).predict(xt).reshape(-1, 1)
        return oof.reshape(-1, 1), test, _shares(model.coef_, len(arrays)), None
    x, xt = np.hstack(arrays), np.hstack([np.nan_to_num(t, nan=1.0 / t.shape[1]) for t in tests])
    labels = y.astype(int)
    # the classes the rows hold: a rare class absent from the out-of-fold rows (3 rows in 25,000, two folds run) is no
    # reason to give up the stacker, nor one of 1 row (a fold trained without it predicts it 0, as sklearn fills it)
    counts = np.bincount(labels) if len(y) else np.zeros(0, int)
    folds = min(5, int(counts.max())) if len(y) >= 10 and (counts > 0).sum() >= 2 else 0
    if folds < 2:
        return None, None, None, None
    k = arrays[0].shape[1]
    n = stack_rows(len(y), len(arrays), k)
    rng = np.random.default_rng(seed)

    def fitted(rows: np.ndarray):
        """The stacker fitted on ``rows`` (positions), at most ``n`` of them drawn class by class."""
        rows = rows[_drawn(labels[rows], n, rng)]
        return LogisticRegression(C=1.0, max_iter=2000).fit(x[rows], labels[rows])

    full_oof = np.zeros((len(x), k))
    # one thread: the solver's threads, on a box whose cores are busy (jobs winding down, another run), spun 15x slower
    # than one (16,000 rows x 40 inputs x 10 classes: 12 s a fit on 2 busy cores, 0.8 s on one; blend_time.py)
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.filterwarnings("ignore", message="The least populated class")  # the rare class, said above
        for train, val in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, labels):
            m = fitted(train)
            full_oof[np.ix_(val, m.classes_.astype(int))] = m.predict_proba(x[val])
        model = fitted(np.arange(len(x)))
    proba = np.zeros((len(xt), k))
    proba[:, model.classes_.astype(int)] = model.predict_proba(xt)
    note = None if n >= len(y) else (
        f"the stacker was fitted on {n:,} of the {len(y):,} out-of-fold rows at a time, each class in its share "
        f"({k} classes x {len(arrays)} jobs: its time grows with rows x jobs x classes squared); every row has its "
        "out-of-fold prediction")
    return full_oof, proba, _shares(model.coef_, len(arrays)), note


# The blend's time (``blend_seconds``), per method, fitted to benchmarks/blend_time.py on this 2-core machine with its
# cores busy (30,000 x 40 x 4: hill climb 2.1 s, stack 7-10 s; 20,000 x 10 x 4: 0.2 s, 2.1 s; 50,000 x 2 x 4: 1.0 s,
# 0.6 s), rounded up: the reserve must hold it, so it errs long.
BLEND_BASE_S = 0.5  # reading and aligning the jobs' predictions, the scores of each job alone
BLEND_CELL_S = 2e-7  # per row x class x job: the weighted means, each job alone on the same rows
HILL_CELL_S = 5e-7  # the hill climb's trials (up to 50 rounds, most stop in a few)
HILL_ROW_S = 3e-6  # per row x job: a metric that sorts (auc)
STACK_CELL_S = 1e-7  # per fit row x job x class²: one logistic fit (``stack_rows``); six fits (5 folds, the final one)
STACK_FITS = 6


def blend_seconds(method: str, rows: int, classes: int, members: int) -> float:
    """The blend's predicted seconds on ``rows`` out-of-fold rows of ``classes`` prediction columns from ``members``
    jobs: what the budget's reserve must hold after the training window (``DryRun.end_s``). The time model's
    figure for the end of a run, as the tasks' are for its training."""
    rows, classes, members = max(0, int(rows)), max(1, int(classes)), max(1, int(members))
    cells = rows * classes * members
    s = BLEND_BASE_S + BLEND_CELL_S * cells
    if members < 2:
        return s
    if method == "hill_climb":
        s += HILL_CELL_S * cells + HILL_ROW_S * rows * members
    elif method == "stack":
        fit_rows = stack_rows(rows, members, classes) if classes > 1 else rows
        s += STACK_FITS * STACK_CELL_S * fit_rows * members * classes * classes
    return s


def align_columns(preds: list[Predictions], columns: list) -> tuple[list[Predictions], list[str]]:
    """Each job's prediction columns put in ``columns``' order (matched by name, as ``"3"`` and ``3`` are one
    class), so that every job is scored on the values the metric reads; a job whose columns do not match is left out
    with a note."""
    want = [str(c) for c in columns]
    kept, notes = [], []
    for p in preds:
        have = {str(c): i for i, c in enumerate(p.classes)}
        if set(have) != set(want) or len(have) != p.oof_pred.shape[1]:
            notes.append(f"{p.job} predicted the columns {[str(c) for c in p.classes][:8]}, not the competition's "
                         f"{want[:8]}: left out of the blend")
            continue
        order = [have[c] for c in want]
        kept.append(Predictions(p.job, p.oof_ids, p.oof_pred[:, order], p.test_ids, p.test_pred[:, order],
                                list(columns)))
    return kept, notes


def blend(preds: list[Predictions], truth: pd.Series, test_ids: np.ndarray, metric_name: str,
          method: str = "hill_climb") -> Blend:
    """Blend ``preds`` by ``method`` on OOF rows; ``truth`` maps each train id to what the metric compares with:
    its class index, its value (regression), or its row of several targets (a DataFrame). Each job is scored on its
    own OOF rows, the blend on every OOF row some job predicts (the module's docstring has the rule)."""
    if method not in METHODS:
        raise ValueError(f"unknown ensemble method {method!r}; allowed: {', '.join(METHODS)}")
    if not preds:
        raise ValueError("nothing to blend: no job finished a fold")
    metric = get_metric(metric_name)
    regression = metric_name in REGRESSION
    ids, y, arrays = _aligned(preds, truth)
    tests = [_test_matrix(p, test_ids) for p in preds]
    names = [p.job for p in preds]
    covers = [~np.isnan(a).any(axis=1) for a in arrays]
    job_rows = {n: int(c.sum()) for n, c in zip(names, covers)}
    job_scores = {n: float(metric.fn(y[c], a[c])) if c.any() else float("nan")
                  for n, a, c in zip(names, arrays, covers)}
    notes: list[str] = []
    if not len(ids):
        notes.append("no job predicted an out-of-fold row of train.csv: their test predictions are averaged with "
                     "equal weights, unscored")
        w = np.ones(len(preds)) / len(preds)
        return Blend(method, dict(zip(names, w.tolist())), None, {}, _combine(tests, w), test_ids, preds[0].classes,
                     notes, 0, job_rows)
    if len(preds) == 1:
        return Blend(method, {names[0]: 1.0}, job_scores[names[0]], job_scores, tests[0], test_ids, preds[0].classes,
                     notes, len(ids), job_rows)

    scores = np.array([job_scores[n] for n in names])
    oof_blend = test_blend = None
    if method == "mean":
        w = np.ones(len(preds)) / len(preds)
    elif method == "weighted":
        w = scores if metric.greater_is_better else 1.0 / np.maximum(scores, 1e-12)
        w = np.maximum(np.nan_to_num(w, nan=0.0), 1e-12)
        w = w / w.sum()
    elif method == "rank":
        w = np.ones(len(preds)) / len(preds)
        if metric_name in RANK_ONLY:
            oof_blend = _combine([_ranks(a) for a in arrays], w)
            test_blend = _combine([_ranks(t) for t in tests], w)
        else:
            notes.append(f"rank averaging suits metrics that only rank (auc); {metric_name} scores the values "
                         f"themselves: a plain mean instead")
    elif method == "hill_climb":
        w = _hill_climb(arrays, y, metric)
    else:  # stack
        w = np.ones(len(preds)) / len(preds)
        if y.ndim == 2:
            notes.append("no stacker for several targets: a plain mean instead")
        else:
            oof_blend, test_blend, shares, note = _stack(_filled(arrays), y, _filled(tests), regression)
            if note:
                notes.append(note)
            if oof_blend is None:
                notes.append("too few rows to cross-validate a stacker: a plain mean instead")
            elif shares is not None:
                w = shares  # reported: what the stacker leaned on (its predictions are its own)
    if oof_blend is None:
        oof_blend, test_blend = _combine(arrays, w), _combine(tests, w)
    score = float(metric.fn(y, oof_blend))

    # each job alone on the same rows (where it has no prediction, the others' mean stands in): for a job that
    # predicts every row, exactly its own CV
    alone = [np.eye(len(preds))[i] for i in range(len(preds))]
    alone_scores = [job_scores[n] if job_rows[n] == len(ids) else float(metric.fn(y, _combine(arrays, a)))
                    for n, a in zip(names, alone)]
    b = int(np.nanargmax(alone_scores) if metric.greater_is_better else np.nanargmin(alone_scores))
    best = names[b]
    if metric.better(alone_scores[b], score):
        stand_in = "" if job_rows[best] == len(ids) else \
            f" (on the {len(ids) - job_rows[best]:,} rows it lacks, the other jobs' mean)"
        notes.append(f"the {method} blend ({score:.5f}) is worse than {best} alone{stand_in} ({alone_scores[b]:.5f}) "
                     f"on the {len(ids):,} out-of-fold rows: {best} alone is used")
        w = alone[b]
        oof_blend, test_blend, score = _combine(arrays, w), _combine(tests, w), alone_scores[b]
    on_job_rows = {n: float(metric.fn(y[c], oof_blend[c])) for n, c in zip(names, covers)
                   if 0 < job_rows[n] < len(ids)}
    if on_job_rows:
        fewer = "; ".join(f"{n} predicts {job_rows[n]:,} of them, its CV {job_scores[n]:.4f} is on those rows, where "
                          f"the blend scores {on_job_rows[n]:.4f}" for n in on_job_rows)
        notes.append(f"the blend is scored on all {len(ids):,} out-of-fold rows some job predicts; {fewer}")
    return Blend(method, dict(zip(names, np.round(w, 6).tolist())), score, job_scores, test_blend, test_ids,
                 preds[0].classes, notes, len(ids), job_rows, on_job_rows)


def class_prior(labels: pd.Series, classes: list, n_rows: int) -> np.ndarray:
    """Class frequencies as every row's prediction: the submission of last resort."""
    freq = labels.value_counts(normalize=True).reindex(classes).fillna(0).to_numpy()
    return np.tile(freq, (n_rows, 1))


def submission_frame(sample: pd.DataFrame, test_ids: np.ndarray, test_pred: np.ndarray, classes: list,
                     form=None) -> pd.DataFrame:
    """The submission in ``sample``'s columns and row order, written as ``form`` says (``jobs.forms.Form``: its
    ``kind``, ``positive`` and ``hard``); without a form, one label column, a number, or a column per class."""
    id_col = sample.columns[0]
    pred = pd.DataFrame(test_pred, index=test_ids).reindex(sample[id_col].to_numpy())
    if pred.isna().any().any():
        prior = np.nanmean(test_pred, axis=0) if len(test_pred) else np.full(len(classes), 1.0 / len(classes))
        pred = pred.fillna(pd.Series(np.nan_to_num(prior), index=pred.columns))
    values = pred.to_numpy()
    out = pd.DataFrame({id_col: sample[id_col].to_numpy()})
    value_cols = list(sample.columns[1:])
    kind = form.kind if form is not None else (
        "class_columns" if len(value_cols) > 1 else ("label" if len(classes) > 1 else "value"))
    by_name = {str(c): i for i, c in enumerate(classes)}
    if kind == "label":
        col = value_cols[0]
        # the labels as train.csv spells them (read as text: ``01`` stays ``01``, 25 digits stay exact), never cast
        # to the sample's dtype, which would write ``1`` for ``01`` or overflow on a long integer
        out[col] = np.asarray(classes, dtype=object)[values.argmax(axis=1)]
    elif kind == "probability":
        out[value_cols[0]] = np.clip(values[:, by_name[str(form.positive)]], 0.0, 1.0)
    elif kind == "value":
        out[value_cols[0]] = values[:, 0]
    else:  # class_columns, targets
        missing = [c for c in value_cols if str(c) not in by_name]
        if missing:
            raise ValueError(f"sample_submission.csv has columns {missing} that the jobs did not predict")
        for c in value_cols:
            column = values[:, by_name[str(c)]]
            out[c] = np.rint(np.clip(column, 0, 1)).astype(np.int64) if getattr(form, "hard", False) else column
    return out
