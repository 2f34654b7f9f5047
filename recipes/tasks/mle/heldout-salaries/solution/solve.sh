#!/bin/bash
# The reference solution: a scikit-learn pipeline (boosting model) trained on /app/data/train.csv.
set -e
python3 /solution/solve.py --target 'salary' --kind regression --model boosting
