#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/list_40.txt
