#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/catalog_78.txt > /app/queue_71.txt
