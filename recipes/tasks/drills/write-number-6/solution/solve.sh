#!/bin/bash
# Oracle: one command, absolute paths.
echo 5330 > /app/records_34.txt
