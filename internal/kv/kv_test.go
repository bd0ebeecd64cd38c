package kv

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/btree"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
)

// fakeDirectory holds an extent map and a config KV with the directory's
// compare-and-set contract.
type fakeDirectory struct {
	mu      sync.Mutex
	extents []uint64
	config  map[string]*dpb.ConfigEntry
	version uint64
}

func (d *fakeDirectory) GetExtent(context.Context, *dpb.GetExtentRequest) (*dpb.Extent, error) {
	return nil, status.Error(codes.Unimplemented, "not needed")
}

func (d *fakeDirectory) GetNode(context.Context, *dpb.GetNodeRequest) (*dpb.Node, error) {
	return nil, status.Error(codes.Unimplemented, "not needed")
}

func (d *fakeDirectory) ListExtents(_ context.Context, req *dpb.ListExtentsRequest) (*dpb.ListExtentsResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	resp := &dpb.ListExtentsResponse{}
	for _, id := range d.extents {
		if id > req.StartAfter {
			resp.Extents = append(resp.Extents, &dpb.Extent{ExtentId: id})
		}
	}
	return resp, nil
}

func (d *fakeDirectory) GetConfig(_ context.Context, req *dpb.GetConfigRequest) (*dpb.ConfigEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.config[req.Key]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "key %q does not exist", req.Key)
	}
	return e, nil
}

func (d *fakeDirectory) PutConfig(_ context.Context, req *dpb.PutConfigRequest) (*dpb.ConfigEntry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := uint64(0)
	if e, ok := d.config[req.Key]; ok {
		cur = e.Version
	}
	if req.ExpectedVersion != nil && *req.ExpectedVersion != cur {
		return nil, status.Errorf(codes.Aborted, "key %q is at version %d", req.Key, cur)
	}
	d.version++
	e := &dpb.ConfigEntry{Key: req.Key, Value: req.Value, Version: d.version}
	d.config[req.Key] = e
	return e, nil
}

var geometry = btree.Geometry{PageBytes: 8192, PagesPerBlock: 32, Blocks: 64}

func newFake(t *testing.T) (*fakeDirectory, *btree.MemStore) {
	s := btree.NewMemStore(1)
	for _, id := range []uint64{1001, 1000} {
		if err := s.AddExtent(id, geometry); err != nil {
			t.Fatal(err)
		}
	}
	return &fakeDirectory{extents: []uint64{1001, 1000}, config: map[string]*dpb.ConfigEntry{}}, s
}

// TestOpenCreatesOnceAndShares: concurrent first clients agree on one tree
// (the losers free their blocks), later clients find it, and what one
// writes the others read.
func TestOpenCreatesOnceAndShares(t *testing.T) {
	ctx := context.Background()
	dir, store := newFake(t)
	const clients = 6
	trees := make([]*btree.Tree, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr, err := Open(ctx, dir, store, btree.Config{})
			if err != nil {
				t.Error(err)
				return
			}
			trees[i] = tr
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, tr := range trees {
		defer tr.Close()
		if tr.Root() != trees[0].Root() {
			t.Fatalf("clients disagree on the root: %v and %v", tr.Root(), trees[0].Root())
		}
	}
	if trees[0].Root().Extent != 1000 || trees[0].Root().Tenant != Tenant {
		t.Errorf("root %v: want the lowest extent and tenant %d", trees[0].Root(), Tenant)
	}
	// Only the winner's block is still allocated in the first extent.
	free, err := store.FreeBlocks(ctx, 1000, 0, geometry.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	if len(free) != geometry.Blocks-1 {
		t.Errorf("%d blocks allocated, want 1: losers did not free theirs", geometry.Blocks-len(free))
	}
	if err := trees[1].Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	later, err := Open(ctx, dir, store, btree.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	if v, ok, err := later.Get(ctx, []byte("k")); err != nil || !ok || string(v) != "v" {
		t.Fatalf("get = %q %v %v", v, ok, err)
	}
}

func TestOpenWithoutExtents(t *testing.T) {
	dir, store := newFake(t)
	dir.extents = nil
	if _, err := Open(context.Background(), dir, store, btree.Config{}); !errors.Is(err, ErrNoExtents) {
		t.Fatalf("Open = %v, want ErrNoExtents", err)
	}
}

func TestOpenRefusesABadRoot(t *testing.T) {
	dir, store := newFake(t)
	dir.config[RootConfigKey] = &dpb.ConfigEntry{Key: RootConfigKey, Value: []byte("short"), Version: 1}
	if _, err := Open(context.Background(), dir, store, btree.Config{}); err == nil {
		t.Fatal("Open accepted a malformed root pointer")
	}
}
