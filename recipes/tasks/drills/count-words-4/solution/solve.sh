#!/bin/bash
# Oracle: one command, absolute paths.
wc -w < /app/queue_59.txt > /app/inventory_17.txt
