#!/bin/bash
mkdir -p /logs/agent
echo 9 > /logs/agent/answer.txt
