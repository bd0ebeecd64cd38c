package tract

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// TestErrorSentinels checks the mapping of every wire code: an *Error and
// the gRPC status it travels as (once the client maps it back) match the
// sentinel of their code and no other.
func TestErrorSentinels(t *testing.T) {
	all := []error{ErrInvalidArgument, ErrBlobNotFound, ErrBlobExists, ErrPastEnd, ErrCorrupt, ErrUnavailable, ErrIO}
	for code := range tpb.ErrorCode_name {
		c := tpb.ErrorCode(code)
		if c == tpb.ErrorCode_OK {
			continue
		}
		want := sentinelOf(c)
		if want == nil {
			t.Errorf("code %v maps to no sentinel", c)
		}
		sent := errorf(c, "test").GRPCStatus().Err()
		got := fromWire(sent)
		var te *Error
		if !errors.As(got, &te) || te.Code != c || te.Message != "test" {
			t.Errorf("code %v: the client maps the wire's %v to %#v", c, sent, got)
		}
		for _, s := range all {
			if errors.Is(got, s) != (s == want) {
				t.Errorf("code %v: errors.Is(err, %v) = %v", c, s, errors.Is(got, s))
			}
		}
	}
	// Errors without a tract code are left alone.
	transport := status.Error(codes.Unavailable, "connection refused")
	if got := fromWire(transport); got != transport {
		t.Errorf("fromWire(%v) = %v", transport, got)
	}
}

// TestClientErrorsAreSentinels checks that what tractservers refuse,
// across real gRPC, reaches the client's caller as an error errors.Is
// matches to the tract sentinel, wrapped with what failed.
func TestClientErrorsAreSentinels(t *testing.T) {
	c := newTestCluster(t, 3, 3, testTractSize)
	cl := c.client()
	defer cl.Close()
	ctx := ctxT(t)

	g := putBlob(t, cl, randomTracts(2, 70), 0)
	if _, err := cl.CreateBlob(ctx, g, 0); !errors.Is(err, ErrBlobExists) {
		t.Fatalf("create an existing blob: %v, want ErrBlobExists", err)
	}
	b, err := cl.OpenBlob(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReadTract(ctx, 2); !errors.Is(err, ErrPastEnd) {
		t.Fatalf("read past the end: %v, want ErrPastEnd", err)
	}
	if err := cl.DeleteBlob(ctx, g); err != nil {
		t.Fatal(err)
	}
	// A deleted blob's tracts read as unwritten (empty); what needs the
	// blob says it is gone.
	for what, err := range map[string]error{
		"open":   func() error { _, err := cl.OpenBlob(ctx, g); return err }(),
		"delete": cl.DeleteBlob(ctx, g),
		"extend": func() error { _, err := b.Extend(ctx, 1); return err }(),
	} {
		if !errors.Is(err, ErrBlobNotFound) {
			t.Errorf("%s a deleted blob: %v, want ErrBlobNotFound", what, err)
		}
		if errors.Is(err, ErrBlobExists) || errors.Is(err, ErrUnavailable) {
			t.Errorf("%s a deleted blob: %v matches another sentinel", what, err)
		}
	}
}
