#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/roster_55.txt
