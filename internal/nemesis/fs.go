package nemesis

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// maxFileBytes bounds a workload file: small files stay inline in the
// metadata, larger ones take tracts.
const maxFileBytes = 256 << 10

// fsWorker writes, renames, removes and reads files in its own directory of
// one mount; the checks read them through both mounts.
type fsWorker struct {
	id    int
	own   string // its directory through its own mount
	other string // the same directory through the other mount
	rng   *rand.Rand

	mu        sync.Mutex
	seq       int
	acked     map[string][sha256.Size]byte // name -> checksum of its contents
	uncertain map[string]bool              // names a failed operation may have left
	recent    map[string]bool              // names acknowledged since the last verify
}

func newFSWorker(ctx context.Context, id int, mnt, otherMnt string, seed uint64) (*fsWorker, error) {
	name := fmt.Sprintf("w%d", id+1)
	w := &fsWorker{id: id, own: filepath.Join(mnt, name), other: filepath.Join(otherMnt, name),
		rng: rand.New(rand.NewPCG(seed, 0x6673)), acked: map[string][sha256.Size]byte{}, uncertain: map[string]bool{}, recent: map[string]bool{}}
	deadline := time.Now().Add(time.Minute)
	for {
		err := os.Mkdir(w.own, 0o755)
		if err == nil || errors.Is(err, fs.ErrExist) {
			return w, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("nemesis: mkdir %s: %w", w.own, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (w *fsWorker) newName() string {
	w.seq++
	return fmt.Sprintf("f%05d", w.seq)
}

// pickAcked returns a random acknowledged name ("" if none), in a
// seeded order.
func (w *fsWorker) pickAcked() string {
	if len(w.acked) == 0 {
		return ""
	}
	names := make([]string, 0, len(w.acked))
	for n := range w.acked {
		names = append(names, n)
	}
	slices.Sort(names)
	return names[w.rng.IntN(len(names))]
}

// step does one operation: create (half the time), rename, remove or read.
func (w *fsWorker) step(context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch p := w.rng.IntN(100); {
	case p < 50 || len(w.acked) == 0:
		name := w.newName()
		data := make([]byte, w.rng.IntN(maxFileBytes+1))
		fillRandom(w.rng, data)
		if err := createSync(filepath.Join(w.own, name), data); err != nil {
			w.uncertain[name] = true
			return fmt.Errorf("create %s: %w", name, err)
		}
		w.acked[name] = sha256.Sum256(data)
		w.recent[name] = true
	case p < 65:
		from, to := w.pickAcked(), w.newName()
		sum := w.acked[from]
		if err := os.Rename(filepath.Join(w.own, from), filepath.Join(w.own, to)); err != nil {
			delete(w.acked, from)
			w.uncertain[from], w.uncertain[to] = true, true
			return fmt.Errorf("rename %s %s: %w", from, to, err)
		}
		delete(w.acked, from)
		w.acked[to] = sum
		w.recent[to] = true
	case p < 80:
		name := w.pickAcked()
		if err := os.Remove(filepath.Join(w.own, name)); err != nil {
			delete(w.acked, name)
			w.uncertain[name] = true
			return fmt.Errorf("remove %s: %w", name, err)
		}
		delete(w.acked, name)
	default:
		name := w.pickAcked()
		data, err := os.ReadFile(filepath.Join(w.own, name))
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if sha256.Sum256(data) != w.acked[name] {
			return &lossError{what: fmt.Sprintf("file %s/%s read back %d bytes with the wrong checksum", w.own, name, len(data))}
		}
	}
	return nil
}

// lossError is a workload operation that found acknowledged data changed
// or gone.
type lossError struct{ what string }

func (e *lossError) Error() string { return e.what }

// createSync creates path (it must not exist), writes data, fsyncs and
// closes it.
func createSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// verify checks the worker's directory through both mounts: every
// acknowledged file is there (and, if full, or if acknowledged since the
// last verify, or in a sample of the others, has its contents), and every
// other name is one a failed operation may have left. Uncertain names are then settled:
// removed if present, forgotten if absent. It returns the losses and the
// other anomalies.
func (w *fsWorker) verify(full bool) (lost, odd []string, files int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	read := map[string]bool{}
	names := make([]string, 0, len(w.acked))
	for name := range w.acked {
		names = append(names, name)
		if full || w.recent[name] {
			read[name] = true
		}
	}
	slices.Sort(names)
	for i := 0; i < verifySample && len(names) > 0; i++ {
		read[names[w.rng.IntN(len(names))]] = true
	}
	w.recent = map[string]bool{}
	for _, dir := range []string{w.own, w.other} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			odd = append(odd, fmt.Sprintf("list %s: %v", dir, err))
			continue
		}
		present := map[string]bool{}
		for _, e := range entries {
			present[e.Name()] = true
			if _, ok := w.acked[e.Name()]; !ok && !w.uncertain[e.Name()] {
				odd = append(odd, fmt.Sprintf("%s/%s exists, but no operation created it (or it was removed)", dir, e.Name()))
			}
		}
		for name, sum := range w.acked {
			if !present[name] {
				lost = append(lost, fmt.Sprintf("acknowledged file %s/%s is missing from its directory", dir, name))
				continue
			}
			if !read[name] {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, name))
			switch {
			case err != nil:
				lost = append(lost, fmt.Sprintf("acknowledged file %s/%s cannot be read: %v", dir, name, err))
			case sha256.Sum256(data) != sum:
				lost = append(lost, fmt.Sprintf("acknowledged file %s/%s has the wrong contents (%d bytes)", dir, name, len(data)))
			}
		}
	}
	for name := range w.uncertain {
		err := os.Remove(filepath.Join(w.own, name))
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			delete(w.uncertain, name)
		}
	}
	slices.Sort(lost)
	slices.Sort(odd)
	return lost, odd, len(w.acked)
}

// fillRandom fills b from rng.
func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}
