# Arbor build, test and benchmark targets. `make test` is what CI runs.
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
PROTOS := $(shell find internal -name '*.proto')

.PHONY: all build deps proto lint test test-short fuzz bench soak clean

all: build

build:
	$(GO) build -o bin/arbor ./cmd/arbor

deps:
	bash scripts/install-deps.sh

# Regenerates the committed protobuf code; needs protoc and the plugins that
# scripts/install-deps.sh installs. A normal build needs only Go.
proto:
	PATH=$(GOBIN):$$PATH protoc -I . \
		--go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative \
		$(PROTOS)

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...

test: lint build
	$(GO) test -count=1 -timeout 25m ./...

test-short: build
	$(GO) test -count=1 -short ./...

clean:
	rm -rf bin
