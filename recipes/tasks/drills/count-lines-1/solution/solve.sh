#!/bin/bash
# Oracle: one command, absolute paths.
wc -l < /app/queue_34.txt > /app/records_26.txt
