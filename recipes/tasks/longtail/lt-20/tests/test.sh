#!/bin/bash
# Verifier: the task's sandbox time (10 s, fixed: the set's long tail), then the answer
# check: reward 1 if /logs/agent/answer.txt holds 9 (spaces, $ and a trailing .0 ignored).
set +e
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
sleep 10
got=$(tr -d ' \n\r$' < /logs/agent/answer.txt 2>/dev/null)
got=${got%.0}
if [ "$got" = "9" ]; then
  echo 1 > /logs/verifier/reward.txt
fi
exit 0
