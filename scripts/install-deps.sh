#!/usr/bin/env bash
# Installs everything Arbor's build, tests and benchmarks need on a fresh
# Debian machine. Idempotent: safe to run again.
set -euo pipefail

need_apt=()
for pkg in fuse3 fio libnfs-utils protobuf-compiler; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

gobin="$(go env GOPATH)/bin"
install_go_tool() { # name module@version
  [ -x "$gobin/$1" ] || go install "$2"
}
install_go_tool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2
install_go_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
install_go_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
