#!/bin/bash
mkdir -p /logs/agent
echo 16 > /logs/agent/answer.txt
