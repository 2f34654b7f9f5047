#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
The GIL is a lock in CPython that lets only one thread execute Python bytecode at a time. It keeps the interpreter's memory management simple and safe, but it stops CPU-bound threads from running in parallel; I/O-bound threads and separate processes are not limited by it.
EOF
