#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
404 Not Found is a client error: the server works but has no resource at the requested URL. 500 Internal Server Error is a server error: the request may be valid but the server failed while handling it.
EOF
