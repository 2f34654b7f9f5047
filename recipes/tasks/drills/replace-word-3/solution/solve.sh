#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/copper/raven/g' /app/manifest_90.cfg
