#!/bin/bash
# Oracle: one command, absolute paths.
echo zephyr >> /app/batch_65.txt
