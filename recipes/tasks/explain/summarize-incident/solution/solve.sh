#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
A configuration change at 09:12 set the database connection limit too high for its memory, so the database kept restarting and about 30% of checkouts failed for 41 minutes until the change was rolled back at 09:53. A memory-headroom check will now run before such changes.
EOF
