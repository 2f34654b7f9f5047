#!/bin/bash
# Oracle: one command, absolute paths.
mkdir -p /app/archive
