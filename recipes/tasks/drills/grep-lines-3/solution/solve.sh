#!/bin/bash
# Oracle: one command, absolute paths.
grep OK /app/items_66.txt > /app/catalog_28.txt
