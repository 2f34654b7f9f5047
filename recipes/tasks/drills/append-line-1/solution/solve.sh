#!/bin/bash
# Oracle: one command, absolute paths.
echo bravo >> /app/table_69.txt
