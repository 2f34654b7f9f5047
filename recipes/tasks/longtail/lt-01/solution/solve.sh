#!/bin/bash
mkdir -p /logs/agent
echo 14 > /logs/agent/answer.txt
