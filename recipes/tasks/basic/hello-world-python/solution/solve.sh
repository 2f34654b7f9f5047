#!/bin/bash
# Oracle: one command, absolute paths (the demonstration SFT and DAgger learn from).
cat > /app/hello.py <<'EOF'
print("Hello, World!")
EOF
