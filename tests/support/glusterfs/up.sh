#!/usr/bin/env bash
# tests/support/glusterfs/up.sh — a real GlusterFS volume on this host, FUSE-mounted twice, for the
# tests in tests/system/test_glusterfs.py (two mounts of one volume stand in for two hosts).
#
#   bash tests/support/glusterfs/up.sh              (root; idempotent; glusterfs-server installed)
#   eval "$(bash tests/support/glusterfs/up.sh)"    exports nothing by itself: prints assignments
#
# Starts glusterd if none runs (no systemd needed), creates and starts a one-brick volume with
# the options docs/deployment.md recommends plus every client cache off, mounts it at two
# mount points with the kernel's caches off, checks that a file written through one is read
# through the other, and prints on stdout:
#     GLUSTER_MOUNT_A=/mnt/snerd-test-a
#     GLUSTER_MOUNT_B=/mnt/snerd-test-b
#     GLUSTER_VOLUME=snerd-test
# Progress goes to stderr. A stale mount (its client killed) is remounted, a dead glusterd or
# brick restarted. Every wait is bounded. Undo with tests/support/glusterfs/down.sh.
#
# Environment (optional): GLUSTER_MOUNT_A, GLUSTER_MOUNT_B (mount points), GLUSTER_VOLUME,
# GLUSTER_BRICK_ROOT (default /var/lib/snerd-test-gluster), GLUSTER_STATE_DIR (pid files,
# default /run/snerd-test-gluster).
#
# SNERD_GLUSTER_NETNS=1: a second, separate setup whose clients can be cut off the network
# (the jepsen-lite partition nemesis, docs/chaos.md). Its own glusterd (own working
# directory, run directory and CLI socket) runs with its brick in network namespace
# snerd-t-srv at 10.201.0.1; mount A's FUSE client runs in snerd-t-a (veth snerd-t-ca
# 10.201.1.2 <-> snerd-t-sa 10.201.1.1), mount B's in snerd-t-b (snerd-t-cb 10.201.2.2 <->
# snerd-t-sb 10.201.2.1). The clients are started with `nsenter --net` (network namespace
# only), so both mounts are in this mount namespace. Defaults: volume snerd-test-ns, mounts
# /mnt/snerd-test-na and /mnt/snerd-test-nb, bricks /var/lib/snerd-test-gluster-ns, state
# /run/snerd-test-gluster-ns. It shares nothing with the default setup: both can be up at
# once. It also prints GLUSTER_SOCK (the CLI socket: gluster --glusterd-sock=...),
# GLUSTER_NETNS_SRV and GLUSTER_LINK_A/B (the server-side veth of each client: cut with
# `ip -n snerd-t-srv link set snerd-t-sa down`, heal with `... up`; always the server side:
# taking the client side down deletes the client's route). A rerun re-applies links and
# routes (healing a cut left over) and remounts a mount whose client gave up.
set -euo pipefail

