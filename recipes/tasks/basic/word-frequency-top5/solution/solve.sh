#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
tr 'A-Z' 'a-z' < /app/text.txt | tr -cs 'a-z' '\n' | grep -v '^$' | sort | uniq -c \
  | sort -k1,1nr -k2,2 | head -n 5 | awk '{print $2, $1}' > /app/top5.txt
