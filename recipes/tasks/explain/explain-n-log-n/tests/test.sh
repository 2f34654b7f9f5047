#!/bin/bash
# Verifier: the format check a script can make (the content is the judge's, see
# judge.toml): /app/answer.md exists and holds 10 to 80 words. reward.json: reward 1 or 0,
# and the word count.
set +e
mkdir -p /logs/verifier
echo '{"reward": 0, "words": 0}' > /logs/verifier/reward.json
[ -f /app/answer.md ] || exit 0
words=$(wc -w < /app/answer.md | tr -d ' ')
reward=0
if [ "$words" -ge 10 ] && [ "$words" -le 80 ]; then reward=1; fi
echo "{\"reward\": $reward, \"words\": $words}" > /logs/verifier/reward.json
exit 0
