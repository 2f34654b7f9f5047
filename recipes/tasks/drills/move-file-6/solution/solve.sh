#!/bin/bash
# Oracle: one command, absolute paths.
mv /app/table_59.txt /app/batch_29.txt
