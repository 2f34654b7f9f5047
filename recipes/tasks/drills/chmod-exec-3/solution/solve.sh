#!/bin/bash
# Oracle: one command, absolute paths.
chmod +x /app/saffron.sh
