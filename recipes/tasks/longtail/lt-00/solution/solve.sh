#!/bin/bash
mkdir -p /logs/agent
echo 7 > /logs/agent/answer.txt
