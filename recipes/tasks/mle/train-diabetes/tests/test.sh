#!/bin/bash
# Verifier: grade /app/submission.csv against the hidden labels (tests/grade.py). A missing
# submission scores 0; a malformed one writes no reward (a verifier failure, with the reason).
mkdir -p /logs/verifier
exec timeout 100 python3 /tests/grade.py
