#!/usr/bin/env bash
# Installs everything Arbor's build, tests and benchmarks need on a fresh
# Debian machine: apt packages, Go tools, Go modules. Idempotent and quick
# when everything is there; needs no input (safe in CI without stdin).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: the go command is missing; install Go 1.21 or newer (go.mod selects the exact toolchain)" >&2
  exit 1
fi

# chromium-headless-shell: the dashboard's browser test (internal/ui).
# libnfs-dev, libfuse3-dev, gcc, pkg-config: the libnfs FUSE bridge
# (tools/nfsfuse, `make nfsfuse`) that mounts the NFS gateway.
pkgs=(fuse3 fio libnfs-utils protobuf-compiler chromium-headless-shell libnfs-dev libfuse3-dev gcc pkg-config)
# --bench adds what only the benchmarks need: the Linux source tarball the
# untar benchmark extracts (bench/fs_test.go).
[ "${1:-}" = "--bench" ] && pkgs+=(linux-source-6.1 xz-utils)

need_apt=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-deps: apt packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo -n"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" </dev/null
fi

gobin="$(go env GOPATH)/bin"
install_go_tool() { # name module@version
  if [ ! -x "$gobin/$1" ]; then
    echo "install-deps: go install $2"
    go install "$2"
  fi
}
install_go_tool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2
install_go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
install_go_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2

go mod download
