#!/usr/bin/env bash
# tests/support/glusterfs/down.sh — undo tests/support/glusterfs/up.sh.   (root; idempotent)
#
#   bash tests/support/glusterfs/down.sh [--purge]
#
# Unmounts the two mounts, stops the volume, and ends only processes that up.sh started or
# that gluster recorded for this volume, found through pid files: the two FUSE clients
# ($GLUSTER_STATE_DIR/client-{a,b}.pid), glusterd (only when up.sh started it) and the
# volume's brick (/var/run/gluster/vols/VOL/*.pid). Never kills by process name.
# --purge also deletes the volume and its brick (its data), so the next up starts empty.
# Same environment variables as up.sh; what up.sh recorded in its state directory wins over
# the defaults. SNERD_GLUSTER_NETNS=1 takes down the network-namespace setup instead (its own
# glusterd is always stopped; --purge also deletes its namespaces snerd-t-srv, snerd-t-a,
# snerd-t-b and its glusterd's working directory).
set -uo pipefail

log() { printf '[glusterfs-down %s] %s\n' "$(date +%T)" "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

PURGE=0
for a in "$@"; do
    case $a in
        --purge) PURGE=1 ;;
        *) log "usage: down.sh [--purge]"; exit 2 ;;
    esac
done
NETNS=${SNERD_GLUSTER_NETNS:-0}
NS_SRV=snerd-t-srv NS_A=snerd-t-a NS_B=snerd-t-b
if [ "$NETNS" = 1 ]; then
    STATE=${GLUSTER_STATE_DIR:-/run/snerd-test-gluster-ns}
    D_MOUNT_A=/mnt/snerd-test-na D_MOUNT_B=/mnt/snerd-test-nb D_VOL=snerd-test-ns
    D_BRICK_ROOT=/var/lib/snerd-test-gluster-ns
    SOCK=$STATE/glusterd.socket
    CLI=(gluster --mode=script "--glusterd-sock=$SOCK" "--log-file=/var/log/glusterfs/snerd-test-ns-cli.log")
    RUNDIR=$STATE/run
else
    STATE=${GLUSTER_STATE_DIR:-/run/snerd-test-gluster}
    D_MOUNT_A=/mnt/snerd-test-a D_MOUNT_B=/mnt/snerd-test-b D_VOL=snerd-test
    D_BRICK_ROOT=/var/lib/snerd-test-gluster
    CLI=(gluster --mode=script)
    RUNDIR=/var/run/gluster
fi
S_VOL="" S_MOUNT_A="" S_MOUNT_B="" S_BRICK_ROOT=""
if [ -r "$STATE/env" ]; then
    while IFS='=' read -r k v; do
        case $k in
            VOL) S_VOL=$v ;; MOUNT_A) S_MOUNT_A=$v ;; MOUNT_B) S_MOUNT_B=$v ;;
            BRICK_ROOT) S_BRICK_ROOT=$v ;;
        esac
    done <"$STATE/env"
fi
MOUNT_A=${S_MOUNT_A:-${GLUSTER_MOUNT_A:-$D_MOUNT_A}}
MOUNT_B=${S_MOUNT_B:-${GLUSTER_MOUNT_B:-$D_MOUNT_B}}
VOL=${S_VOL:-${GLUSTER_VOLUME:-$D_VOL}}
BRICK_ROOT=${S_BRICK_ROOT:-${GLUSTER_BRICK_ROOT:-$D_BRICK_ROOT}}

alive() { # pid [comm...]: running (not a zombie) and, when given, one of these comms
    local pid=$1 st c want; shift
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/stat" ] || return 1
    st=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ "$st" != Z ] || return 1
    [ $# -eq 0 ] && return 0
    c=$(cat "/proc/$pid/comm" 2>/dev/null)
    for want in "$@"; do [ "$c" = "$want" ] && return 0; done
    return 1
}
stop_pid() { # pid what comm...: TERM, up to 10 s, then KILL
    local pid=$1 what=$2; shift 2
    alive "$pid" "$@" || return 0
    log "stopping $what (pid $pid)"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do alive "$pid" "$@" || return 0; sleep 0.1; done
    log "$what (pid $pid) still there after 10 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null
    for _ in $(seq 1 50); do alive "$pid" "$@" || return 0; sleep 0.1; done
}
is_gluster_mount() { awk -v m="$1" '$2 == m && $3 == "fuse.glusterfs" {f=1} END {exit !f}' /proc/self/mounts; }

