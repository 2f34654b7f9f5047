#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
Version 2.4 lets you edit notes offline and syncs them later, makes search about three times faster on large notebooks, moves PDF export to the Share menu, and drops support for Android 8.
EOF
