#!/bin/bash
# Oracle: one command, absolute paths.
rm /app/inventory_96.txt