# 1. the mounts (a FUSE client exits by itself once unmounted)
for tag in a b; do
    mp=$MOUNT_A; [ $tag = b ] && mp=$MOUNT_B
    if is_gluster_mount "$mp"; then
        log "unmounting $mp"
        ok=0
        for _ in 1 2 3 4 5; do
            if umount "$mp" 2>/dev/null; then ok=1; break; fi
            sleep 1
        done
        [ $ok = 1 ] || { log "$mp busy: lazy unmount"; umount -l "$mp" || true; }
    fi
    pid=$(cat "$STATE/client-$tag.pid" 2>/dev/null || true)
    for _ in $(seq 1 50); do alive "$pid" glusterfs || break; sleep 0.1; done
    stop_pid "$pid" "glusterfs client $tag" glusterfs
    rm -f "$STATE/client-$tag.pid"
done

# 2. the volume, its brick, glusterd
gd_pid=$(cat "$STATE/glusterd.pid" 2>/dev/null || true)
ours=0
[ -e "$STATE/glusterd.ours" ] && alive "$gd_pid" glusterd && ours=1
volpids() { cat "$RUNDIR/vols/$VOL"/*.pid 2>/dev/null; }
PIDS=$(volpids)   # read before the stop
if timeout 20 "${CLI[@]}" volume info "$VOL" >/dev/null 2>&1; then
    if timeout 20 "${CLI[@]}" volume info "$VOL" | grep -q '^Status: Started'; then
        log "stopping volume $VOL"
        timeout 120 "${CLI[@]}" volume stop "$VOL" force >&2 || log "volume stop failed"
    fi
    if [ $PURGE = 1 ]; then
        log "deleting volume $VOL"
        timeout 120 "${CLI[@]}" volume delete "$VOL" >&2 || log "volume delete failed"
    fi
fi
if [ $ours = 1 ]; then
    stop_pid "$gd_pid" glusterd glusterd
    rm -f "$STATE/glusterd.pid" "$STATE/glusterd.ours"
elif [ -n "$gd_pid" ] && ! alive "$gd_pid"; then
    rm -f "$STATE/glusterd.pid" "$STATE/glusterd.ours"
fi
# a brick that outlived 'volume stop' (glusterd had died, say): only pids from gluster's own
# pid files for this volume, and only when no glusterd is left to manage them
if [ $ours = 1 ] || ! timeout 10 "${CLI[@]}" pool list >/dev/null 2>&1; then
    for pid in $PIDS $(volpids); do
        stop_pid "$pid" "brick of $VOL" glusterfsd glusterfs
    done
fi

if [ $PURGE = 1 ]; then
    log "removing the brick $BRICK_ROOT/$VOL"
    rm -rf "${BRICK_ROOT:?}/${VOL:?}"
    rm -f "$STATE/env"
fi
# 3. the network namespaces (SNERD_GLUSTER_NETNS=1): deleting one deletes its veth ends
if [ "$NETNS" = 1 ] && [ $PURGE = 1 ]; then
    for ns in $NS_A $NS_B $NS_SRV; do
        if [ -e "/run/netns/$ns" ]; then
            log "deleting network namespace $ns"
            ip netns del "$ns" || log "ip netns del $ns failed"
        fi
    done
    if ! alive "$(cat "$STATE/glusterd.pid" 2>/dev/null || true)" glusterd; then
        rm -rf "${BRICK_ROOT:?}/glusterd" "${STATE:?}/run"
        rm -f "$SOCK" "$STATE/glusterd.ours"
        rmdir "$BRICK_ROOT" "$STATE" 2>/dev/null || true
    fi
fi
log "down"
