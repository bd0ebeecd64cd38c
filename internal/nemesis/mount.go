package nemesis

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Bounds of the mount processes.
const (
	mountWait     = 2 * time.Minute
	unmountWait   = 30 * time.Second
	mountLogName  = "mount.log"
	mountPollTime = 100 * time.Millisecond
)

// mount is one `arbor mount` process.
type mount struct {
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	log  *slog.Logger
}

// startMount mounts file system fsName of the dev cluster in clusterDir at
// dir with `arbor mount` and waits until the kernel shows the mount.
func startMount(ctx context.Context, binary, clusterDir, fsName, dir string, log *slog.Logger) (*mount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if mounted(dir) { // left by an earlier run that was killed
		_ = exec.Command("fusermount3", "-uz", dir).Run()
	}
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-"+mountLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(binary, "mount", fsName, dir, "--dir", clusterDir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, and SIGTERM if we die: no mount outlives the
	// run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &mount{dir: dir, cmd: cmd, done: make(chan struct{}), log: log}
	go func() {
		_ = cmd.Wait()
		close(m.done)
	}()
	ctx, cancel := context.WithTimeout(ctx, mountWait)
	defer cancel()
	for !mounted(dir) {
		select {
		case <-m.done:
			return nil, fmt.Errorf("arbor mount exited: %v (see %s)", cmd.ProcessState, logf.Name())
		case <-ctx.Done():
			m.stop()
			return nil, fmt.Errorf("%s not mounted after %v (see %s)", dir, mountWait, logf.Name())
		case <-time.After(mountPollTime):
		}
	}
	log.Info("mounted", "dir", dir, "pid", cmd.Process.Pid)
	return m, nil
}

// stop unmounts: SIGTERM to the mount process (it unmounts and exits),
// then SIGKILL and a lazy unmount if it does not exit in time.
func (m *mount) stop() {
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(unmountWait):
		m.log.Warn("mount did not stop; killing it", "dir", m.dir, "pid", m.cmd.Process.Pid)
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	if mounted(m.dir) {
		if err := exec.Command("fusermount3", "-uz", m.dir).Run(); err != nil {
			m.log.Warn("unmount", "dir", m.dir, "err", err)
		}
	}
}

func (r *run) unmountAll() {
	for _, m := range r.mounts {
		m.stop()
	}
	r.mounts = nil
}

// mounted reports whether dir is a FUSE mount point.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		// id parent major:minor root mountpoint options ... - fstype ...
		if len(f) < 5 || f[4] != abs {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) && strings.HasPrefix(f[i+1], "fuse") {
				return true
			}
		}
	}
	return false
}
