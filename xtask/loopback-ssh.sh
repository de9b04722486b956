#!/usr/bin/env bash
# Cluster mode over real ssh, on one machine: starts a throwaway sshd on 127.0.0.1, writes a
# hosts file with 1 server + 2 client "hosts" (all 127.0.0.1, reached through that sshd), runs
#
#   cargo xtask bench rpc --quick --profile release --hosts <generated> --launcher ssh [ARGS...]
#
# and always cleans up (trap on exit, Ctrl-C, TERM): stops the sshd and any ssh client still
# using its key, kills any process still running from one of its sessions (they carry
# RRPC_LOOPBACK_SSH=<temp dir> in their environment, set by this sshd's `SetEnv`), deletes the
# temp dir, and checks that none is left. Extra
# arguments go to `cargo xtask bench` (e.g. `--out DIR`, `--json`).
#
# Everything stays on 127.0.0.1: sshd listens only there, the hosts file names only 127.0.0.1,
# and the bench server listens on 127.0.0.1 (xtask binds loopback hosts to their own address).
# The sshd is not the system one: its own config, host key, client key, authorized_keys and
# known_hosts live in a fresh temp dir; only the current user may log in, by that key only.
#
# Needs /usr/sbin/sshd (Debian: `apt-get install openssh-server`; the package's own service is
# not used) and ssh/ssh-keygen. Not part of `cargo xtask ci` (it starts a daemon). Run from
# anywhere: `xtask/loopback-ssh.sh`.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
sshd_bin=${SSHD:-/usr/sbin/sshd}
for prog in "$sshd_bin" ssh ssh-keygen; do
    if ! command -v "$prog" >/dev/null; then
        echo "loopback-ssh: $prog not found (Debian: apt-get install openssh-server openssh-client)" >&2
        exit 2
    fi
done

