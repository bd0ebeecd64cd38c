package meta

import (
	"context"
	"fmt"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/fs"
)

// Snapshots over tables (FlexGroup §4: fence, bump, unfence; doc.go,
// Snapshots). Taking snapshot n freezes every table of the file system
// (Frozen = n in its header, which fails any owner commit in flight and
// holds every later one), records n in the superblock and raises its
// epoch past n, then thaws every table at the new epoch. Writes before a
// table's freeze are in the snapshot, writes after its thaw are not, and
// none happens in between: the snapshot is the state at the bump. Every
// step is idempotent and a frozen table only ever thaws past n, so anyone
// can finish an interrupted snapshot (completeSnapshot).

// freezeTable writes Frozen = n into the header of the table at lo,
// unless the table already writes past n (a finished snapshot).
func freezeTable(ctx context.Context, tree *btree.Tree, f, lo, n uint64) error {
	return updateHeader(ctx, tree, f, lo, func(h *tableHeader) bool {
		if h.W > n || h.Frozen == n {
			return false
		}
		if h.Frozen != 0 && h.Frozen > n {
			return false // frozen for a later snapshot: that one fences n too
		}
		h.Frozen = n
		return true
	})
}

// thawTable clears a freeze at or before n from the header of the table
// at lo and makes it write at w (at least).
func thawTable(ctx context.Context, tree *btree.Tree, f, lo, n, w uint64) error {
	return updateHeader(ctx, tree, f, lo, func(h *tableHeader) bool {
		if h.Frozen == 0 && h.W >= w {
			return false
		}
		if h.Frozen > n {
			return false
		}
		h.Frozen = 0
		h.W = max(h.W, w)
		return true
	})
}

// updateHeader changes the header of the table at lo in a transaction of
// its own (change reports whether it changed anything). A table with no
// header (never served yet) needs none: its first owner starts it at the
// superblock's epoch.
func updateHeader(ctx context.Context, tree *btree.Tree, f, lo uint64, change func(*tableHeader) bool) error {
	return tree.Update(ctx, func(tx *btree.Txn) error {
		v, ok, err := tx.Get(headerKey(f, lo))
		if err != nil || !ok {
			return err
		}
		h, err := decodeHeader(v)
		if err != nil {
			return err
		}
		if !change(h) {
			return nil
		}
		return tx.Put(headerKey(f, lo), h.encode())
	})
}

// takeSnapshot takes snapshot n of file system f, whose tables start at
// los: freeze them all, record n in the superblock through direct (an
// engine over the tree itself), thaw them all at the new epoch.
func takeSnapshot(ctx context.Context, tree *btree.Tree, direct *fs.FS, los []uint64, n uint64, name string) error {
	f := direct.Number()
	for _, lo := range los {
		if err := freezeTable(ctx, tree, f, lo, n); err != nil {
			return fmt.Errorf("meta: freeze the table at %#x for snapshot %d: %w", lo, n, err)
		}
	}
	if err := direct.CreateSnapshot(ctx, n, name); err != nil {
		return err
	}
	w, _, err := fs.ReadEpoch(ctx, fs.BTreeMeta{Tree: tree}, f)
	if err != nil {
		return err
	}
	for _, lo := range los {
		if err := thawTable(ctx, tree, f, lo, n, w); err != nil {
			return fmt.Errorf("meta: thaw the table at %#x after snapshot %d: %w", lo, n, err)
		}
	}
	return nil
}
