#!/bin/bash
# Oracle: one command, absolute paths.
echo zephyr > /app/entries_89.txt
