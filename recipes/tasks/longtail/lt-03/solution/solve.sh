#!/bin/bash
mkdir -p /logs/agent
echo 13 > /logs/agent/answer.txt
