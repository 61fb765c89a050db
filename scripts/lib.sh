# Shared by the scripts in this folder (sourced, not run).

# say TAG MESSAGE…: a bold "[TAG]" then the message, on stderr.
say_as() { local tag=$1; shift; printf '\033[1m[%s]\033[0m %s\n' "$tag" "$*" >&2; }

# Where cargo puts its output: CARGO_TARGET_DIR, build.target-dir of any config, or ./target.
target_dir() {
  cargo metadata --format-version 1 --no-deps --offline 2>/dev/null \
    | grep -o '"target_directory":"[^"]*"' | head -n 1 | cut -d'"' -f4
}

# Whether something accepts TCP connections on host $1, port $2.
reachable() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# A port on 127.0.0.1 nothing listens on now (whoever binds it should retry on a clash).
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 30000))
    reachable 127.0.0.1 "$port" || { echo "$port"; return; }
  done
}

# Polls `curl -fs URL` for up to $2 seconds (default 30).
wait_http() {
  local url=$1 limit=${2:-30} i
  for ((i = 0; i < limit * 5; i++)); do
    curl -fs "$url" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# The port a service logged it listens on (LOG_FORMAT=json) in file $1, waiting up to 30 s.
logged_port() {
  local log=$1 port i
  for ((i = 0; i < 150; i++)); do
    port=$(grep ' listening"' "$log" 2>/dev/null | grep -o '"port":[0-9]*' | head -n 1 | cut -d: -f2)
    [ -n "$port" ] && { echo "$port"; return 0; }
    sleep 0.2
  done
  return 1
}
