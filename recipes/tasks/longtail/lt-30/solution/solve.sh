#!/bin/bash
mkdir -p /logs/agent
echo 10 > /logs/agent/answer.txt
