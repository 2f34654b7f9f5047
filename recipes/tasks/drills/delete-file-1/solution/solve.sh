#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/items_79.txt
