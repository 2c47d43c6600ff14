#!/usr/bin/env bash
# A private Docker engine for the sandbox tests.
#   .ci/docker.sh start   install docker.io if missing, start dockerd (no iptables, no bridge) with its
#                         own data/exec roots and socket under $JAXSWE_CI_DOCKER_DIR, wait until it
#                         answers, build the jaxswe base image (cached), print `export DOCKER_HOST=...`
#                         (JAXSWE_CI_DOCKER_BASE=0: no base image; a pool of engines loads it from another)
#   .ci/docker.sh stop    stop that dockerd by its pid
# Only the export line goes to stdout, so `eval "$(bash .ci/docker.sh start)"` works.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${JAXSWE_CI_DOCKER_DIR:-/tmp/jaxswe-ci-docker}"
sock="$dir/docker.sock"
pidfile="$dir/dockerd.pid"
log() { echo "docker.sh: $*" >&2; }

start() {
  if ! command -v dockerd >/dev/null; then
    log "installing docker.io"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2
  fi
  mkdir -p "$dir/data" "$dir/exec"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    log "dockerd already running (pid $(cat "$pidfile"))"
  else
    rm -f "$pidfile" "$sock"
    nohup dockerd --iptables=false --ip6tables=false --bridge=none \
      --data-root "$dir/data" --exec-root "$dir/exec" --pidfile "$pidfile" \
      --host "unix://$sock" >"$dir/dockerd.log" 2>&1 </dev/null &
  fi
  export DOCKER_HOST="unix://$sock"
  for _ in $(seq 1 120); do
    docker version >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker version >/dev/null 2>&1 || { log "dockerd did not answer; see $dir/dockerd.log"; tail -20 "$dir/dockerd.log" >&2; exit 1; }
  log "dockerd answers on $DOCKER_HOST"
  if [ "${JAXSWE_CI_DOCKER_BASE:-1}" = 0 ]; then
    echo "export DOCKER_HOST=unix://$sock"
    return
  fi
  command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
  }
  python3 -m envs base >&2
  echo "export DOCKER_HOST=unix://$sock"
}

stop() {
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"
    log "dockerd stopped"
  else
    log "no dockerd pidfile at $pidfile"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
