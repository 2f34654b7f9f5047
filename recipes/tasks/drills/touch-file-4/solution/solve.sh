#!/bin/bash
# Oracle: one command, absolute paths.
touch /app/quartz.marker
