package meta

import (
	"context"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
)

// shared is fs.Shared for a file system cut into tables: the superblock's
// counters are incremented in transactions of their own on the tree (they
// are drawn rarely: deep or wide directories), and directory moves between
// parents take a lock every server of the file system agrees on.
type shared struct {
	tree *btree.Tree
	f    uint64
	lock func(ctx context.Context) (func(), error)
}

var _ fs.Shared = shared{}

func (s shared) NextID(ctx context.Context, c fs.Counter) (uint64, error) {
	return fs.SuperblockCounter(ctx, fs.BTreeMeta{Tree: s.tree}, s.f, c)
}

func (s shared) LockRenames(ctx context.Context) (func(), error) { return s.lock(ctx) }
