#!/bin/bash
mkdir -p /logs/agent
echo 11 > /logs/agent/answer.txt
