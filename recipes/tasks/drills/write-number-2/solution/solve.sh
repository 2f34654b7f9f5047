#!/bin/bash
# Oracle: one command, absolute paths.
echo 5798 > /app/queue_50.txt
