#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/juniper/alpha/g' /app/batch_49.cfg
