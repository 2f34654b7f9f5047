#!/bin/bash
# Oracle: a reference answer (what the judge should score high).
cat > /app/answer.md <<'EOF'
TCP is connection-oriented and reliable: it sets up a connection, numbers bytes, retransmits lost data and delivers it in order. UDP sends independent datagrams with no connection, no retransmission and no ordering, so it is lighter and faster but may lose or reorder packets.
EOF
