package fuse_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
)

// crashWriterEnv, set to "DIR:LOG", makes this test binary a writer
// process (TestMain): it writes files 0, 1, 2, ... into DIR in order (a new
// subdirectory every crashFilesPerDir), syncs the file system every
// crashSyncEvery files (fsync of DIR), and appends "closed N" after each close and
// "synced N" after each sync to LOG (on the local disk), until an error.
const crashWriterEnv = "ARBOR_FUSE_CRASH_WRITER"

const (
	crashFilesPerDir = 40
	crashSyncEvery   = 25
	// maxLostFlushes: fsclient's maxLateFlushesQueued, and the file the
	// writer was writing.
	maxLostFlushes = 64 + 1
)

// crashFile is file i's path under dir and its content: sizes from a few
// bytes (kept inline in the metadata: in the block pair alone, with one
// chunk, with all of them at fs.MaxInlineBytes) to several tracts' worth.
func crashFile(dir string, i int) (string, []byte) {
	p := filepath.Join(dir, fmt.Sprintf("d%03d", i/crashFilesPerDir), fmt.Sprintf("f%05d", i))
	sizes := []int{7, 900, 3000, 5000, fs.MaxInlineBytes, 20000, 70000}
	n := sizes[i%len(sizes)]
	line := fmt.Sprintf("file %d of the crash test\n", i)
	return p, bytes.Repeat([]byte(line), n/len(line)+1)[:n]
}

func crashWriterProcess(spec string) int {
	dir, logPath, ok := strings.Cut(spec, ":")
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: want DIR:LOG\n", crashWriterEnv, spec)
		return 2
	}
	log, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer log.Close()
	for i := 0; ; i++ {
		p, content := crashFile(dir, i)
		if i%crashFilesPerDir == 0 {
			if err := os.Mkdir(filepath.Dir(p), 0o755); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintf(log, "closed %d\n", i)
		if i%crashSyncEvery == crashSyncEvery-1 {
			// fsync of a directory: Linux does not pass syncfs(2) on to
			// a FUSE file system.
			d, err := os.Open(dir)
			if err == nil {
				err = d.Sync()
				d.Close()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintf(log, "synced %d\n", i)
		}
	}
}

// readCrashLog returns the last file the writer closed and the last it
// synced (-1: none).
func readCrashLog(t *testing.T, path string) (closed, synced int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	closed, synced = -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		what, n, ok := strings.Cut(sc.Text(), " ")
		i, err := strconv.Atoi(n)
		if !ok || err != nil {
			continue // a line cut by the kill
		}
		switch what {
		case "closed":
			closed = max(closed, i)
		case "synced":
			synced = max(synced, i)
		}
	}
	return closed, synced
}

// TestCrashDuringWrites is issue 12's crash check through the kernel: a
// writer process writes files in order through an `arbor mount`, syncing
// now and then, and is cut off by kill -9 of the mount (and, in the
// second case, of the metadata server owning its directory at the same
// instant). Through a new mount:
//
//   - mount killed: every file whose close returned is there (the changes
//     it was answered are at the server);
//   - server and mount killed: what is left is a prefix of the files
//     written (no file without every earlier one);
//   - either way every file synced before the kill is there and whole;
//     a later one is whole or, if its flush after close had not landed,
//     holds a prefix of its data (nothing, for these new files), never
//     other bytes; and at most fsclient's bound on flushes after close
//     (64) lost their data.
//
// fsck finds nothing wrong but, at most, the tracts of the flushes that
// were under way (written, never committed: README, Durability).
func TestCrashDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	e := startEnv(t)
	e.createFS("default")
	for _, tc := range []struct {
		name       string
		killServer bool
	}{{"mount", false}, {"server-and-mount", true}} {
		t.Run(tc.name, func(t *testing.T) {
			m := e.mount("default")
			dir := filepath.Join(m.dir, tc.name)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			logPath := filepath.Join(t.TempDir(), "writer.log")
			w := exec.Command(os.Args[0], "-test.run=^$")
			w.Env = append(os.Environ(), fmt.Sprintf("%s=%s:%s", crashWriterEnv, dir, logPath))
			var wout bytes.Buffer
			w.Stdout, w.Stderr = &wout, &wout
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(6 * time.Second)
			var owner uint64
			if tc.killServer {
				owner = busiestTableOwner(t, e)
				if err := e.c.Kill(owner); err != nil {
					t.Fatal(err)
				}
			}
			m.kill(t)
			_ = w.Wait()
			closed, synced := readCrashLog(t, logPath)
			t.Logf("killed the mount%s after %d files closed, %d synced; the writer said: %.300s",
				map[bool]string{true: fmt.Sprintf(" and node %d", owner)}[tc.killServer], closed+1, synced+1, wout.String())
			if closed < 2*crashSyncEvery {
				t.Fatalf("the writer closed only %d files before the kill", closed+1)
			}

			m2 := e.mount("default")
			dir2 := filepath.Join(m2.dir, tc.name)
			last := -1 // the highest file present
			for i := 0; i <= closed+crashFilesPerDir; i++ {
				p, _ := crashFile(dir2, i)
				if _, err := os.Lstat(p); err == nil {
					last = i
				}
			}
			lost := 0
			for i := 0; i <= last; i++ {
				p, want := crashFile(dir2, i)
				got, err := os.ReadFile(p)
				switch {
				case err != nil && i <= synced:
					t.Errorf("file %d, synced before the kill, is missing: %v", i, err)
				case err != nil && !tc.killServer && i <= closed:
					t.Errorf("file %d, closed before the kill, is missing: %v", i, err)
				case err != nil:
					t.Errorf("file %d is missing while file %d is there: not a prefix (%v)", i, last, err)
				case bytes.Equal(got, want):
				case i > synced && len(got) <= len(want) && bytes.Equal(got, want[:len(got)]):
					// Its flush after close (or, past the last close, its
					// writes) had not landed.
					lost++
				default:
					t.Errorf("file %d holds %d bytes, want %d (synced up to %d)", i, len(got), len(want), synced)
				}
			}
			if lost > maxLostFlushes {
				t.Errorf("%d files lost their data; at most %d flushes after close may be under way", lost, maxLostFlushes)
			}
			if !tc.killServer && last < closed {
				t.Errorf("files up to %d were closed, only up to %d are there", closed, last)
			}
			t.Logf("%d files there after the crash (%d closed, %d synced before it), %d without their data", last+1, closed+1, synced+1, lost)
			if tc.killServer {
				ctx := t.Context()
				if err := e.c.StartNode(ctx, owner); err != nil {
					t.Fatal(err)
				}
			}
			out, err := e.arbor("fsck", "default")
			if err != nil {
				for _, line := range strings.Split(out, "\n") {
					line = strings.TrimSpace(line)
					if strings.HasPrefix(line, "tract ") && strings.HasSuffix(line, "that no block references") {
						t.Logf("fsck: %s (a flush under way at the kill)", line)
						continue
					}
					if strings.HasPrefix(line, "file system ") || strings.HasPrefix(line, "pending:") ||
						strings.HasPrefix(line, "problems:") || strings.HasPrefix(line, "arbor: file system") || line == "" {
						continue
					}
					t.Errorf("fsck: %s", line)
				}
			}
		})
	}
}
