#!/bin/bash
# Oracle: one command, absolute paths.
echo quartz > /app/source_46.txt
