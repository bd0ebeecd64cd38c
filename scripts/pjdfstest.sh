#!/usr/bin/env bash
# Runs pjdfstest (the Rust port, from crates.io) on an Arbor mount: a
# fresh 5-node dev cluster with the file system "default" mounted, then
# `pjdfstest -p MOUNT`. Needs root (pjdfstest changes users and creates
# device nodes), cargo, and a local user named "tests" (created here).
# Usage: scripts/pjdfstest.sh [extra pjdfstest args]; `make pjdfstest`.
set -euo pipefail

cd "$(dirname "$0")/.."
config="${PJDFSTEST_CONFIG:-$PWD/scripts/pjdfstest.toml}"
export PATH="$HOME/.cargo/bin:/root/.cargo/bin:$PATH"

if ! command -v pjdfstest >/dev/null; then
	if ! command -v cargo >/dev/null; then
		echo "pjdfstest.sh: cargo is needed to install pjdfstest (apt-get install cargo, or rustup)" >&2
		exit 1
	fi
	cargo install --locked pjdfstest || cargo install pjdfstest
fi
if ! id tests >/dev/null 2>&1; then
	useradd --no-create-home tests
fi

work=$(mktemp -d /tmp/arbor-pjdfstest.XXXXXX)
# The "tests" user must reach the mount point.
chmod 0755 "$work"
mnt="$work/mnt"
log="$work/dev.log"
"${ARBOR_BINARY:-./bin/arbor}" dev --dir "$work/cluster" --mount "$mnt" --log-level=warn >"$log" 2>&1 &
dev=$!
cleanup() {
	cd /
	kill -INT "$dev" 2>/dev/null || true
	wait "$dev" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

for _ in $(seq 1 300); do
	if grep -q "mounted at $mnt" "$log"; then
		break
	fi
	if ! kill -0 "$dev" 2>/dev/null; then
		echo "pjdfstest.sh: arbor dev exited:" >&2
		cat "$log" >&2
		exit 1
	fi
	sleep 1
done
grep -q "mounted at $mnt" "$log" || { echo "pjdfstest.sh: no mount after 300 s" >&2; cat "$log" >&2; exit 1; }

# pjdfstest needs a directory the "tests" user can enter.
chmod 0755 "$mnt"
echo "pjdfstest.sh: running pjdfstest on $mnt (cluster log: $log)"
cd "$mnt"
status=0
pjdfstest -c "$config" -p "$mnt" "$@" || status=$?
exit "$status"
