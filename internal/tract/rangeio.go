package tract

import (
	"context"
	"fmt"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Byte-range access over the tract API, for writers that do not write
// whole tracts. A tract is written whole (WriteTract replaces it), and an
// erasure-coded tract is one stripe, so a write that covers part of a
// tract reads the tract (reconstructing it if need be), patches it and
// writes the whole stripe back: read-modify-write of a stripe. An append
// is a WriteAt at the blob's end. Concurrent writers of one tract must
// coordinate (as FDS asks); extend gives concurrent appenders disjoint
// tracts.

// WriteAt writes p at byte offset off, extending the blob by the tracts it
// lacks. Bytes between a tract's stored end and off read as zeros. It
// returns len(p) or an error (after which a prefix of the tracts may be
// written).
func (b *Blob) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, invalidf("offset %d", off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	ts, err := b.c.TractSize(ctx)
	if err != nil {
		return 0, err
	}
	end := off + int64(len(p))
	last := uint64((end - 1) / int64(ts))
	size, err := b.Size(ctx)
	if err != nil {
		return 0, err
	}
	if last >= size {
		if _, err := b.Extend(ctx, last+1-size); err != nil {
			return 0, fmt.Errorf("extend blob %s: %w", b.guid, err)
		}
	}
	for i := uint64(off / int64(ts)); i <= last; i++ {
		start := int64(i) * int64(ts)
		lo, hi := max(off, start)-start, min(end, start+int64(ts))-start
		src := p[max(off, start)-off : min(end, start+int64(ts))-off]
		var data []byte
		if lo == 0 && hi == int64(ts) {
			data = src
		} else {
			cur, err := b.ReadTract(ctx, i)
			if err != nil {
				return 0, fmt.Errorf("read tract %d to patch it: %w", i, err)
			}
			data = make([]byte, max(int64(len(cur)), hi))
			copy(data, cur)
			copy(data[lo:hi], src)
		}
		if err := b.WriteTract(ctx, i, data); err != nil {
			return 0, fmt.Errorf("write tract %d: %w", i, err)
		}
	}
	return len(p), nil
}

// ReadAt reads len(p) bytes at offset off; bytes no write reached read as
// zeros. Reading past the blob's last tract is PAST_END.
func (b *Blob) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, invalidf("offset %d", off)
	}
	ts, err := b.c.TractSize(ctx)
	if err != nil {
		return 0, err
	}
	end := off + int64(len(p))
	for pos := off; pos < end; {
		i := uint64(pos / int64(ts))
		start := int64(i) * int64(ts)
		data, err := b.ReadTract(ctx, i)
		if err != nil {
			if CodeOf(err) == tpb.ErrorCode_PAST_END {
				return int(pos - off), err
			}
			return int(pos - off), fmt.Errorf("read tract %d: %w", i, err)
		}
		hi := min(end, start+int64(ts))
		n := copy(p[pos-off:hi-off], data[min(int64(len(data)), pos-start):])
		clear(p[pos-off+int64(n) : hi-off])
		pos = hi
	}
	return len(p), nil
}
