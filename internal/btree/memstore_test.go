package btree

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// TestMemStoreMPSC checks the twin's contract: slots, conditional writes,
// atomicity, ownership, allocation and free, and the bounds.
func TestMemStoreMPSC(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore(1)
	g := Geometry{PageBytes: 64, PagesPerBlock: 4, Blocks: 4}
	if err := s.AddExtent(1, g); err != nil {
		t.Fatal(err)
	}
	if err := s.AddExtent(2, g); err != nil {
		t.Fatal(err)
	}
	free, err := s.FreeBlocks(ctx, 1, 8, 2)
	if err != nil || len(free) != 2 || free[0].Page != 8 {
		t.Fatalf("FreeBlocks near 8 = %+v, %v", free, err)
	}
	blk := PageRef{Extent: 1, Page: 8, Generation: free[0].Generation + 1, Tenant: 5}
	p9 := blk
	p9.Page = 9
	if _, _, err := s.Read(ctx, p9); !errors.Is(err, ErrStale) {
		t.Fatalf("read of an unallocated block: %v, want ErrStale", err)
	}
	if _, err := s.Commit(ctx, []Op{{Kind: OpAllocBlock, Ref: blk, Slot: free[0].Generation}, {Kind: OpWriteFresh, Ref: p9, Data: []byte("one")}}); err != nil {
		t.Fatal(err)
	}
	data, slot, err := s.Read(ctx, p9)
	if err != nil || string(data) != "one" || slot == 0 {
		t.Fatalf("read = %q %d %v", data, slot, err)
	}
	// The same block cannot be taken twice.
	if _, err := s.Commit(ctx, []Op{{Kind: OpAllocBlock, Ref: blk, Slot: free[0].Generation}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("second allocation: %v, want ErrConflict", err)
	}
	// A write at an old slot conflicts, and the whole commit fails.
	p10 := blk
	p10.Page = 10
	_, slot10, _ := s.Read(ctx, p10)
	if _, err := s.Commit(ctx, []Op{{Kind: OpWrite, Ref: p10, Slot: slot10, Data: []byte("x")}, {Kind: OpWrite, Ref: p9, Slot: slot - 1, Data: []byte("two")}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale slot: %v, want ErrConflict", err)
	}
	if d, _, _ := s.Read(ctx, p10); len(d) != 0 {
		t.Fatalf("a failed commit wrote page 10: %q", d)
	}
	// Another tenant's pointer, or an old generation, is stale.
	other := p9
	other.Tenant = 6
	if _, _, err := s.Read(ctx, other); !errors.Is(err, ErrStale) {
		t.Fatalf("other tenant: %v, want ErrStale", err)
	}
	// Bounds.
	if _, err := s.Commit(ctx, make([]Op, MaxOpsPerCommit+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("16 ops: %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, []Op{{Kind: OpWrite, Ref: p9, Slot: slot, Data: make([]byte, 65)}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversize page: %v, want ErrInvalid", err)
	}
	if _, err := s.Commit(ctx, []Op{{Kind: OpCheck, Ref: p9, Slot: slot}, {Kind: OpWrite, Ref: p9, Slot: slot}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("page twice: %v, want ErrInvalid", err)
	}
	// Free: every pointer into the block goes stale, the data is gone.
	if _, err := s.Commit(ctx, []Op{{Kind: OpCheck, Ref: p9, Slot: slot}, {Kind: OpFreeBlock, Ref: blk}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Read(ctx, p9); !errors.Is(err, ErrStale) {
		t.Fatalf("read after free: %v, want ErrStale", err)
	}
	free2, _ := s.FreeBlocks(ctx, 1, 8, 1)
	if free2[0].Page != 8 || free2[0].Generation != blk.Generation+1 {
		t.Fatalf("freed block listed as %+v", free2)
	}
}

// TestMemStorePreparedResolve checks the two outcomes of a cross-extent
// commit left prepared: rolled forward if decided, back if not.
func TestMemStorePreparedResolve(t *testing.T) {
	ctx := context.Background()
	g := Geometry{PageBytes: 64, PagesPerBlock: 4, Blocks: 4}
	outcomes := map[string]int{}
	for seed := uint64(0); seed < 40; seed++ {
		s := NewMemStore(seed)
		var pages []PageRef
		for _, e := range []uint64{1, 2, 3} {
			if err := s.AddExtent(e, g); err != nil {
				t.Fatal(err)
			}
			blk := PageRef{Extent: e, Page: 0, Generation: 1, Tenant: 1}
			p := blk
			p.Page = 1
			if _, err := s.Commit(ctx, []Op{{Kind: OpAllocBlock, Ref: blk, Slot: 0}, {Kind: OpWriteFresh, Ref: p, Data: []byte("old")}}); err != nil {
				t.Fatal(err)
			}
			pages = append(pages, p)
		}
		var ops []Op
		for _, p := range pages {
			_, slot, _ := s.Read(ctx, p)
			ops = append(ops, Op{Kind: OpWrite, Ref: p, Slot: slot, Data: []byte("new")})
		}
		s.SetFaults(MemFaults{PreparedCrash: 1})
		_, err := s.Commit(ctx, ops)
		s.SetFaults(MemFaults{})
		if !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("crashed commit: %v, want ErrAmbiguous", err)
		}
		// Resolve whatever the reads run into; then all pages agree.
		var seen [][]byte
		for _, p := range pages {
			data, _, err := s.Read(ctx, p)
			var pe *PreparedError
			if errors.As(err, &pe) {
				if err := s.Resolve(ctx, pe.Txn); err != nil {
					t.Fatal(err)
				}
				data, _, err = s.Read(ctx, p)
			}
			if err != nil {
				t.Fatal(err)
			}
			seen = append(seen, data)
		}
		for _, d := range seen[1:] {
			if !bytes.Equal(d, seen[0]) {
				t.Fatalf("seed %d: pages disagree after resolution: %q", seed, seen)
			}
		}
		if s.PreparedCount() != 0 {
			t.Fatalf("seed %d: %d transactions still prepared", seed, s.PreparedCount())
		}
		outcomes[string(seen[0])]++
	}
	if outcomes["old"] == 0 || outcomes["new"] == 0 {
		t.Fatalf("outcomes %v: want both roll-back and roll-forward", outcomes)
	}
}