tmp=$(mktemp -d /tmp/rrpc-loopback-ssh.XXXXXX)
# Host names carry the temp dir's suffix, so this run's remote pid files
# (/tmp/rrpc-bench-<run>-<host>.pid) are told apart from any other run's.
tag=${tmp##*.}
marker="RRPC_LOOPBACK_SSH=$tmp"
sshd_pid=

# Pids whose /proc/<pid>/$1 (environ or cmdline, NUL-separated) has an entry matching grep
# pattern $2 (passed as grep options after it, e.g. -xF).
pids_with() {
    local f
    for f in /proc/[0-9]*/"$1"; do
        if tr '\0' '\n' 2>/dev/null <"$f" | grep -q "${@:3}" -- "$2"; then
            f=${f#/proc/}
            echo "${f%/*}"
        fi
    done
}

cleanup() {
    local rc=$? left=() _
    trap - EXIT INT TERM
    # Normally xtask has stopped everything; this catches what a killed xtask could not. First
    # the ssh clients (their command lines name files in $tmp) and sshd, so nothing new starts;
    # then whatever runs from one of its sessions (the marker is in its environment).
    mapfile -t left < <(pids_with cmdline "$tmp/" -F | grep -vxF "$sshd_pid")
    if ((${#left[@]})); then
        echo "loopback-ssh: killing leftover ssh clients: ${left[*]}" >&2
        kill -KILL "${left[@]}" 2>/dev/null || true
    fi
    if [[ -n $sshd_pid ]]; then
        kill -TERM "$sshd_pid" 2>/dev/null || true
        wait "$sshd_pid" 2>/dev/null || true
    fi
    for _ in 1 2 3 4 5; do
        mapfile -t left < <(pids_with environ "$marker" -xF)
        ((${#left[@]})) || break
        echo "loopback-ssh: killing leftover session processes:" >&2
        ps -o pid=,args= -p "$(IFS=,; echo "${left[*]}")" >&2 || true
        kill -KILL "${left[@]}" 2>/dev/null || true
        sleep 0.2
    done
    # Pid files of remote process groups that a killed xtask did not get to remove.
    find /tmp -maxdepth 1 -name "rrpc-bench-*-lo$tag-*.pid" -delete 2>/dev/null || true
    mapfile -t left < <(pids_with environ "$marker" -xF; pids_with cmdline "$tmp/" -F)
    if ((${#left[@]})); then
        echo "loopback-ssh: still running after cleanup: ${left[*]}" >&2
        rc=1
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

user=$(id -un)
ssh-keygen -q -t ed25519 -N '' -C rrpc-loopback-host -f "$tmp/host_key"
ssh-keygen -q -t ed25519 -N '' -C rrpc-loopback-client -f "$tmp/client_key"
cp "$tmp/client_key.pub" "$tmp/authorized_keys"

# sshd refuses to start without its privilege-separation directory (normally made by the
# service unit); as root, create it (empty, root-owned, as the package expects).
if [[ $(id -u) -eq 0 && ! -d /run/sshd ]]; then
    mkdir -m 0755 /run/sshd
fi

# A free port: the first of a few random high ports that nothing answers on.
free_port() {
    local p
    for _ in $(seq 20); do
        p=$((20000 + RANDOM % 40000))
        if [[ $p != "${1:-}" ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "loopback-ssh: no free port found" >&2
    return 1
}
port=$(free_port)
bench_port=$(free_port "$port")

cat >"$tmp/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $tmp/host_key
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
AllowUsers $user
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The key files sit under /tmp, which is world-writable: StrictModes would refuse them.
StrictModes no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
PrintMotd no
SetEnv $marker
LogLevel ERROR
EOF
"$sshd_bin" -t -f "$tmp/sshd_config"
# In its own session: a Ctrl-C or TERM to this script's process group must not take sshd down
# before xtask has used it to stop the remote processes (cleanup stops it afterwards).
setsid "$sshd_bin" -D -e -f "$tmp/sshd_config" 2>"$tmp/sshd.log" &
sshd_pid=$!

# The client trusts exactly this host key, and uses exactly this identity.
echo "[127.0.0.1]:$port $(cat "$tmp/host_key.pub")" >"$tmp/known_hosts"
for _ in $(seq 100); do
    if ! kill -0 "$sshd_pid" 2>/dev/null; then
        echo "loopback-ssh: sshd exited at start:" >&2
        cat "$tmp/sshd.log" >&2
        exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        break
    fi
    sleep 0.05
done

cat >"$tmp/hosts.toml" <<EOF
# Generated by xtask/loopback-ssh.sh: three "hosts", all 127.0.0.1 through sshd on port $port.
[defaults]
user = "$user"
ssh_key = "$tmp/client_key"
ssh_port = $port
ssh_options = [
    "UserKnownHostsFile=$tmp/known_hosts",
    "GlobalKnownHostsFile=/dev/null",
    "StrictHostKeyChecking=yes",
    "IdentitiesOnly=yes",
    "IdentityAgent=none",
]
port = $bench_port

[[hosts]]
name = "lo$tag-srv"
address = "127.0.0.1"
role = "server"

[[hosts]]
name = "lo$tag-c1"
address = "127.0.0.1"
role = "client"
clients = 2

[[hosts]]
name = "lo$tag-c2"
address = "127.0.0.1"
role = "client"
clients = 2
EOF

# One plain round trip first, so a broken sshd setup fails here with ssh's own message.
ssh -F /dev/null -o BatchMode=yes -o ConnectTimeout=5 -o "UserKnownHostsFile=$tmp/known_hosts" \
    -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes \
    -o IdentityAgent=none -i "$tmp/client_key" -p "$port" "$user@127.0.0.1" -- true \
    || { echo "loopback-ssh: ssh to the loopback sshd failed; its log:" >&2; cat "$tmp/sshd.log" >&2; exit 1; }
echo "loopback-ssh: sshd (pid $sshd_pid) on 127.0.0.1:$port, hosts file $tmp/hosts.toml" >&2

cd "$root"
cargo xtask bench rpc --quick --profile release --hosts "$tmp/hosts.toml" --launcher ssh "$@"
