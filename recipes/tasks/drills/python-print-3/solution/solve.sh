#!/bin/bash
# Oracle: one command, absolute paths.
echo 'print("lantern lantern")' > /app/saffron.py
