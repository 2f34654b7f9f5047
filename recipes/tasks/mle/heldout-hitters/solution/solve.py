"""The MLE tasks' reference solution (tools/make_mle.py copies it into every task as
solution/solve.py; solve.sh runs it with the model the generator picked).

A plain scikit-learn pipeline: numeric columns imputed (median) and standardized, the others
imputed (most frequent) and one-hot encoded, then one of a few fixed, seeded models; it trains
on train.csv and writes the predictions for test.csv as ``id,<target>``. Written for the
sandbox's scikit-learn (1.2, Debian bookworm's and the task image's pinned one) and later ones.
"""

from __future__ import annotations

import argparse

import pandas as pd
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

MODELS = {
    "classification": {
        "linear": lambda: LogisticRegression(C=1.0, max_iter=5000),
        "forest": lambda: RandomForestClassifier(n_estimators=300, random_state=0, n_jobs=1),
        "boosting": lambda: GradientBoostingClassifier(random_state=0),
    },
    "regression": {
        "linear": lambda: Ridge(alpha=1.0),
        "forest": lambda: RandomForestRegressor(n_estimators=300, random_state=0, n_jobs=1),
        "boosting": lambda: GradientBoostingRegressor(random_state=0),
    },
}


def predict(train: pd.DataFrame, test: pd.DataFrame, target: str, kind: str, model: str) -> list:
    """Predictions for `test` from `model` fitted on `train` (its `target` column)."""
    features = [c for c in train.columns if c not in ("id", target)]
    numeric = [c for c in features if pd.api.types.is_numeric_dtype(train[c])]
    other = [c for c in features if c not in numeric]
    prep = ColumnTransformer(
        [
            ("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric),
            (
                "cat",
                make_pipeline(
                    SimpleImputer(strategy="most_frequent"),
                    OneHotEncoder(handle_unknown="ignore"),
                ),
                other,
            ),
        ]
    )
    pipe = make_pipeline(prep, MODELS[kind][model]())
    y = train[target].astype(str) if kind == "classification" else train[target]
    pipe.fit(train[features], y)
    return list(pipe.predict(test[features]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target", required=True)
    ap.add_argument("--kind", choices=sorted(MODELS), required=True)
    ap.add_argument("--model", choices=sorted(MODELS["regression"]), required=True)
    ap.add_argument("--data", default="/app/data")
    ap.add_argument("--out", default="/app/submission.csv")
    args = ap.parse_args()
    train = pd.read_csv(f"{args.data}/train.csv")
    test = pd.read_csv(f"{args.data}/test.csv")
    pred = predict(train, test, args.target, args.kind, args.model)
    pd.DataFrame({"id": test["id"], args.target: pred}).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
