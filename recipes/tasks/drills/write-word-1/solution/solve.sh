#!/bin/bash
# Oracle: one command, absolute paths.
echo meadow > /app/queue_15.txt
