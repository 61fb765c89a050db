#!/usr/bin/env bash
# Entry point of the postgres:15 stand-in: the parts of the official docker-entrypoint.sh that
# matter here (POSTGRES_PASSWORD, POSTGRES_USER, POSTGRES_DB, POSTGRES_HOST_AUTH_METHOD,
# POSTGRES_INITDB_ARGS, /docker-entrypoint-initdb.d/*.sql|*.sh), then exec so that postgres
# is PID 1 and gets the stop signal itself.
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA"
    chown -R postgres:postgres "$PGDATA"
    chmod 700 "$PGDATA"
    install -d -o postgres -g postgres -m 3777 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
        echo 'error: database is uninitialized and superuser password is not specified:' >&2
        echo '  set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)' >&2
        exit 1
    fi
    # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags, as upstream.
    if [ -n "${POSTGRES_PASSWORD:-}" ]; then
        initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
            ${POSTGRES_INITDB_ARGS:-}
    else
        initdb --username="$POSTGRES_USER" ${POSTGRES_INITDB_ARGS:-}
    fi
    printf '\nhost all all all %s\n' "$auth" >> "$PGDATA/pg_hba.conf"

    shopt -s nullglob
    scripts=(/docker-entrypoint-initdb.d/*)
    if [ "$POSTGRES_DB" != postgres ] || [ "${#scripts[@]}" -gt 0 ]; then
        # A temporary server on the socket only, as upstream, for the setup steps.
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
        psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres)
        if [ "$POSTGRES_DB" != postgres ]; then
            "${psql[@]}" -v db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
        fi
        for f in "${scripts[@]}"; do
            # shellcheck disable=SC1090 # the image user's own scripts
            case "$f" in
                *.sh)  echo "running $f"; . "$f" ;;
                *.sql) echo "running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
                *)     echo "ignoring $f" ;;
            esac
        done
        pg_ctl -D "$PGDATA" -m fast -w stop
    fi
    echo 'PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
