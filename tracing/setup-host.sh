#!/bin/sh
# Host set-up for twintrace on Debian/Ubuntu, as root: installs the Docker engine, docker-compose
# (Debian's 1.29, for docker-compose.yml), debootstrap and Python's venv module from the OS
# packages when missing (no bpftrace: runs are traced from the twintrace/tracer image, which
# `./cli.py build` makes with its own), starts dockerd when it is not running, and mounts tracefs when it is
# empty. Safe to run again (does nothing then).
set -eu

fail() { echo "twintrace setup: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "must run as root (tracing needs it): rerun with sudo, e.g. \`sudo make setup\`"
[ -f /etc/debian_version ] || fail "not a Debian/Ubuntu system: install the Docker engine, docker-compose, debootstrap and python3-venv with your package manager, start dockerd, mount tracefs, then run \`make setup\` again"

need=""
command -v dockerd >/dev/null 2>&1 || need="$need docker.io"
command -v docker-compose >/dev/null 2>&1 || need="$need docker-compose"
command -v debootstrap >/dev/null 2>&1 || need="$need debootstrap"
# tc and ip (--net-bandwidth caps a run's network), nsenter (finds a container's veth)
command -v tc >/dev/null 2>&1 || need="$need iproute2"
command -v nsenter >/dev/null 2>&1 || need="$need util-linux"
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need="$need python3-venv"
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need="$need chromium fonts-liberation"
if [ -n "$need" ]; then
  echo "twintrace setup: installing$need"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $need
fi

if [ ! -d /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing || fail "could not mount tracefs on /sys/kernel/tracing"
fi

if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl start docker
  else
    echo "twintrace setup: starting dockerd (log: /var/log/dockerd.log)"
    # Containers may lock no more memory than the daemon: lift its limit where the host lets
    # us (emulated pinned host memory of the sleep variant; harmless where it cannot).
    ulimit -l unlimited 2>/dev/null || true
    nohup dockerd >/var/log/dockerd.log 2>&1 &
  fi
  i=0
  until docker info >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -le 60 ] || fail "dockerd did not come up within 60 s: see /var/log/dockerd.log"
    sleep 1
  done
fi
echo "twintrace setup: host ready (docker $(docker version --format '{{.Server.Version}}'), docker-compose $(docker-compose version --short))"
