#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/falcon/cedar/g' /app/list_77.cfg
