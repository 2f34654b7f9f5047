#!/bin/bash
# Oracle: one command, absolute paths.
echo pepper > /app/table_84.txt
