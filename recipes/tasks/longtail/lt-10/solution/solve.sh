#!/bin/bash
mkdir -p /logs/agent
echo 8 > /logs/agent/answer.txt
