#!/bin/bash
# Oracle: one command, absolute paths.
sort /app/catalog_97.txt > /app/entries_76.txt
