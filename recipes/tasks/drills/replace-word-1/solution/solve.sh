#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/garnet/cedar/g' /app/batch_88.cfg
