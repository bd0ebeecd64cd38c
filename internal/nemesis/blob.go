package nemesis

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/arbor-storage/arbor/internal/tract"
)

// maxBlobBytes bounds a workload blob; blobs span several tracts when the
// cluster's tract size is small.
const maxBlobBytes = 512 << 10

// blobWorker puts blobs and reads acknowledged ones back.
type blobWorker struct {
	tc     *tract.Client
	layout tract.Layout // of the blobs it puts (Config.Data)
	rng    *rand.Rand

	mu      sync.Mutex
	acked   map[tract.GUID]blobRecord
	order   []tract.GUID // acked, in put order, for seeded picks
	checked int          // order[:checked] were verified at an earlier pause
	deleted int
}

type blobRecord struct {
	size int
	sum  [sha256.Size]byte
}

func newBlobWorker(tc *tract.Client, layout tract.Layout, seed uint64) *blobWorker {
	return &blobWorker{tc: tc, layout: layout, rng: rand.New(rand.NewPCG(seed, 0x626c6f62)), acked: map[tract.GUID]blobRecord{}}
}

// putBlob stores data as a new blob of the given layout (the zero layout:
// the tract store's replication), tract by tract.
func putBlob(ctx context.Context, tc *tract.Client, layout tract.Layout, data []byte) (tract.GUID, int, error) {
	ts, err := tc.TractSize(ctx)
	if err != nil {
		return tract.GUID{}, 0, err
	}
	g := tract.NewGUID()
	b, err := tc.CreateBlobLayout(ctx, g, layout, 0)
	if err != nil {
		return g, 0, fmt.Errorf("create blob: %w", err)
	}
	defer b.Close()
	n := uint64((len(data) + ts - 1) / ts)
	if n > 0 {
		if _, err := b.Extend(ctx, n); err != nil {
			return g, 0, fmt.Errorf("extend blob %s: %w", g, err)
		}
	}
	for i := uint64(0); i < n; i++ {
		chunk := data[int(i)*ts : min(len(data), int(i+1)*ts)]
		if err := b.WriteTract(ctx, i, chunk); err != nil {
			return g, 0, fmt.Errorf("write tract %d of %s: %w", i, g, err)
		}
	}
	return g, ts, nil
}

// getBlob reads the first size bytes of blob g.
func getBlob(ctx context.Context, tc *tract.Client, g tract.GUID, size int) ([]byte, error) {
	ts, err := tc.TractSize(ctx)
	if err != nil {
		return nil, err
	}
	b, err := tc.OpenBlob(ctx, g)
	if err != nil {
		return nil, fmt.Errorf("open blob %s: %w", g, err)
	}
	defer b.Close()
	var out []byte
	for i := uint64(0); len(out) < size; i++ {
		d, err := b.ReadTract(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("read tract %d of %s: %w", i, g, err)
		}
		if len(d) < ts && len(out)+len(d) < size {
			return nil, fmt.Errorf("tract %d of %s has %d bytes", i, g, len(d))
		}
		out = append(out, d...)
	}
	return out, nil
}

// step puts a blob (half the time), deletes one (a tenth; so that a long
// run does not fill the disks) or reads one back.
func (w *blobWorker) step(ctx context.Context) error {
	w.mu.Lock()
	p := w.rng.IntN(10)
	put := len(w.order) == 0 || p < 5
	del := !put && p == 5
	var data []byte
	var g tract.GUID
	idx := 0
	if put {
		data = make([]byte, 1+w.rng.IntN(maxBlobBytes))
		fillRandom(w.rng, data)
	} else {
		idx = w.rng.IntN(len(w.order))
		g = w.order[idx]
	}
	rec := w.acked[g]
	if del {
		// Forgotten before the delete: whatever its outcome, the blob is
		// no longer required.
		delete(w.acked, g)
		w.order = append(w.order[:idx], w.order[idx+1:]...)
		if idx < w.checked {
			w.checked--
		}
		w.deleted++
	}
	w.mu.Unlock()
	switch {
	case put:
		g, _, err := putBlob(ctx, w.tc, w.layout, data)
		if err != nil {
			return err
		}
		w.mu.Lock()
		w.acked[g] = blobRecord{size: len(data), sum: sha256.Sum256(data)}
		w.order = append(w.order, g)
		w.mu.Unlock()
		return nil
	case del:
		if err := w.tc.DeleteBlob(ctx, g); err != nil {
			return fmt.Errorf("delete blob %s: %w", g, err)
		}
		return nil
	}
	got, err := getBlob(ctx, w.tc, g, rec.size)
	if err != nil {
		return err
	}
	if len(got) < rec.size || sha256.Sum256(got[:rec.size]) != rec.sum {
		return &lossError{what: fmt.Sprintf("blob %s read back with the wrong contents", g)}
	}
	return nil
}

// verify reads acknowledged blobs back: all if full, else those put since
// the last verify and a sample of the older ones.
func (w *blobWorker) verify(ctx context.Context, full bool) (lost []string, blobs int) {
	w.mu.Lock()
	order := sampleOlder(w.order, w.checked, full, w.rng)
	w.checked = len(w.order)
	total := len(w.order)
	acked := make(map[tract.GUID]blobRecord, len(w.acked))
	for g, r := range w.acked {
		acked[g] = r
	}
	w.mu.Unlock()
	for _, g := range order {
		rec := acked[g]
		var got []byte
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, opTimeout)
			got, err = getBlob(cctx, w.tc, g, rec.size)
			cancel()
			if err == nil {
				break
			}
		}
		switch {
		case err != nil:
			lost = append(lost, fmt.Sprintf("acknowledged blob %s (%d bytes) cannot be read: %v", g, rec.size, err))
		case len(got) < rec.size || sha256.Sum256(got[:rec.size]) != rec.sum:
			lost = append(lost, fmt.Sprintf("acknowledged blob %s (%d bytes) has the wrong contents", g, rec.size))
		}
	}
	return lost, total
}
