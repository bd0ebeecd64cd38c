#!/usr/bin/env bash
# Untars TAR into the FUSE mount of a fresh 5-node `arbor dev` (3 replicas)
# under DIR, then `sync -f`, and prints the wall time, the load average
# before and after, the CPU the nodes and the mount used, and per entry of
# TAR: the RPCs the nodes served (arbor_rpc_server_handled_total, by
# method), the metadata servers' B-tree counters (arbor_btree_*, with
# the page bytes they sent and what page deltas saved) and their group
# commits; and the bytes the nodes wrote (sockets and files). The cluster is stopped afterwards (KEEP=1 keeps it).
# Several may run at once with different DIRs (before and after a change,
# sharing the machine's load), as in BENCHMARKS.md.
# Usage: scripts/untar-rpcs.sh DIR ARBOR_BINARY TAR
# e.g.:  tar -cf /tmp/sub.tar -C /tmp linux-source-6.1/fs linux-source-6.1/include
#        scripts/untar-rpcs.sh /tmp/u1 bin/arbor /tmp/sub.tar
set -euo pipefail

if [ $# -ne 3 ]; then
	echo "usage: $0 DIR ARBOR_BINARY TAR" >&2
	exit 2
fi
D=$(realpath -m "$1") BIN=$(realpath "$2") TAR=$(realpath "$3")
M=$D-mnt
rm -rf "$D"
mkdir -p "$D" "$M"
setsid "$BIN" dev --dir "$D" --mount "$M" --log-level warn >"$D.log" 2>&1 &
dev=$!
stop() { [ -n "${KEEP:-}" ] || kill -INT "$dev" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq 180); do
	grep -q "mounted at" "$D.log" && break
	kill -0 "$dev" || { cat "$D.log" >&2; exit 1; }
	sleep 1
done
grep -q "mounted at" "$D.log" || { echo "no mount after 3 minutes" >&2; exit 1; }

scrape() {
	for a in $(python3 -c "import json,sys; print(' '.join(n['http_addr'] for n in json.load(open(sys.argv[1]))['nodes']))" "$D/dev.json"); do
		curl -s "http://$a/metrics"
	done >"$1"
}
# CPU ticks of the nodes and of arbor dev (which serves the mount).
cpu() {
	for p in $(pgrep -f -- "--data-dir=$D/") "$dev"; do
		awk '{print $14 + $15}' "/proc/$p/stat"
	done | paste -sd+ | bc
}

# Bytes the nodes wrote with write system calls (wchar: sockets, so Raft
# and gRPC traffic, and files, so pebble's WAL and tables).
wchar() {
	for p in $(pgrep -f -- "--data-dir=$D/"); do
		awk '/^wchar:/ {print $2}' "/proc/$p/io"
	done | paste -sd+ | bc
}

scrape "$D.before"
cpu0=$(cpu) wchar0=$(wchar) load0=$(cut -d' ' -f1-3 /proc/loadavg) t0=$(date +%s.%N)
tar -xf "$TAR" -C "$M"
sync -f "$M"
t1=$(date +%s.%N) cpu1=$(cpu) wchar1=$(wchar) load1=$(cut -d' ' -f1-3 /proc/loadavg)
scrape "$D.after"
entries=$(tar -tf "$TAR" | wc -l)
printf '%s: %d entries in %.1f s (%.1f/s); load average %s -> %s; CPU of the nodes and the mount %.1f s; the nodes wrote %.1f MB (%.1f KB per entry)\n' \
	"$D" "$entries" "$(echo "$t1 - $t0" | bc)" "$(echo "$entries / ($t1 - $t0)" | bc -l)" "$load0" "$load1" \
	"$(echo "($cpu1 - $cpu0) / $(getconf CLK_TCK)" | bc -l)" \
	"$(echo "($wchar1 - $wchar0) / 1000000" | bc -l)" "$(echo "($wchar1 - $wchar0) / 1000 / $entries" | bc -l)"
python3 - "$D.before" "$D.after" "$entries" <<'EOF'
import collections, re, sys

def load(path):
    c = collections.Counter()
    for line in open(path):
        m = re.match(r'arbor_rpc_server_handled_total\{code="[^"]*",method="([^"]*)"\} (\S+)', line)
        if m:
            c[m.group(1)] += float(m.group(2))
            continue
        m = re.match(r'(arbor_btree_\w+_total|arbor_meta_commits_total|arbor_meta_committed_operations_total) (\S+)', line)
        if m:
            c[m.group(1)] += float(m.group(2))
    return c

a, b, n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
d = {k: b[k] - a.get(k, 0) for k in b}
rpcs = {k: v for k, v in d.items() if k.startswith('/')}
print('per entry:')
for k, v in sorted(rpcs.items(), key=lambda x: -x[1]):
    if v / n >= 0.01:
        print(f'  {k:60s} {v / n:6.2f}')
print(f'  {"all RPCs":60s} {sum(rpcs.values()) / n:6.2f}')
for k, v in sorted(d.items()):
    if not k.startswith('/') and v:
        print(f'  {k:60s} {v / n:6.2f}')
EOF
