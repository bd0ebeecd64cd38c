package devcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-storage/arbor/internal/server"
)

// logTailLines is how much of a node's log an error about it quotes.
const logTailLines = 25

// process is one running `arbor server`.
type process struct {
	id  uint64
	cmd *exec.Cmd
	log *os.File
	// done is closed when the process has exited; exitErr is its Wait
	// error then.
	done    chan struct{}
	exitErr error
	// expected is set before the cluster signals the process, so its exit
	// is not reported as unexpected.
	expected bool
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// spawner starts processes from one locked OS thread. The parent-death
// signal (Pdeathsig) fires when the thread that forked a child exits, not
// the process; Go may retire threads, so every child is forked from this
// thread, which lives as long as the Cluster.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for r := range s.reqs {
			r.done <- r.cmd.Start()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	s.reqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

func (s *spawner) close() { close(s.reqs) }

// serverSysProcAttr puts a node in its own process group (a Ctrl-C in the
// terminal reaches only arbor dev, which then stops the nodes in order)
// and has the kernel send it SIGTERM if its owner dies.
func serverSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}

// arborServerPID returns the pid recorded in dataDir/arbor.pid if that
// process is alive and is an `arbor server` of exactly that data dir; a
// pid file left by a killed server (or whose pid was reused) gives 0.
func arborServerPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, server.PIDFileName))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if !isArborServer(pid, dataDir) {
		return 0
	}
	return pid
}

// isArborServer reports whether pid is a live (not zombie) process whose
// command line is `.../arbor* server ... --data-dir=dataDir ...`.
func isArborServer(pid int, dataDir string) bool {
	if !alive(pid) {
		return false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if len(args) < 2 || !strings.HasPrefix(filepath.Base(args[0]), "arbor") {
		return false
	}
	server, dir := false, false
	for i, a := range args[1:] {
		switch {
		case a == "server":
			server = true
		case a == "--data-dir="+dataDir:
			dir = true
		case a == "--data-dir" && i+2 < len(args) && args[i+2] == dataDir:
			dir = true
		}
	}
	return server && dir
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// stopForeign stops a process that is not our child: SIGTERM, then SIGKILL
// after timeout, polling until it is gone.
func stopForeign(pid int, timeout time.Duration) error {
	const pollInterval = 20 * time.Millisecond
	if err := unix.Kill(pid, unix.SIGTERM); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill pid %d: %w", pid, err)
			}
			deadline = time.Now().Add(timeout)
		}
		time.Sleep(pollInterval)
	}
	return nil
}

// logTail returns the last n lines of the file at path.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
