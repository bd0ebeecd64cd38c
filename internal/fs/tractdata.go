package fs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/arbor-storage/arbor/internal/tract"
)

// TractData adapts the tract store's client (internal/tract, FDS §2.1) to
// DataStore: each file's blob is a tract store blob of the same GUID.
// Open blobs are kept (a tract.Blob carries the blob's incarnation and
// known length, which every read and write sends), bounded in number.
type TractData struct {
	c         *tract.Client
	tractSize int
	// layout is each new blob's (replicas:0 is the tract store's default
	// replication); a file system's own (WithLayout) for its files.
	layout tract.Layout
	// tenant owns the blobs d creates (WithTenant: a file system's
	// tenant); "" the caller's own.
	tenant string

	*openBlobs
}

// openBlobs are the blobs a TractData and its WithLayout views keep open.
type openBlobs struct {
	mu    sync.Mutex
	blobs map[GUID]*tract.Blob
}

// maxOpenBlobs bounds the open blobs a TractData keeps; past it, it
// forgets them all (reopening costs one metadata round trip).
const maxOpenBlobs = 4096

var _ DataStore = (*TractData)(nil)
var _ TractLengther = (*TractData)(nil)

// NewTractData returns a DataStore over c; replication is each new blob's
// replication level (0: the tract store's default). It asks the cluster
// its tract size.
func NewTractData(ctx context.Context, c *tract.Client, replication int) (*TractData, error) {
	ts, err := c.TractSize(ctx)
	if err != nil {
		return nil, fmt.Errorf("fs: the tract store's tract size: %w", err)
	}
	return &TractData{c: c, tractSize: ts, layout: tract.Layout{Replicas: replication}, openBlobs: &openBlobs{blobs: map[GUID]*tract.Blob{}}}, nil
}

// CheckLayout parses a file system's data layout (replicas:K or ec:D+P,
// tract.ParseLayout) and checks that the cluster can hold it (enough
// failure domains for ec:D+P: tract.Client.CheckLayout); it returns the
// layout's canonical form and how many lost failure domains its blobs
// survive (tract.Layout.Survives).
func (d *TractData) CheckLayout(ctx context.Context, layout string) (string, int, error) {
	l, err := tract.ParseLayout(layout)
	if err != nil {
		return "", 0, err
	}
	if err := d.c.CheckLayout(ctx, l); err != nil {
		return "", 0, fmt.Errorf("data layout %s: %w", l, err)
	}
	return l.String(), l.Survives(), nil
}

// DefaultLayout is the canonical form of the layout new blobs get when a
// file system names none: replicas:K, K the tract store's row width
// unless d was made with a replication of its own.
func (d *TractData) DefaultLayout(ctx context.Context) (string, error) {
	l := d.layout
	if !l.IsEC() && l.Replicas == 0 {
		t, err := d.c.TLT(ctx)
		if err != nil {
			return "", fmt.Errorf("fs: the tract store's replication: %w", err)
		}
		l.Replicas = t.Replication
	}
	return l.String(), nil
}

// WithLayout returns a view of d whose new blobs have the given layout
// (a file system's data layout, as CheckLayout returned it; "" keeps d's).
// Blobs already made keep theirs: a blob's layout is chosen at creation.
func (d *TractData) WithLayout(layout string) (*TractData, error) {
	if layout == "" {
		return d, nil
	}
	l, err := tract.ParseLayout(layout)
	if err != nil {
		return nil, fmt.Errorf("fs: data layout: %w", err)
	}
	v := *d
	v.layout = l
	return &v, nil
}

// WithTenant returns a view of d whose new blobs belong to tenant (a file
// system's tenant: its files' blobs are its tenant's whoever writes them,
// so an administrator's mount makes blobs the tenant's mounts can read).
func (d *TractData) WithTenant(tenant string) *TractData {
	v := *d
	v.tenant = tenant
	return &v
}

// create makes blob g of n tracts with d's layout, for d's tenant.
func (d *TractData) create(ctx context.Context, g GUID, n uint64) (*tract.Blob, error) {
	return d.c.CreateTenantBlob(ctx, tract.GUID(g), d.layout, n, d.tenant)
}

// TractSize implements DataStore.
func (d *TractData) TractSize() int { return d.tractSize }

