#!/bin/sh
# cli_broker_kill.sh -- the short form of tests/soak_broker_kill.sh in
# `make test`: the broker SIGKILLed and restarted 3 times under load
# (clients, two workers, a sync in flight each time). `make soak-broker`
# runs the 20 rounds issue 30 asks for.
# Usage: cli_broker_kill.sh BUILD
exec sh "$(dirname "$0")/soak_broker_kill.sh" "${1:-build}" 3
