#!/bin/sh
# As in the official image: a command that starts with a flag is nats-server's arguments.
set -e
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    set -- nats-server "$@"
fi
exec "$@"