log() { printf '[glusterfs-up %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (glusterd, FUSE mounts, trusted.* xattrs on the brick)"

NETNS=${SNERD_GLUSTER_NETNS:-0}
NS_SRV=snerd-t-srv NS_A=snerd-t-a NS_B=snerd-t-b
if [ "$NETNS" = 1 ]; then
    MOUNT_A=${GLUSTER_MOUNT_A:-/mnt/snerd-test-na}
    MOUNT_B=${GLUSTER_MOUNT_B:-/mnt/snerd-test-nb}
    VOL=${GLUSTER_VOLUME:-snerd-test-ns}
    BRICK_ROOT=${GLUSTER_BRICK_ROOT:-/var/lib/snerd-test-gluster-ns}
    STATE=${GLUSTER_STATE_DIR:-/run/snerd-test-gluster-ns}
    HOST=10.201.0.1
    SOCK=$STATE/glusterd.socket
    SRV_NS=$NS_SRV CL_NS_A=$NS_A CL_NS_B=$NS_B
else
    MOUNT_A=${GLUSTER_MOUNT_A:-/mnt/snerd-test-a}
    MOUNT_B=${GLUSTER_MOUNT_B:-/mnt/snerd-test-b}
    VOL=${GLUSTER_VOLUME:-snerd-test}
    BRICK_ROOT=${GLUSTER_BRICK_ROOT:-/var/lib/snerd-test-gluster}
    STATE=${GLUSTER_STATE_DIR:-/run/snerd-test-gluster}
    # The gluster CLI refuses "localhost" and 127.0.0.1 as a brick host by string comparison;
    # any other 127.x address is on lo and glusterd takes it as this host.
    HOST=127.0.0.2
    SOCK=""
    SRV_NS="" CL_NS_A="" CL_NS_B=""
fi
BRICK="$HOST:$BRICK_ROOT/$VOL/brick"
LOGS=/var/log/glusterfs

# Volume options (docs/deployment.md, "Testing on GlusterFS"):
OPTS=(
    # a lock lost while a client was cut off fails its holder's fd (EBADFD) instead of the
    # client silently reopening the file unlocked after reconnecting
    client.strict-locks on
    # a cut-off client gives up after 10 s (default 42), below snerd's 30 s default lease
    network.ping-timeout 10
    # the server frees a cut-off client's locks after ~5 s (apply to connections made after
    # they are set: set before mounting)
    server.tcp-user-timeout 5
    server.keepalive-time 2
    server.keepalive-interval 1
    server.keepalive-count 2
)
# The "strict" cache profile: every client-side cache off, so a rename, append or unlink made
# through one mount is seen at once through the other (with the 0 kernel timeouts below).
for o in stat-prefetch quick-read open-behind write-behind read-ahead io-cache readdir-ahead nl-cache; do
    OPTS+=("performance.$o" off)
done

T_START=$(date +%s%N)
for tool in glusterd gluster glusterfs; do
    command -v "$tool" >/dev/null || die "$tool not found: apt-get install --no-install-recommends glusterfs-server glusterfs-client"
done
[ -c /dev/fuse ] || die "/dev/fuse missing (the kernel needs FUSE)"
grep -qw fuse /proc/filesystems || die "the kernel has no fuse filesystem"
if [ "$NETNS" = 1 ]; then
    for tool in ip nsenter; do
        command -v "$tool" >/dev/null || die "$tool not found (iproute2, util-linux)"
    done
fi
mkdir -p "$STATE" "$LOGS"

alive() { # pid [comm]: running (not a zombie) and, when given, with that comm
    local pid=$1 st
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/stat" ] || return 1
    st=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ "$st" != Z ] || return 1
    [ -z "${2:-}" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
wait_for() { # seconds description cmd...
    local secs=$1 what=$2; shift 2
    local end=$(( $(date +%s) + secs ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || die "timed out after ${secs}s waiting for $what"
        sleep 0.1
    done
}
CLI=(gluster --mode=script)
[ -z "$SOCK" ] || CLI+=("--glusterd-sock=$SOCK" "--log-file=$LOGS/$VOL-cli.log")
g() { timeout 60 "${CLI[@]}" "$@"; }
in_ns() { # netns (may be empty) cmd...: cmd with only its network namespace switched
    local ns=$1; shift
    if [ -n "$ns" ]; then nsenter --net="/run/netns/$ns" "$@"; else "$@"; fi
}

# --- network namespaces (SNERD_GLUSTER_NETNS=1)
if [ "$NETNS" = 1 ]; then
    for ns in $NS_SRV $NS_A $NS_B; do
        if [ ! -e "/run/netns/$ns" ]; then
            ip netns add "$ns"
            log "created network namespace $ns"
        fi
        ip -n "$ns" link set lo up
    done
    # pair x: snerd-t-sx (server side, in snerd-t-srv) <-> snerd-t-cx (client side, in snerd-t-x)
    for x in a b; do
        n=1 ns=$NS_A
        [ $x = b ] && n=2 ns=$NS_B
        if ! ip -n $NS_SRV link show snerd-t-s$x >/dev/null 2>&1; then
            ip -n "$ns" link del snerd-t-c$x 2>/dev/null || true
            ip link add snerd-t-s$x netns $NS_SRV type veth peer name snerd-t-c$x netns "$ns"
        fi
        ip -n $NS_SRV addr replace 10.201.$n.1/24 dev snerd-t-s$x
        ip -n "$ns" addr replace 10.201.$n.2/24 dev snerd-t-c$x
        ip -n $NS_SRV link set snerd-t-s$x up    # also heals a cut left over
        ip -n "$ns" link set snerd-t-c$x up
        ip -n "$ns" route replace 10.201.0.1/32 via 10.201.$n.1
    done
    ip -n $NS_SRV addr replace 10.201.0.1/32 dev lo
fi

# --- glusterd
gd_pid=$(cat "$STATE/glusterd.pid" 2>/dev/null || true)
if alive "$gd_pid" glusterd; then
    log "glusterd already running (pid $gd_pid, ours)"
elif [ "$NETNS" != 1 ] && timeout 10 gluster --mode=script pool list >/dev/null 2>&1; then
    log "using a glusterd already running (not ours: down.sh leaves it alone)"
    rm -f "$STATE/glusterd.ours"
else
    log "starting glusterd${SRV_NS:+ in netns $SRV_NS}"
    rm -f "$STATE/glusterd.pid"
    GD=(glusterd -p "$STATE/glusterd.pid" --log-file="$LOGS/$VOL-glusterd.log")
    if [ "$NETNS" = 1 ]; then
        # a glusterd of its own: nothing shared with the host's glusterd (if any)
        mkdir -p "$BRICK_ROOT/glusterd" "$STATE/run"
        GD+=(--xlator-option "management.working-directory=$BRICK_ROOT/glusterd"
             --xlator-option "management.run-directory=$STATE/run"
             --xlator-option "management.glusterd-sockfile=$SOCK")
    fi
    in_ns "$SRV_NS" "${GD[@]}"
    touch "$STATE/glusterd.ours"
    wait_for 60 "glusterd to answer" timeout 10 "${CLI[@]}" pool list
    log "glusterd up (pid $(cat "$STATE/glusterd.pid"))"
fi

# --- the volume
if g volume info "$VOL" >/dev/null 2>&1; then
    have=$(g volume info "$VOL" | sed -n 's/^Brick[0-9]*: //p' | tr '\n' ' ')
    [ "$have" = "$BRICK " ] || die "volume $VOL exists with bricks '$have', wanted '$BRICK': run tests/support/glusterfs/down.sh --purge"
else
    log "creating volume $VOL ($BRICK)"
    # a brick directory left from an earlier volume carries that volume's id xattr: ours, wipe
    rm -rf "${BRICK_ROOT:?}/${VOL:?}"
    mkdir -p "$BRICK_ROOT/$VOL"
    # force: a brick on the root filesystem
    g volume create "$VOL" "$BRICK" force >&2
fi
current=$(g volume get "$VOL" all 2>/dev/null || true)
SET=()
for ((i = 0; i < ${#OPTS[@]}; i += 2)); do
    k=${OPTS[i]} v=${OPTS[i+1]}
    cur=$(awk -v k="$k" '$1 == k {print $2; exit}' <<<"$current")
    [ "$cur" = "$v" ] || SET+=("$k" "$v")
done
if [ ${#SET[@]} -gt 0 ]; then
    log "volume set ${SET[*]}"
    g volume set "$VOL" "${SET[@]}" >&2
fi
if [ "$(g volume info "$VOL" | sed -n 's/^Status: //p')" != Started ]; then
    log "starting volume $VOL"
    g volume start "$VOL" >&2
fi
brick_online() { g volume status "$VOL" detail 2>/dev/null | grep -q '^Online *: Y'; }
if ! brick_online; then
    log "brick offline: volume start force"
    g volume start "$VOL" force >&2   # restarts a brick process that died
fi
wait_for 60 "the brick of $VOL to be online" brick_online

# --- the two mounts
mounted() { # mount point -> "source fstype" from /proc/self/mounts, or nothing
    awk -v m="$1" '$2 == m {print $1, $3}' /proc/self/mounts | tail -1
}
healthy() { [ "$(timeout 10 stat -c %i "$1" 2>/dev/null)" = 1 ]; }
mount_one() { # mount point, tag, netns of its client (or empty)
    local mp=$1 tag=$2 ns=$3 cur
    cur=$(mounted "$mp")
    if [ -n "$cur" ]; then
        if [ "$cur" = "$HOST:/$VOL fuse.glusterfs" ] && healthy "$mp"; then
            log "$mp already mounted"
            return
        fi
        case $cur in
            *" fuse.glusterfs") log "remounting a stale gluster mount at $mp ($cur)"
                umount "$mp" 2>/dev/null || umount -l "$mp" ;;
            *) die "$mp is already a mount point of something else: $cur" ;;
        esac
    fi
    mkdir -p "$mp"
    # what mount.glusterfs would run, with a pid file for down.sh; the kernel's attribute,
    # entry and negative caches off (the other half of the strict profile)
    in_ns "$ns" glusterfs --process-name fuse --volfile-server="$HOST" --volfile-id="/$VOL" \
        --attribute-timeout=0 --entry-timeout=0 --negative-timeout=0 \
        --pid-file="$STATE/client-$tag.pid" --log-file="$LOGS/$VOL-client-$tag.log" "$mp"
    wait_for 30 "the mount at $mp" healthy "$mp"
    [ "$(mounted "$mp")" = "$HOST:/$VOL fuse.glusterfs" ] || die "$mp: unexpected mount: $(mounted "$mp")"
    log "mounted $HOST:/$VOL at $mp (client pid $(cat "$STATE/client-$tag.pid"))"
}
mount_one "$MOUNT_A" a "$CL_NS_A"
mount_one "$MOUNT_B" b "$CL_NS_B"

cat >"$STATE/env" <<ENV
VOL=$VOL
MOUNT_A=$MOUNT_A
MOUNT_B=$MOUNT_B
BRICK_ROOT=$BRICK_ROOT
NETNS=$NETNS
ENV

# one mount sees what the other wrote
probe=".up-probe.$$"
echo "probe $$" >"$MOUNT_A/$probe"
[ "$(timeout 10 cat "$MOUNT_B/$probe")" = "probe $$" ] || die "a file written through $MOUNT_A is not read back through $MOUNT_B"
rm -f "$MOUNT_B/$probe"

ms=$(( ($(date +%s%N) - T_START) / 1000000 ))
log "ready in $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"
echo "GLUSTER_MOUNT_A=$MOUNT_A"
echo "GLUSTER_MOUNT_B=$MOUNT_B"
echo "GLUSTER_VOLUME=$VOL"
if [ "$NETNS" = 1 ]; then
    echo "GLUSTER_SOCK=$SOCK"
    echo "GLUSTER_NETNS_SRV=$NS_SRV"
    echo "GLUSTER_LINK_A=snerd-t-sa"
    echo "GLUSTER_LINK_B=snerd-t-sb"
fi
