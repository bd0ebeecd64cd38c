package meta

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
)

// TestRequestsThatCannotBeSentFailAtOnce checks that a request gRPC
// refuses to encode (a name that is not UTF-8: the wire's names are
// protobuf strings) is answered EINVAL at once, in words, instead of being
// retried until the caller's deadline as if no server had answered.
func TestRequestsThatCannotBeSentFailAtOnce(t *testing.T) {
	c := newTestCluster(t, 1)
	x := c.newFS("wire")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cred := fs.Cred{}
	start := time.Now()
	_, err := x.FS().Create(ctx, fs.RootHandle, "bad\xffname", 0o644, cred)
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("create a name that is not UTF-8: %v, want EINVAL", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the refusal took %v: it was retried", took)
	}
	if msg := err.Error(); strings.Contains(msg, "rpc error") || strings.Contains(msg, "code = ") {
		t.Errorf("error text %q carries gRPC's wrapping", msg)
	}
	// The file system still works, and a good name is created.
	if _, err := x.FS().Create(ctx, fs.RootHandle, "good", 0o644, cred); err != nil {
		t.Fatal(err)
	}
}
