package fs

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// inlineEnv is a file system and helpers to write and read small files
// the way a client does (fsclient's commitInline and blockData).
type inlineEnv struct {
	*env
	f   *FS
	ctx context.Context
	rng *rand.Rand
}

func newInlineEnv(t *testing.T) *inlineEnv {
	e := newEnv(t, 64<<10)
	return &inlineEnv{env: e, f: e.open(0), ctx: WithSession(context.Background(), 1), rng: rand.New(rand.NewPCG(1, 2))}
}

func (ie *inlineEnv) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(ie.rng.Uint32())
	}
	return b
}

// write commits data as file h's inline first block, its size len(data).
func (ie *inlineEnv) write(h Handle, data []byte) error {
	st, refs, err := ie.f.FileBlocks(ie.ctx, h, []uint64{0})
	if err != nil {
		return err
	}
	_, err = ie.f.CommitBlocks(ie.ctx, h, st.Blob, []NewBlock{{Start: 0, Tract: ie.rng.Uint64(), Length: uint64(len(data)), Base: refs[0], Inline: data}},
		Commit{Size: uint64(len(data)), Mtime: time.Now().UnixNano()})
	return err
}

// readFile returns file h's data (its first block) as f sees it.
func readFile(t *testing.T, ctx context.Context, f *FS, h Handle) []byte {
	t.Helper()
	st, refs, err := f.FileBlocks(ctx, h, []uint64{0})
	if err != nil {
		t.Fatal(err)
	}
	if !refs[0].Found {
		return make([]byte, st.Size)
	}
	if refs[0].Inline == nil {
		t.Fatalf("block 0 of %v is not inline", h)
	}
	out := make([]byte, st.Size)
	copy(out, refs[0].Inline)
	return out
}

// chunkKeys counts the inline chunk keys of the file system, all versions.
func (ie *inlineEnv) chunkKeys() int {
	ie.t.Helper()
	n := 0
	from, to := ie.f.keys.fsRange()
	err := ie.meta.Scan(context.Background(), from, to, func(k, _ []byte) error {
		if isTableRecord(k) {
			return nil
		}
		prefix, _, err := splitVersion(k)
		if err != nil {
			return nil // not an object's key
		}
		if kind, _, err := objectKind(prefix); err == nil && kind == kindInline {
			n++
		}
		return nil
	})
	if err != nil {
		ie.t.Fatal(err)
	}
	return n
}

func (ie *inlineEnv) check(f *FS) *CheckReport {
	ie.t.Helper()
	r, err := f.Check(context.Background(), CheckOptions{Data: true})
	if err != nil {
		ie.t.Fatal(err)
	}
	if !r.OK() {
		ie.t.Fatalf("check: %v", r.Problems)
	}
	return r
}

