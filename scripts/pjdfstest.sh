#!/usr/bin/env bash
# Runs pjdfstest (the Rust port, from crates.io) on a fresh 5-node dev
# cluster's file system "default", mounted one of two ways:
#   (default) the FUSE mount of `arbor dev --mount`, with scripts/pjdfstest.toml;
#   --nfs     through the cluster's first NFSv3 gateway by tools/nfsfuse (a
#             FUSE bridge whose NFS side is the libnfs client library,
#             passing each caller's uid, gid and groups as the AUTH_SYS
#             credential), with scripts/pjdfstest-nfs.toml.
# Needs root (pjdfstest changes users and creates device nodes), cargo, a
# local user named "tests" (created here), and for --nfs libnfs-dev and
# libfuse3-dev (scripts/install-deps.sh) and bin/nfsfuse (`make nfsfuse`).
# Usage: scripts/pjdfstest.sh [--nfs] [extra pjdfstest args];
# `make pjdfstest`, `make pjdfstest-nfs`.
set -euo pipefail

cd "$(dirname "$0")/.."
nfs=
if [ "${1:-}" = --nfs ]; then
	nfs=1
	shift
fi
me="pjdfstest.sh${nfs:+ --nfs}"
config="${PJDFSTEST_CONFIG:-$PWD/scripts/pjdfstest${nfs:+-nfs}.toml}"
bridge="${NFSFUSE_BINARY:-$PWD/bin/nfsfuse}"
arbor="${ARBOR_BINARY:-./bin/arbor}"
export PATH="$HOME/.cargo/bin:/root/.cargo/bin:$PATH"

if ! command -v pjdfstest >/dev/null; then
	if ! command -v cargo >/dev/null; then
		echo "$me: cargo is needed to install pjdfstest (apt-get install cargo, or rustup)" >&2
		exit 1
	fi
	cargo install --locked pjdfstest || cargo install pjdfstest
fi
if ! id tests >/dev/null 2>&1; then
	useradd --no-create-home tests
fi
if [ -n "$nfs" ] && [ ! -x "$bridge" ]; then
	echo "$me: $bridge missing: make nfsfuse" >&2
	exit 1
fi

work=$(mktemp -d /tmp/arbor-pjdfstest${nfs:+-nfs}.XXXXXX)
# The "tests" user must reach the mount point.
chmod 0755 "$work"
mnt="$work/mnt"
log="$work/dev.log"
bridge_pid=
cleanup() {
	cd /
	if [ -n "$nfs" ]; then
		fusermount3 -uz "$mnt" 2>/dev/null || true
	fi
	if [ -n "$bridge_pid" ]; then
		kill "$bridge_pid" 2>/dev/null || true
		wait "$bridge_pid" 2>/dev/null || true
	fi
	kill -INT "$dev" 2>/dev/null || true
	wait "$dev" 2>/dev/null || true
	rm -rf "$work"
}

# wait_for PID SECONDS WHAT COMMAND...: polls COMMAND each second until it
# succeeds; fails, showing the log of WHAT, if PID exits or time runs out.
wait_for() {
	local pid=$1 secs=$2 what=$3
	shift 3
	for _ in $(seq 1 "$secs"); do
		if "$@"; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "$me: $what exited:" >&2
			break
		fi
		sleep 1
	done
	"$@" && return 0
	echo "$me: no $what after $secs s" >&2
	return 1
}

if [ -n "$nfs" ]; then
	mkdir "$mnt"
	"$arbor" dev --dir "$work/cluster" --log-level=warn >"$log" 2>&1 &
	dev=$!
	trap cleanup EXIT
	wait_for "$dev" 300 "arbor dev" grep -q "running until" "$log" || { cat "$log" >&2; exit 1; }
	"$arbor" fs create default --dir "$work/cluster" >/dev/null
	port=$(head -1 "$work/cluster/nfs" | cut -d: -f2)
	# -f: in the foreground, so this script owns (and stops) the bridge.
	"$bridge" -f "nfs://127.0.0.1/default?nfsport=$port&mountport=$port" "$mnt" >"$work/nfsfuse.log" 2>&1 &
	bridge_pid=$!
	wait_for "$bridge_pid" 60 nfsfuse grep -q " $mnt fuse" /proc/mounts || { cat "$work/nfsfuse.log" >&2; exit 1; }
	where="NFS gateway 127.0.0.1:$port; cluster log: $log"
else
	"$arbor" dev --dir "$work/cluster" --mount "$mnt" --log-level=warn >"$log" 2>&1 &
	dev=$!
	trap cleanup EXIT
	wait_for "$dev" 300 "arbor dev mount" grep -q "mounted at $mnt" "$log" || { cat "$log" >&2; exit 1; }
	where="cluster log: $log"
fi

# pjdfstest needs a directory the "tests" user can enter.
chmod 0755 "$mnt"
echo "$me: running pjdfstest on $mnt ($where)"
cd "$mnt"
status=0
pjdfstest -c "$config" -p "$mnt" "$@" || status=$?
exit "$status"
