#!/bin/bash
# Oracle: one command, absolute paths.
echo raven > /app/source_49.txt
