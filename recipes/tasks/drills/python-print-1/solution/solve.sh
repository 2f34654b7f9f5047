#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("alpha meadow")' > /app/maple.py
