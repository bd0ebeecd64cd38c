package nemesis

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	tmp   string // a local file the contents of a new file are staged in
	rng   *rand.Rand

	mu        sync.Mutex
	seq       int
	acked     map[string][sha256.Size]byte // name -> checksum of its contents
	uncertain map[string]bool              // names a failed operation may have left
	recent    map[string]bool              // names acknowledged since the last verify
}

func newFSWorker(ctx context.Context, id int, mnt, otherMnt, tmpDir string, seed uint64) (*fsWorker, error) {
	name := fmt.Sprintf("w%d", id+1)
	w := &fsWorker{id: id, own: filepath.Join(mnt, name), other: filepath.Join(otherMnt, name), tmp: filepath.Join(tmpDir, name+".data"),
		rng: rand.New(rand.NewPCG(seed, 0x6673)), acked: map[string][sha256.Size]byte{}, uncertain: map[string]bool{}, recent: map[string]bool{}}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := fsCmd(ctx, "mkdir", "-p", w.own)
		if err == nil {
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
func (w *fsWorker) step(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch p := w.rng.IntN(100); {
	case p < 50 || len(w.acked) == 0:
		name := w.newName()
		data := make([]byte, w.rng.IntN(maxFileBytes+1))
		fillRandom(w.rng, data)
		if err := w.createSync(ctx, filepath.Join(w.own, name), data); err != nil {
			w.uncertain[name] = true
			return fmt.Errorf("create %s: %w", name, err)
		}
		w.acked[name] = sha256.Sum256(data)
		w.recent[name] = true
	case p < 65:
		from, to := w.pickAcked(), w.newName()
		sum := w.acked[from]
		if _, err := fsCmd(ctx, "mv", "-T", filepath.Join(w.own, from), filepath.Join(w.own, to)); err != nil {
			delete(w.acked, from)
			w.uncertain[from], w.uncertain[to] = true, true
			return fmt.Errorf("rename %s %s: %w", from, to, err)
		}
		delete(w.acked, from)
		w.acked[to] = sum
		w.recent[to] = true
	case p < 80:
		name := w.pickAcked()
		if _, err := fsCmd(ctx, "rm", filepath.Join(w.own, name)); err != nil {
			delete(w.acked, name)
			w.uncertain[name] = true
			return fmt.Errorf("remove %s: %w", name, err)
		}
		delete(w.acked, name)
	default:
		name := w.pickAcked()
		sum, err := fileSum(ctx, filepath.Join(w.own, name))
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if sum != w.acked[name] {
			return &lossError{what: fmt.Sprintf("file %s/%s read back with the wrong checksum", w.own, name)}
		}
	}
	return nil
}

// lossError is a workload operation that found acknowledged data changed
// or gone.
type lossError struct{ what string }

func (e *lossError) Error() string { return e.what }

// The workers reach the mounts only through short-lived child processes
// (dd, mv, rm, sha256sum, ls): the nemesis process itself never holds a
// file of a mount open. It forks the nodes it restarts, and a fork's exec
// closes the parent's open files, each close of a FUSE file a FLUSH that
// waits for the mount, which waits for the cluster, which waits for the
// node being started: the restart of a directory voter hung for the
// FUSE request timeout (10 minutes) this way.
const fsCmdTimeout = 5 * time.Minute

// fsCmd runs a command on a mount and returns its standard output.
func fsCmd(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, fsCmdTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// createSync creates path (it must not exist) with data, fsynced and
// closed.
func (w *fsWorker) createSync(ctx context.Context, path string, data []byte) error {
	if err := os.WriteFile(w.tmp, data, 0o644); err != nil {
		return err
	}
	_, err := fsCmd(ctx, "dd", "if="+w.tmp, "of="+path, "bs=1M", "conv=fsync,excl", "status=none")
	return err
}

// writeFileSync writes path (created or truncated) with data staged in
// tmp, fsynced and closed.
func writeFileSync(ctx context.Context, path, tmp string, data []byte) error {
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	_, err := fsCmd(ctx, "dd", "if="+tmp, "of="+path, "bs=1M", "conv=fsync", "status=none")
	return err
}

// fileSum returns the SHA-256 of the file at path.
func fileSum(ctx context.Context, path string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	out, err := fsCmd(ctx, "sha256sum", "--", path)
	if err != nil {
		return sum, err
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return sum, fmt.Errorf("sha256sum %s: no output", path)
	}
	b, err := hex.DecodeString(f[0])
	if err != nil || len(b) != sha256.Size {
		return sum, fmt.Errorf("sha256sum %s: %q", path, f[0])
	}
	copy(sum[:], b)
	return sum, nil
}

// listDir returns the names in dir.
func listDir(ctx context.Context, dir string) ([]string, error) {
	out, err := fsCmd(ctx, "ls", "-1A", "--", dir)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// verify checks the worker's directory through both mounts: every
// acknowledged file is there (and, if full, or if acknowledged since the
// last verify, or in a sample of the others, has its contents), and every
// other name is one a failed operation may have left. Uncertain names are then settled:
// removed if present, forgotten if absent. It returns the losses and the
// other anomalies.
func (w *fsWorker) verify(ctx context.Context, full bool) (lost, odd []string, files int) {
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
		entries, err := listDir(ctx, dir)
		if err != nil {
			odd = append(odd, fmt.Sprintf("list %s: %v", dir, err))
			continue
		}
		present := map[string]bool{}
		for _, e := range entries {
			present[e] = true
			if _, ok := w.acked[e]; !ok && !w.uncertain[e] {
				odd = append(odd, fmt.Sprintf("%s/%s exists, but no operation created it (or it was removed)", dir, e))
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
			got, err := fileSum(ctx, filepath.Join(dir, name))
			switch {
			case err != nil:
				lost = append(lost, fmt.Sprintf("acknowledged file %s/%s cannot be read: %v", dir, name, err))
			case got != sum:
				lost = append(lost, fmt.Sprintf("acknowledged file %s/%s has the wrong contents", dir, name))
			}
		}
	}
	if len(w.uncertain) > 0 {
		if entries, err := listDir(ctx, w.own); err == nil {
			for name := range w.uncertain {
				if !slices.Contains(entries, name) {
					delete(w.uncertain, name)
				} else if _, err := fsCmd(ctx, "rm", "--", filepath.Join(w.own, name)); err == nil {
					delete(w.uncertain, name)
				}
			}
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
