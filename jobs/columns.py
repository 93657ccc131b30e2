"""Each feature column of a table, typed once at the door: what a tree model trains on, and what is left out and why.

A Kaggle table is rarely all numbers: a cut, a colour, a seat-belt use, an airport, a date. Every column of train.csv
that test.csv also holds (the id and the targets aside) becomes one of:

- **number**: read as numbers (missing cells stay missing);
- **category**: text with few distinct values, or booleans; a pandas ``category`` whose categories are the values of
  train and test together (both frames share its codes), a test value that train never holds made missing;
- **date**: text that reads as dates or times; it becomes numbers a tree can split on (year, month, day, weekday,
  hour where the column holds times, and days since 1970 for order);
- **left out**: constant (one value or none), id-like (text whose every value differs), free text (many distinct
  values of several words: a model of words is not built), text in test.csv where train.csv holds numbers, or a
  column test.csv does not hold.

Nothing is dropped without a reason: :func:`classify` returns every column with what it became, which the dry run,
``--json`` and ``data`` show. :func:`features` builds a frame of the model's columns from these decisions for train or
test, so both are built the same way. LightGBM takes pandas categories as categorical features by itself; XGBoost does
with ``enable_categorical=True`` and its ``hist`` trees. Image kinds read the images, not these columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

NUMBER, CATEGORY, DATE, LEFT_OUT = "number", "category", "date", "left out"
ID_LIKE_RATIO = 0.99  # text whose distinct values are this share of its rows is an identifier, not a category
FREE_TEXT_RATIO = 0.5  # text this varied ...
FREE_TEXT_WORDS = 3.0  # ... whose values average this many words is free text
DATE_SHARE = 0.95  # text is a date when this share of its values reads as one
DATE_SAMPLE = 500  # values tried as dates before the whole column is
DATE_PARTS = ("year", "month", "day", "weekday")
NOT_IN_TEST = "not in test.csv"


@dataclass(frozen=True)
class Column:
    """One column of the table and what it became: ``features`` names the model's columns made of it (none when it
    is left out), ``why`` says so in a few words."""

    name: str
    became: str  # NUMBER, CATEGORY, DATE or LEFT_OUT
    why: str
    features: tuple[str, ...] = ()
    categories: tuple = ()  # a category's values (train's and test's), in code order
    times: bool = False  # a date column that holds times of day: it gives an hour too

    def to_json(self) -> dict:
        return {"name": self.name, "became": self.became, "why": self.why, "features": list(self.features),
                **({"categories": len(self.categories)} if self.became == CATEGORY else {})}


def classify(train: pd.DataFrame, test: pd.DataFrame, skip) -> list[Column]:
    """Every column of ``train`` but the ``skip`` ones (the id, the targets), typed; one test.csv lacks is left out
    (a model of it could predict no test row)."""
    skip = set(skip)
    return [_classify(str(c), train[c], test[c]) if c in test.columns else
            Column(str(c), LEFT_OUT, NOT_IN_TEST)
            for c in train.columns if c not in skip and isinstance(train[c], pd.Series)]


def _classify(name: str, col: pd.Series, test_col: pd.Series) -> Column:
    values = col.dropna()
    if values.nunique() <= 1:
        return Column(name, LEFT_OUT, "constant: " + ("every cell empty" if values.empty else
                                                       f"one value ({_shown(values.iloc[0])})"))
    if pd.api.types.is_bool_dtype(col):
        return _category(name, col, test_col, "true or false")
    if pd.api.types.is_numeric_dtype(col):
        if not pd.api.types.is_numeric_dtype(test_col) and not test_col.isna().all():
            return Column(name, LEFT_OUT, f"numbers in train.csv but text in test.csv (e.g. "
                                          f"{_shown(_not_number(test_col))})")
        return Column(name, NUMBER, "numbers" + (f", {col.isna().mean():.0%} missing" if col.isna().any() else ""),
                      (name,))
    text = values.astype(str)
    distinct = text.nunique()
    if (when := _dates(text)) is not None:
        times = bool((when.dropna().dt.floor("D") != when.dropna()).any())
        parts = DATE_PARTS + (("hour",) if times else ()) + ("days",)
        return Column(name, DATE, "dates → " + ", ".join(parts), tuple(f"{name}.{p}" for p in parts), times=times)
    words = text.str.split().str.len().mean()
    if distinct >= FREE_TEXT_RATIO * len(text) and words >= FREE_TEXT_WORDS:
        return Column(name, LEFT_OUT, f"free text: {distinct:,} distinct values of {words:.1f} words on average")
    if len(text) >= 20 and distinct >= ID_LIKE_RATIO * len(text):
        return Column(name, LEFT_OUT, f"id-like: {distinct:,} distinct values in {len(text):,} rows")
    return _category(name, col, test_col, f"text, {distinct:,} values")


def _category(name: str, col: pd.Series, test_col: pd.Series, why: str) -> Column:
    seen = pd.unique(col.dropna().astype(str))
    known = set(seen)
    unseen = [v for v in pd.unique(test_col.dropna().astype(str)) if v not in known]
    if unseen:
        why += f"; {len(unseen):,} value{'s' if len(unseen) != 1 else ''} only in test.csv read as missing"
    return Column(name, CATEGORY, why, (name,), categories=tuple(sorted(seen)) + tuple(sorted(unseen)))


def _dates(text: pd.Series) -> pd.Series | None:
    """The column read as dates when it reads as dates: most of a sample parses, and it is not numbers (a year alone
    is a number), then the whole column does; else None."""
    sample = text.iloc[:DATE_SAMPLE]
    if pd.to_numeric(sample, errors="coerce").notna().mean() > 0.5 or sample.str.len().max() > 40:
        return None
    if not sample.str.contains(r"\d", regex=True).all():
        return None
    if _as_dates(sample).notna().mean() < DATE_SHARE:
        return None
    when = _as_dates(text)
    return when if when.notna().mean() >= DATE_SHARE else None


def _as_dates(col: pd.Series) -> pd.Series:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "could not infer format": each value is parsed on its own, as meant
        # with a zone (nycflights' "2013-01-01 05:00:00-05:00"), read in UTC: one clock for every value
        when = pd.to_datetime(col.astype("string"), errors="coerce", format="mixed", utc=True)
    return when.dt.tz_localize(None)


def features(frame: pd.DataFrame, columns: list[Column], seen_in_train: bool = True) -> pd.DataFrame:
    """The model's columns of ``frame`` (train.csv's or test.csv's rows): numbers as float, categories as pandas
    categories with the column's categories (so train and test share codes), dates as their parts."""
    out: dict[str, pd.Series] = {}
    for c in columns:
        if c.became == NUMBER:
            out[c.name] = pd.to_numeric(frame[c.name], errors="coerce").astype(np.float32)
        elif c.became == CATEGORY:
            cats = pd.Categorical(frame[c.name].astype("string").astype(object).where(frame[c.name].notna()),
                                  categories=list(c.categories))
            out[c.name] = pd.Series(cats, index=frame.index)
        elif c.became == DATE:
            out.update(_date_parts(c, frame[c.name]))
    return pd.DataFrame(out, index=frame.index)


def _date_parts(c: Column, col: pd.Series) -> dict[str, pd.Series]:
    when = _as_dates(col)
    parts = {"year": when.dt.year, "month": when.dt.month, "day": when.dt.day, "weekday": when.dt.day_of_week,
             "hour": when.dt.hour, "days": (when - pd.Timestamp("1970-01-01")).dt.total_seconds() / 86400.0}
    return {f: parts[f.rsplit(".", 1)[1]].astype(np.float64) for f in c.features}


def summary(columns: list[Column]) -> str:
    """One line: how many columns became what."""
    plural = {NUMBER: "numbers", CATEGORY: "categories", DATE: "dates", LEFT_OUT: "left out"}
    counts = {k: sum(1 for c in columns if c.became == k) for k in plural}
    return ", ".join(f"{n} {k if n == 1 else plural[k]}" for k, n in counts.items() if n)


def _shown(value) -> str:
    text = str(value)
    return repr(text if len(text) <= 30 else text[:27] + "...")


def _not_number(col: pd.Series):
    values = col.dropna().astype(str)
    bad = values[pd.to_numeric(values, errors="coerce").isna()]
    return bad.iloc[0] if len(bad) else values.iloc[0]