// TestInlineChunks writes small files of every size next to the edges of
// inline data (the pair's part, each chunk, MaxInlineBytes) and reads
// them back; rewrites in place and truncates; and checks the chunk keys
// left behind are exactly those of the live data.
func TestInlineChunks(t *testing.T) {
	ie := newInlineEnv(t)
	var sizes []int
	for _, edge := range []int{1, InlineChunkBytes, 2 * InlineChunkBytes, 3 * InlineChunkBytes, 4 * InlineChunkBytes, MaxInlineBytes} {
		sizes = append(sizes, edge-1, edge, edge+1)
	}
	want, inline := 0, 0
	for _, n := range sizes {
		a := must[Attr](t)(ie.f.Create(ie.ctx, RootHandle, fmt.Sprintf("f%d", n), 0o644, Cred{}))
		data := ie.bytes(n)
		err := ie.write(a.Handle, data)
		if n > MaxInlineBytes {
			wantErrno(t, err, syscall.EINVAL)
			continue
		}
		if n == 0 {
			wantErrno(t, err, syscall.EINVAL) // an empty block is no block
			continue
		}
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		want += int(inlineChunks(uint64(n)))
		inline++
		if got := readFile(t, ie.ctx, ie.f, a.Handle); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes inline: read back differs", n)
		}
	}
	if got := ie.chunkKeys(); got != want {
		t.Fatalf("%d chunk keys, want %d", got, want)
	}
	r := ie.check(ie.f)
	if r.Inline != inline || r.Tracts != 0 {
		t.Fatalf("check counts %d inline blocks and %d tracts, want %d and 0", r.Inline, r.Tracts, inline)
	}

	// Rewrite in place, smaller and larger, then truncate down and to 0.
	a := must[Attr](t)(ie.f.Create(ie.ctx, RootHandle, "g", 0o644, Cred{}))
	base := ie.chunkKeys()
	last := MaxInlineBytes - InlineChunkBytes/2 // with a chunk or more
	for _, n := range []int{MaxInlineBytes, 5000, MaxInlineBytes - 1, 100, last} {
		data := ie.bytes(n)
		if err := ie.write(a.Handle, data); err != nil {
			t.Fatal(err)
		}
		// A write of a file as large or larger keeps its size; compare
		// what the file holds.
		got := readFile(t, ie.ctx, ie.f, a.Handle)
		if !bytes.Equal(got[:n], data) {
			t.Fatalf("rewrite to %d bytes: read back differs", n)
		}
	}
	// The block is its last write, the size the largest.
	if got, want := ie.chunkKeys()-base, int(inlineChunks(uint64(last))); got != want {
		t.Fatalf("after rewrites: %d chunk keys of g, want %d", got, want)
	}
	for _, n := range []uint64{uint64(last) - 1000, InlineChunkBytes + 1, InlineChunkBytes, 10, 0} {
		before := readFile(t, ie.ctx, ie.f, a.Handle)
		at := must[Attr](t)(ie.f.SetAttr(ie.ctx, a.Handle, SetAttrIn{Valid: SetSize, Size: n}))
		if at.Size != n {
			t.Fatalf("truncate to %d: size %d", n, at.Size)
		}
		if got := readFile(t, ie.ctx, ie.f, a.Handle); !bytes.Equal(got, before[:n]) {
			t.Fatalf("truncate to %d: read back differs", n)
		}
		if got, want := ie.chunkKeys()-base, int(inlineChunks(n)); got != want {
			t.Fatalf("after truncate to %d: %d chunk keys of g, want %d", n, got, want)
		}
	}
	ie.check(ie.f)

	// Unlinked, a small file leaves no chunk.
	for _, n := range sizes {
		if err := ie.f.Unlink(ie.ctx, RootHandle, fmt.Sprintf("f%d", n)); err != nil {
			t.Fatal(err)
		}
	}
	if got := ie.chunkKeys(); got != 0 {
		t.Fatalf("%d chunk keys after every file went", got)
	}
	ie.check(ie.f)
}

