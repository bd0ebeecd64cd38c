package fs

import (
	"bytes"
	"context"
	"fmt"
	"sync"
)

// MemData is the in-memory twin of the data store: blobs of tracts, with
// the tract store's contract (extend is atomic, writes replace a whole
// tract, a short tract costs its length).
type MemData struct {
	tractSize int

	mu     sync.Mutex
	blobs  map[GUID]*memBlob
	writes int64
	reads  int64
}

type memBlob struct {
	tracts map[uint64][]byte
	size   uint64
}

// NewMemData returns an empty store with the given tract size.
func NewMemData(tractSize int) *MemData {
	return &MemData{tractSize: tractSize, blobs: map[GUID]*memBlob{}}
}

// TractSize implements DataStore.
func (d *MemData) TractSize() int { return d.tractSize }

// CreateBlob implements DataStore.
func (d *MemData) CreateBlob(_ context.Context, g GUID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.blobs[g] == nil {
		d.blobs[g] = &memBlob{tracts: map[uint64][]byte{}}
	}
	return nil
}

// DeleteBlob implements DataStore.
func (d *MemData) DeleteBlob(_ context.Context, g GUID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.blobs, g)
	return nil
}

// Extend implements DataStore.
func (d *MemData) Extend(_ context.Context, g GUID, n uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.blobs[g]
	if b == nil {
		return 0, fmt.Errorf("extend %s: %w", g, ErrBlobNotFound)
	}
	first := b.size
	b.size += n
	return first, nil
}

// WriteTract implements DataStore.
func (d *MemData) WriteTract(_ context.Context, g GUID, i uint64, data []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.blobs[g]
	if b == nil {
		return fmt.Errorf("write %s/%d: %w", g, i, ErrBlobNotFound)
	}
	if i >= b.size {
		return fmt.Errorf("write %s/%d: past the end (%d tracts)", g, i, b.size)
	}
	if len(data) > d.tractSize {
		return fmt.Errorf("write %s/%d: %d bytes, the tract size is %d", g, i, len(data), d.tractSize)
	}
	d.writes++
	if len(data) == 0 {
		delete(b.tracts, i)
		return nil
	}
	b.tracts[i] = bytes.Clone(data)
	return nil
}

// ReadTract implements DataStore.
func (d *MemData) ReadTract(_ context.Context, g GUID, i uint64) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.blobs[g]
	if b == nil {
		return nil, fmt.Errorf("read %s/%d: %w", g, i, ErrBlobNotFound)
	}
	if i >= b.size {
		return nil, fmt.Errorf("read %s/%d: past the end (%d tracts)", g, i, b.size)
	}
	d.reads++
	return bytes.Clone(b.tracts[i]), nil
}

// BlobTracts implements DataStore.
func (d *MemData) BlobTracts(_ context.Context, g GUID) (uint64, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.blobs[g]
	if b == nil {
		return 0, false, nil
	}
	return b.size, true, nil
}

// TractLength implements TractLengther (fsck).
func (d *MemData) TractLength(_ context.Context, g GUID, i uint64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.blobs[g]
	if b == nil {
		return 0, fmt.Errorf("tract length %s/%d: %w", g, i, ErrBlobNotFound)
	}
	return len(b.tracts[i]), nil
}

// Usage returns the number of blobs, non-empty tracts and their bytes.
func (d *MemData) Usage() (blobs, tracts int, bytes int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range d.blobs {
		blobs++
		for _, t := range b.tracts {
			tracts++
			bytes += int64(len(t))
		}
	}
	return blobs, tracts, bytes
}

// Blobs returns the ids of every blob.
func (d *MemData) Blobs() []GUID {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]GUID, 0, len(d.blobs))
	for g := range d.blobs {
		out = append(out, g)
	}
	return out
}
