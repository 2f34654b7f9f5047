#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
It means the running time grows at most proportionally to n times the logarithm of n for inputs of size n, up to a constant factor, for large n. Doubling the input a little more than doubles the work; efficient comparison sorts such as merge sort run in O(n log n).
EOF
