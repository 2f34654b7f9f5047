#!/bin/bash
# usage: backup.sh SRC DEST
# Copies every SRC/*.txt to DEST/<name>.bak, creating DEST if needed.
src=$1
dest=$2
mkdir -p $dest
for f in $src/*.txt; do
  cp $f $dest/$(basename $f).bak
done