// TestInlineChunksSnapshot: a snapshot keeps a small file's data while
// the live file is rewritten, truncated and removed (the chunks are
// copied on write with their pair), and deleting the snapshot leaves only
// the live chunks.
func TestInlineChunksSnapshot(t *testing.T) {
	ie := newInlineEnv(t)
	a := must[Attr](t)(ie.f.Create(ie.ctx, RootHandle, "f", 0o644, Cred{}))
	b := must[Attr](t)(ie.f.Create(ie.ctx, RootHandle, "g", 0o644, Cred{}))
	old := ie.bytes(MaxInlineBytes)
	oldG := ie.bytes(2*InlineChunkBytes + 7)
	if err := ie.write(a.Handle, old); err != nil {
		t.Fatal(err)
	}
	if err := ie.write(b.Handle, oldG); err != nil {
		t.Fatal(err)
	}
	if err := ie.f.CreateSnapshot(ie.ctx, 1, "one"); err != nil {
		t.Fatal(err)
	}
	snap := ie.open(1)
	// The live file rewritten smaller, then larger; the other truncated
	// into its first chunk, then removed.
	if err := ie.write(a.Handle, ie.bytes(5000)); err != nil {
		t.Fatal(err)
	}
	live := ie.bytes(MaxInlineBytes)
	if err := ie.write(a.Handle, live); err != nil {
		t.Fatal(err)
	}
	must[Attr](t)(ie.f.SetAttr(ie.ctx, b.Handle, SetAttrIn{Valid: SetSize, Size: InlineChunkBytes + 100}))
	if got := readFile(t, ie.ctx, ie.f, b.Handle); !bytes.Equal(got, oldG[:InlineChunkBytes+100]) {
		t.Fatal("truncated live file differs")
	}
	if got := readFile(t, ie.ctx, snap, b.Handle); !bytes.Equal(got, oldG) {
		t.Fatal("the snapshot's file changed with the live truncate")
	}
	if err := ie.f.Unlink(ie.ctx, RootHandle, "g"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, ie.ctx, ie.f, a.Handle); !bytes.Equal(got, live) {
		t.Fatal("live file differs")
	}
	if got := readFile(t, ie.ctx, snap, a.Handle); !bytes.Equal(got, old) {
		t.Fatal("the snapshot's file changed with the live rewrite")
	}
	if got := readFile(t, ie.ctx, snap, b.Handle); !bytes.Equal(got, oldG) {
		t.Fatal("the snapshot's removed file changed")
	}
	if got, want := ie.chunkKeys(), 2*int(inlineChunks(MaxInlineBytes))+int(inlineChunks(uint64(len(oldG)))); got != want {
		t.Fatalf("%d chunk keys with the snapshot, want %d", got, want)
	}
	ie.check(ie.f)
	if _, err := ie.f.DeleteSnapshot(ie.ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got, want := ie.chunkKeys(), int(inlineChunks(MaxInlineBytes)); got != want {
		t.Fatalf("%d chunk keys after the snapshot went, want %d", got, want)
	}
	if r := ie.check(ie.f); r.Garbage != 0 {
		t.Fatalf("%d garbage versions after the snapshot went", r.Garbage)
	}
	if got := readFile(t, ie.ctx, ie.f, a.Handle); !bytes.Equal(got, live) {
		t.Fatal("live file differs after the snapshot went")
	}
}

// TestCheckFindsBrokenInlineChunks: fsck reports a missing chunk, a chunk
// of the wrong length and a chunk no inline block owns.
func TestCheckFindsBrokenInlineChunks(t *testing.T) {
	for _, c := range []struct {
		name    string
		breakIt func(ie *inlineEnv, h Handle, s uint64) error
		want    func(r *CheckReport) int
	}{
		{"missing", func(ie *inlineEnv, h Handle, s uint64) error {
			return ie.meta.Update(context.Background(), func(tx MetaTxn) error {
				return tx.Delete(versioned(ie.f.keys.inlineChunk(h, 2), s))
			})
		}, func(r *CheckReport) int { return r.Lost }},
		{"short", func(ie *inlineEnv, h Handle, s uint64) error {
			return ie.meta.Update(context.Background(), func(tx MetaTxn) error {
				return tx.Put(versioned(ie.f.keys.inlineChunk(h, 1), s), encodeVersioned(0, []byte("short")))
			})
		}, func(r *CheckReport) int { return r.Lost }},
		{"orphan", func(ie *inlineEnv, h Handle, s uint64) error {
			return ie.meta.Update(context.Background(), func(tx MetaTxn) error {
				return tx.Put(versioned(ie.f.keys.inlineChunk(h, maxInlineChunks+1), s), encodeVersioned(0, []byte("nobody's")))
			})
		}, func(r *CheckReport) int { return r.Leaked }},
	} {
		t.Run(c.name, func(t *testing.T) {
			ie := newInlineEnv(t)
			a := must[Attr](t)(ie.f.Create(ie.ctx, RootHandle, "f", 0o644, Cred{}))
			if err := ie.write(a.Handle, ie.bytes(MaxInlineBytes)); err != nil {
				t.Fatal(err)
			}
			ie.check(ie.f)
			_, refs, err := ie.f.FileBlocks(ie.ctx, a.Handle, []uint64{0})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.breakIt(ie, a.Handle, refs[0].S); err != nil {
				t.Fatal(err)
			}
			r, err := ie.f.Check(context.Background(), CheckOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.OK() || c.want(r) != 1 {
				t.Fatalf("check after a %s chunk: %+v", c.name, r)
			}
			if c.name != "orphan" {
				// The file's data is not handed out half read.
				if _, _, err := ie.f.FileBlocks(ie.ctx, a.Handle, []uint64{0}); err == nil {
					t.Fatalf("FileBlocks of a file with a %s chunk succeeded", c.name)
				}
			}
		})
	}
}
