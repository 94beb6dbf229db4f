#!/usr/bin/env bash
# A real OpenSSH server on this machine, for the SSH DVC remote's test (tests/workflow/test_dvc_ssh.py):
# listens on 127.0.0.1 only, on port $GNA_SSHD_PORT (default 2222), and lets in only the current
# user, only with the client key generated here (no passwords, no PAM). Installs openssh-server and
# openssh-client from Debian packages when missing (that needs root; a machine with sshd does not).
#
#   tests/cluster/local_sshd.sh start    # install what is missing, make keys and config, start sshd
#   tests/cluster/local_sshd.sh stop     # stop the sshd it started, by PID
#
# Everything lives in $GNA_SSHD_DIR (default /var/tmp/gna-sshd): host key, client key pair
# (client_key, client_key.pub), authorized_keys, sshd_config, sshd.pid, sshd.log. `start` replaces
# an sshd started earlier from the same folder (the port may have changed).
set -euo pipefail

STATE=${GNA_SSHD_DIR:-/var/tmp/gna-sshd}
PORT=${GNA_SSHD_PORT:-2222}
SSHD=/usr/sbin/sshd
PACKAGES=(openssh-server openssh-client)

say() { echo "local_sshd: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=tests/cluster/apt_install.sh
source "$(dirname "$0")/apt_install.sh"
alive() { [ -s "$STATE/sshd.pid" ] && kill -0 "$(cat "$STATE/sshd.pid")" 2>/dev/null; }

install_packages() {
    [ -x "$SSHD" ] && command -v ssh-keygen >/dev/null && return 0
    install_missing "$STATE" "${PACKAGES[@]}"
}

write_config() {
    # keys without passphrases, made once per state folder
    [ -s "$STATE/host_key" ] || ssh-keygen -q -t ed25519 -N '' -C gna-sshd-host -f "$STATE/host_key"
    [ -s "$STATE/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C gna-sshd-client -f "$STATE/client_key"
    cp "$STATE/client_key.pub" "$STATE/authorized_keys"
    cat >"$STATE/sshd_config" <<EOF
# gna local test sshd (tests/cluster/local_sshd.sh)
ListenAddress 127.0.0.1
Port $PORT
HostKey $STATE/host_key
PidFile $STATE/sshd.pid
AllowUsers $(id -un)
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile $STATE/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# the state folder is world-readable /var/tmp: no ownership checks on it
StrictModes no
# DVC talks SFTP
Subsystem sftp internal-sftp
EOF
}

case "${1:-}" in
start)
    mkdir -p "$STATE"
    install_packages
    write_config
    if alive; then bash "$0" stop; fi
    if [ "$(id -u)" = 0 ]; then install -d -m 0755 /run/sshd; fi  # privilege separation folder
    "$SSHD" -t -f "$STATE/sshd_config" || die "sshd rejects $STATE/sshd_config"
    # sshd forks into the background and writes its PID file; -E: log to a file, not syslog
    "$SSHD" -f "$STATE/sshd_config" -E "$STATE/sshd.log"
    for _ in $(seq 100); do
        if bash -c "exec 3<>/dev/tcp/127.0.0.1/$PORT" 2>/dev/null && alive; then
            say "up on 127.0.0.1:$PORT for $(id -un), key $STATE/client_key"
            exit 0
        fi
        sleep 0.1
    done
    die "sshd did not accept connections on 127.0.0.1:$PORT within 10s (log: $STATE/sshd.log)"
    ;;
stop)
    if alive; then
        pid=$(cat "$STATE/sshd.pid")
        kill "$pid"
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$STATE/sshd.pid"
    say "stopped"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
