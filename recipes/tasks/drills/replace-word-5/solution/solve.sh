#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/quartz/raven/g' /app/batch_78.cfg
