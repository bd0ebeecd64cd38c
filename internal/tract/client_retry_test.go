package tract

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// refusingDirectory answers GetTLT with a fixed error.
type refusingDirectory struct {
	fakeDirectory
	err error
}

func (d *refusingDirectory) GetTLT(context.Context, *dpb.GetTLTRequest) (*dpb.TLT, error) {
	return nil, d.err
}

// TestClientWaitsForTheFirstTLT: a client of a cluster whose directory has
// not installed a TLT yet, or does not answer, waits for one within its
// deadline (issue 13: a blob put right after arbor dev said ready failed
// "no TLT is installed"); a refusal that asking again cannot change fails
// at once.
func TestClientWaitsForTheFirstTLT(t *testing.T) {
	dir := newFakeDirectory()
	dir.down = true
	c, err := NewClient(ClientConfig{Directory: dir, Dial: nil})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		time.Sleep(100 * time.Millisecond)
		dir.mu.Lock()
		dir.down = false
		dir.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		dir.mu.Lock()
		dir.tlt = &dpb.TLT{Version: 1, TractSizeBytes: DefaultTractSizeBytes, Replication: 1,
			Rows: []*dpb.TLTRow{{Version: 1, Slots: []*dpb.TractServer{{NodeId: 1}}}}}
		dir.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tab, err := c.TLT(ctx)
	if err != nil {
		t.Fatalf("TLT while the cluster starts: %v", err)
	}
	if tab.Version != 1 {
		t.Fatalf("TLT version %d, want 1", tab.Version)
	}

	// Never installed: the caller's deadline ends the wait, and the error
	// says what was missing.
	never := newFakeDirectory()
	c2, err := NewClient(ClientConfig{Directory: never})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	sctx, scancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer scancel()
	if _, err := c2.TLT(sctx); err == nil || !strings.Contains(err.Error(), "no TLT is installed") {
		t.Fatalf("TLT of a cluster without one = %v", err)
	}

	// A refusal (a node of another cluster) fails at once.
	refused := &refusingDirectory{err: status.Error(codes.FailedPrecondition, "cluster check: wrong cluster")}
	c3, err := NewClient(ClientConfig{Directory: refused})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	start := time.Now()
	if _, err := c3.TLT(ctx); status.Code(errors.Unwrap(err)) != codes.FailedPrecondition {
		t.Fatalf("TLT refused = %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a refusal took %v", d)
	}
}
