#!/bin/bash
# Verifier: runs /tests/test_outputs.py with pytest; reward 1 if every check passes, else 0.
set +e
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
export PYTHONDONTWRITEBYTECODE=1
cd /tests || exit 0
timeout 50 python3 -m pytest -q -p no:cacheprovider test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
