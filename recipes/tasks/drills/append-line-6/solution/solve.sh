#!/bin/bash
# Oracle: one command, absolute paths.
echo nickel >> /app/inventory_59.txt
