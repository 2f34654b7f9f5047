#!/bin/bash
# Oracle: one command, absolute paths.
echo orchid >> /app/records_83.txt