func tractErr(op string, g GUID, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, tract.ErrBlobNotFound) {
		return fmt.Errorf("%s %s: %w", op, g, errors.Join(ErrBlobNotFound, err))
	}
	return fmt.Errorf("%s %s: %w", op, g, err)
}

func (d *TractData) remember(g GUID, b *tract.Blob) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.blobs) >= maxOpenBlobs {
		clear(d.blobs)
	}
	d.blobs[g] = b
}

func (d *TractData) forget(g GUID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.blobs, g)
}

// blob returns the open blob g, opening it if needed.
func (d *TractData) blob(ctx context.Context, g GUID) (*tract.Blob, error) {
	d.mu.Lock()
	b := d.blobs[g]
	d.mu.Unlock()
	if b != nil {
		return b, nil
	}
	b, err := d.c.OpenBlob(ctx, tract.GUID(g))
	if err != nil {
		return nil, tractErr("open blob", g, err)
	}
	d.remember(g, b)
	return b, nil
}

// CreateBlob implements DataStore.
func (d *TractData) CreateBlob(ctx context.Context, g GUID) error {
	b, err := d.create(ctx, g, 0)
	if errors.Is(err, tract.ErrBlobExists) {
		return nil
	}
	if err != nil {
		return tractErr("create blob", g, err)
	}
	d.remember(g, b)
	return nil
}

// CreateSized implements BlobSizer.
func (d *TractData) CreateSized(ctx context.Context, g GUID, n uint64) (uint64, error) {
	b, err := d.create(ctx, g, n)
	if errors.Is(err, tract.ErrBlobExists) {
		return d.Extend(ctx, g, n)
	}
	if err != nil {
		return 0, tractErr("create blob", g, err)
	}
	d.remember(g, b)
	return 0, nil
}

var _ BlobSizer = (*TractData)(nil)

// DeleteBlob implements DataStore.
func (d *TractData) DeleteBlob(ctx context.Context, g GUID) error {
	d.forget(g)
	err := d.c.DeleteBlob(ctx, tract.GUID(g))
	if errors.Is(err, tract.ErrBlobNotFound) {
		return nil
	}
	return tractErr("delete blob", g, err)
}

// withBlob runs fn on the open blob g; if the blob was deleted and
// created again since it was opened, it reopens it once.
func (d *TractData) withBlob(ctx context.Context, op string, g GUID, fn func(b *tract.Blob) error) error {
	for attempt := 0; ; attempt++ {
		b, err := d.blob(ctx, g)
		if err != nil {
			return err
		}
		err = fn(b)
		if err != nil && attempt == 0 && errors.Is(err, tract.ErrBlobNotFound) {
			d.forget(g)
			continue
		}
		return tractErr(op, g, err)
	}
}

// Extend implements DataStore.
func (d *TractData) Extend(ctx context.Context, g GUID, n uint64) (uint64, error) {
	var first uint64
	err := d.withBlob(ctx, "extend blob", g, func(b *tract.Blob) error {
		size, err := b.Extend(ctx, n)
		if err != nil {
			return err
		}
		first = size - n
		return nil
	})
	return first, err
}

// WriteTract implements DataStore.
func (d *TractData) WriteTract(ctx context.Context, g GUID, i uint64, data []byte) error {
	return d.withBlob(ctx, "write tract", g, func(b *tract.Blob) error { return b.WriteTract(ctx, i, data) })
}

// ReadTract implements DataStore.
func (d *TractData) ReadTract(ctx context.Context, g GUID, i uint64) ([]byte, error) {
	var out []byte
	err := d.withBlob(ctx, "read tract", g, func(b *tract.Blob) error {
		var err error
		out, err = b.ReadTract(ctx, i)
		return err
	})
	return out, err
}

// TractLength implements TractLengther (fsck).
func (d *TractData) TractLength(ctx context.Context, g GUID, i uint64) (int, error) {
	var n int
	err := d.withBlob(ctx, "tract length", g, func(b *tract.Blob) error {
		var err error
		n, err = b.TractLength(ctx, i)
		return err
	})
	return n, err
}

// BlobTracts implements DataStore.
func (d *TractData) BlobTracts(ctx context.Context, g GUID) (uint64, bool, error) {
	b, err := d.c.OpenBlob(ctx, tract.GUID(g))
	if errors.Is(err, tract.ErrBlobNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, tractErr("stat blob", g, err)
	}
	return b.Info().Tracts, true, nil
}
