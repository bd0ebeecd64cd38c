# Arbor build, test and benchmark targets. `make test` is what CI runs.
GO ?= go
GOBIN := $(shell $(GO) env GOPATH 2>/dev/null)/bin
PROTOS := $(shell find internal -name '*.proto')
# Every Go file of the work tree, tracked or not (generated and vendored
# files included: they must be gofmt-clean too).
GOFILES = $(shell git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*')

# The version stamped into bin/arbor (see internal/buildinfo).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/arbor-storage/arbor/internal/buildinfo.version=$(VERSION)

# Where `make dev` keeps its cluster; DEV_FLAGS are extra `arbor dev` flags
# (e.g. DEV_FLAGS="--nodes 3 --faults fail=0.01").
DEV_DIR ?= /tmp/arbor
DEV_FLAGS ?=
# Where `make dev` mounts the file system "default" (empty: no mount).
DEV_MOUNT ?= /tmp/arbor-mnt

.PHONY: bench all build deps dev proto lint test test-short fuzz bench soak clean pjdfstest pjdfstest-nfs nfsfuse chaos chaos-ec

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/arbor ./cmd/arbor

deps:
	bash scripts/install-deps.sh

# Runs a local cluster in the foreground until Ctrl-C (see README.md).
dev: deps build
	./bin/arbor dev --dir $(DEV_DIR) $(if $(DEV_MOUNT),--mount $(DEV_MOUNT)) $(DEV_FLAGS)

# Runs pjdfstest (installed with cargo if missing) on a fresh dev cluster's
# mount; needs root. Not part of `make test` (it takes many minutes).
pjdfstest: build
	bash scripts/pjdfstest.sh

# The libnfs FUSE bridge (tools/nfsfuse): a mount through the libnfs NFS
# client library, for running POSIX tests through the NFS gateway; needs
# libnfs-dev and libfuse3-dev (scripts/install-deps.sh).
CC ?= cc
nfsfuse: bin/nfsfuse
bin/nfsfuse: tools/nfsfuse/nfsfuse.c
	@mkdir -p bin
	$(CC) -O2 -Wall -Wextra -Werror -o $@ $< $$(pkg-config --cflags --libs fuse3 libnfs)

# pjdfstest through NFSv3: a fresh dev cluster's gateway mounted with
# bin/nfsfuse (scripts/pjdfstest.sh --nfs); needs root. Not part of `make
# test`, like `make pjdfstest` (it takes many minutes).
pjdfstest-nfs: build nfsfuse
	bash scripts/pjdfstest.sh --nfs

# The whole-cluster nemesis (issue 13, internal/nemesis): a 5-node dev
# cluster with two FUSE mounts under a mixed workload, through CHAOS_CYCLES
# kill, restart, partition and slow/failing-RPC cycles, checked after each;
# about an hour for 100 cycles on 2 cores. Exits non-zero if anything was
# lost or a check failed. ARBOR_SEED replays a run's choices; needs FUSE.
# `make test` runs two cycles (TestNemesis).
CHAOS_DIR ?= /tmp/arbor-chaos
CHAOS_CYCLES ?= 100
chaos: deps build
	-fusermount3 -uz $(CHAOS_DIR)/mnt1 2>/dev/null; fusermount3 -uz $(CHAOS_DIR)/mnt2 2>/dev/null
	rm -rf $(CHAOS_DIR)
	./bin/arbor debug nemesis --dir $(CHAOS_DIR) --cycles $(CHAOS_CYCLES) --log-level warn $(if $(ARBOR_SEED),--seed $(ARBOR_SEED))

# The same on 7 nodes whose file system and blobs are ec:5+2 (rows of 7,
# 5 directory voters, 5-replica metadata): kills of any two nodes stay
# within what the data and the metadata survive.
CHAOS_EC_DIR ?= /tmp/arbor-chaos-ec
chaos-ec: deps build
	-fusermount3 -uz $(CHAOS_EC_DIR)/mnt1 2>/dev/null; fusermount3 -uz $(CHAOS_EC_DIR)/mnt2 2>/dev/null
	rm -rf $(CHAOS_EC_DIR)
	./bin/arbor debug nemesis --dir $(CHAOS_EC_DIR) --nodes 7 --data ec:5+2 --cycles $(CHAOS_CYCLES) --log-level warn $(if $(ARBOR_SEED),--seed $(ARBOR_SEED))

# Regenerates the committed protobuf code; needs protoc and the plugins that
# scripts/install-deps.sh installs. A normal build needs only Go.
proto:
	PATH=$(GOBIN):$$PATH protoc -I . \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		$(PROTOS)

lint:
	@test -z "$$(gofmt -l $(GOFILES))" || (echo "gofmt needed:"; gofmt -l $(GOFILES); exit 1)
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...

# Cluster tests run the bin/arbor just built (ARBOR_BINARY) instead of
# building their own.
test: deps lint build
	ARBOR_BINARY=$(CURDIR)/bin/arbor $(GO) test -count=1 -timeout 25m ./...
	$(MAKE) test-extra

# What `make test` adds to the plain run (issue 13 item 7), about a minute
# and a half on 2 loaded cores: the fs tests again over the real B-tree on
# its in-memory page store; the race detector on the packages where it
# fits (retry, testseed, the raft engine, the extent store's short tests);
# the directory with its invariants checked after every command. The
# directory's and the B-tree's full runs under -race take minutes each:
# test-race. The B-tree under invariants: test-invariants.
.PHONY: test-extra test-race test-invariants
test-extra:
	ARBOR_FS_META=btree $(GO) test -count=1 ./internal/fs/
	$(GO) test -count=1 -race ./internal/retry/ ./internal/testseed/ ./internal/raftengine/...
	$(GO) test -count=1 -race -short ./internal/extent/
	$(GO) test -count=1 -tags invariants ./internal/directory/...

test-race:
	$(GO) test -count=1 -race -timeout 30m ./internal/retry/ ./internal/testseed/ ./internal/raftengine/... ./internal/directory/... ./internal/extent/... ./internal/btree/...

# The expensive self-checks (internal/invariants): the directory checks its
# state after every command and a B-tree checks itself after every commit,
# so the million-key load shrinks to 3,000 keys. About four minutes.
test-invariants:
	ARBOR_BTREE_MILLION=3000 $(GO) test -count=1 -tags invariants -timeout 30m ./internal/directory/... ./internal/btree/...

test-short: build
	ARBOR_BINARY=$(CURDIR)/bin/arbor $(GO) test -count=1 -short ./...

clean:
	rm -rf bin

# Benchmarks (bench/): each measures a reference in the same run and
# reports the ratio. BENCH narrows the set (a -bench regexp).
BENCH ?= .
bench: build
	bash scripts/install-deps.sh --bench
	ARBOR_BINARY=$(CURDIR)/bin/arbor $(GO) test ./bench/ -run '^$$' -bench '$(BENCH)' -benchtime 3s -count 1 -timeout 180m

# Full-size runs that `make test` does small: the tract store's cluster
# tests (a 1 GiB blob put and got back, kill -9 recovery, growth and
# balance over a few GiB) and the B-tree's million keys and ten-round
# model tests. They take many minutes on 2 cores.
.PHONY: test-long
test-long: build
	ARBOR_LONG=1 ARBOR_BINARY=$(CURDIR)/bin/arbor $(GO) test -count=1 -timeout 60m -run '^TestCluster' -v ./internal/tract/
	ARBOR_BTREE_MILLION=1 BTREE_MODEL_ROUNDS=10 $(GO) test -count=1 -timeout 60m -run 'TestMillionKeys|TestModel' -v ./internal/btree/...
