#!/bin/bash
# Oracle: one command, absolute paths.
sed -i 's/alpha/zephyr/g' /app/queue_28.cfg
