#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/hello.py <<'EOF'
print("Hello, World!")
EOF
