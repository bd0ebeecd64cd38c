package fs

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCheckCountsLostData: fsck tells acknowledged data that is gone (a
// tract shorter than its block, a blob missing under referenced tracts)
// from other problems, so a checker can count it as loss without reading
// the text.
func TestCheckCountsLostData(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 64<<10)
	f := e.open(0)
	a := must[Attr](t)(f.Create(ctx, RootHandle, "short", 0o644, Cred{}))
	writeTract(t, f, e.data, a, 0, bytes.Repeat([]byte("s"), 3000))
	b := must[Attr](t)(f.Create(ctx, RootHandle, "gone", 0o644, Cred{}))
	writeTract(t, f, e.data, b, 0, bytes.Repeat([]byte("g"), 3000))
	if rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{})); !rep.OK() || rep.Lost != 0 {
		t.Fatalf("check before any loss: lost %d, %v", rep.Lost, rep.Problems)
	}

	if err := e.data.WriteTract(ctx, a.Blob, 0, []byte("cut")); err != nil {
		t.Fatal(err)
	}
	if err := e.data.DeleteBlob(ctx, b.Blob); err != nil {
		t.Fatal(err)
	}
	rep := must[*CheckReport](t)(f.Check(ctx, CheckOptions{}))
	if rep.OK() || rep.Lost != 2 || rep.ProblemCount() != 2 || len(rep.LostData) != 2 {
		t.Fatalf("check after two losses: lost %d of %d problems, lost data %q", rep.Lost, rep.ProblemCount(), rep.LostData)
	}
	joined := strings.Join(rep.LostData, "\n")
	if !strings.Contains(joined, a.Blob.String()) || !strings.Contains(joined, b.Blob.String()) {
		t.Fatalf("lost data %q does not name both blobs", rep.LostData)
	}
}
