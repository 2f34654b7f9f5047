#!/bin/bash
mkdir -p /logs/agent
echo 6 > /logs/agent/answer.txt
