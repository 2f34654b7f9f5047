#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/fizzbuzz.py <<'EOF'
import sys

n = int(sys.argv[1])
for i in range(1, n + 1):
    if i % 15 == 0:
        print("FizzBuzz")
    elif i % 3 == 0:
        print("Fizz")
    elif i % 5 == 0:
        print("Buzz")
    else:
        print(i)
EOF
