#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
git merge joins two branches by creating a merge commit that keeps both histories as they happened. git rebase replays the commits of one branch on top of another, rewriting them into a linear history without a merge commit.
EOF
