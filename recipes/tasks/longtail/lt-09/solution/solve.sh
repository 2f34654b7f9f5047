#!/bin/bash
mkdir -p /logs/agent
echo 2 > /logs/agent/answer.txt
