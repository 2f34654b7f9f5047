#!/bin/bash
mkdir -p /logs/agent
echo 3 > /logs/agent/answer.txt
