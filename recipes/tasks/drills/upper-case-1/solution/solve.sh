#!/bin/bash
# Oracle: one command, absolute paths.
tr a-z A-Z < /app/inventory_26.txt > /app/batch_62.txt
