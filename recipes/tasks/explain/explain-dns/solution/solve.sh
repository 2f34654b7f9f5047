#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
DNS translates the website's host name, such as example.com, into the IP address of the server. The browser asks a resolver, which queries the DNS hierarchy (root, top-level domain, authoritative servers) or its cache, and then connects to the returned address.
EOF
