#!/usr/bin/env bash
# Runs pjdfstest (the Rust port, from crates.io) through NFSv3: a fresh
# 5-node dev cluster, the file system "default" mounted through its first
# NFS gateway by tools/nfsfuse (a FUSE bridge whose NFS side is the libnfs
# client library, passing each caller's uid, gid and groups as the AUTH_SYS
# credential), then `pjdfstest -p MOUNT` with scripts/pjdfstest-nfs.toml.
# Needs root, cargo, libnfs-dev and libfuse3-dev (scripts/install-deps.sh),
# and a local user named "tests" (created here).
# Usage: scripts/pjdfstest-nfs.sh [extra pjdfstest args]; `make pjdfstest-nfs`.
set -euo pipefail

cd "$(dirname "$0")/.."
config="${PJDFSTEST_CONFIG:-$PWD/scripts/pjdfstest-nfs.toml}"
bridge="${NFSFUSE_BINARY:-$PWD/bin/nfsfuse}"
export PATH="$HOME/.cargo/bin:/root/.cargo/bin:$PATH"

if ! command -v pjdfstest >/dev/null; then
	if ! command -v cargo >/dev/null; then
		echo "pjdfstest-nfs.sh: cargo is needed to install pjdfstest (apt-get install cargo, or rustup)" >&2
		exit 1
	fi
	cargo install --locked pjdfstest || cargo install pjdfstest
fi
if ! id tests >/dev/null 2>&1; then
	useradd --no-create-home tests
fi
[ -x "$bridge" ] || { echo "pjdfstest-nfs.sh: $bridge missing: make nfsfuse" >&2; exit 1; }

work=$(mktemp -d /tmp/arbor-pjdfstest-nfs.XXXXXX)
# The "tests" user must reach the mount point.
chmod 0755 "$work"
mnt="$work/mnt"
mkdir "$mnt"
log="$work/dev.log"
arbor="${ARBOR_BINARY:-./bin/arbor}"
"$arbor" dev --dir "$work/cluster" --log-level=warn >"$log" 2>&1 &
dev=$!
bridge_pid=
cleanup() {
	cd /
	fusermount3 -uz "$mnt" 2>/dev/null || true
	[ -n "$bridge_pid" ] && { kill "$bridge_pid" 2>/dev/null || true; wait "$bridge_pid" 2>/dev/null || true; }
	kill -INT "$dev" 2>/dev/null || true
	wait "$dev" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 1 300); do
	if grep -q "running until" "$log"; then
		break
	fi
	if ! kill -0 "$dev" 2>/dev/null; then
		echo "pjdfstest-nfs.sh: arbor dev exited:" >&2
		cat "$log" >&2
		exit 1
	fi
	sleep 1
done
grep -q "running until" "$log" || { echo "pjdfstest-nfs.sh: no cluster after 300 s" >&2; cat "$log" >&2; exit 1; }
"$arbor" fs create default --dir "$work/cluster" >/dev/null
port=$(head -1 "$work/cluster/nfs" | cut -d: -f2)

# -f: in the foreground, so this script owns (and stops) the bridge.
"$bridge" -f "nfs://127.0.0.1/default?nfsport=$port&mountport=$port" "$mnt" >"$work/nfsfuse.log" 2>&1 &
bridge_pid=$!
for _ in $(seq 1 60); do
	if grep -q " $mnt fuse" /proc/mounts; then
		break
	fi
	if ! kill -0 "$bridge_pid" 2>/dev/null; then
		echo "pjdfstest-nfs.sh: nfsfuse exited:" >&2
		cat "$work/nfsfuse.log" >&2
		exit 1
	fi
	sleep 1
done
grep -q " $mnt fuse" /proc/mounts || { echo "pjdfstest-nfs.sh: no NFS mount after 60 s" >&2; cat "$work/nfsfuse.log" >&2; exit 1; }

# pjdfstest needs a directory the "tests" user can enter.
chmod 0755 "$mnt"
echo "pjdfstest-nfs.sh: running pjdfstest on $mnt (NFS gateway 127.0.0.1:$port; cluster log: $log)"
cd "$mnt"
status=0
pjdfstest -c "$config" -p "$mnt" "$@" || status=$?
exit "$status"
