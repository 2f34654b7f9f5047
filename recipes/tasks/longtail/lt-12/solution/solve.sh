#!/bin/bash
mkdir -p /logs/agent
echo 15 > /logs/agent/answer.txt
