#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/manifest_69.txt /app/items_86.txt
