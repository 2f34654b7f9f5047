#!/bin/bash
# Oracle: runs in /app.
set -e
cd /app
cat > /app/backup.sh <<'EOF'
#!/bin/bash
# usage: backup.sh SRC DEST
# Copies every SRC/*.txt to DEST/<name>.bak, creating DEST if needed.
shopt -s nullglob
src=$1
dest=$2
mkdir -p -- "$dest"
for f in "$src"/*.txt; do
  cp -- "$f" "$dest/$(basename -- "$f").bak"
done
EOF
chmod 755 /app/backup.sh
