#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("garnet willow")' > /app/cedar.py
