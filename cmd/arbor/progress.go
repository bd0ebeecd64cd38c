package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progressRedraw is the least time between two redraws of a progress bar.
const progressRedraw = 200 * time.Millisecond

// progressBarWidth is the width of the bar itself, in characters.
const progressBarWidth = 30

// progress draws a one-line progress bar on a terminal:
//
//	put  [=============>                ]  45%  460.0 MiB / 1.0 GiB  85.3 MiB/s  ETA 7s
//
// It draws nothing when disabled (the stream is not a terminal and no one
// asked for it), so scripts and tests see only the command's output.
type progress struct {
	w       io.Writer
	label   string
	total   int64
	bytes   bool
	enabled bool
	start   time.Time

	// waiting: no progress is known, only that a step is under way
	// (startWaiting).
	waiting bool

	mu    sync.Mutex
	done  int64
	drawn time.Time
	note  string
}

// progressUsage is the --progress flag's help, the same on every command.
const progressUsage = "progress on stderr: auto (on a terminal), always or never"

// waitingRedraw is how often a waiting line's clock is redrawn.
const waitingRedraw = time.Second

// startWaiting shows, while a step runs that reports no progress (the
// server's fsck, a deletion, a table move), that it is under way and for
// how long; stop ends the line. It draws nothing when disabled.
func startWaiting(w io.Writer, mode progressMode, label string) (stop func()) {
	p := newProgress(w, mode, label, 0, false)
	if !p.enabled {
		return func() {}
	}
	p.waiting = true
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(waitingRedraw)
		defer t.Stop()
		for {
			p.mu.Lock()
			p.drawLocked(true)
			p.mu.Unlock()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		p.Finish()
	}
}

// progressMode is the --progress flag: auto (on a terminal), always, never.
type progressMode string

// parseProgressMode reads a --progress flag's value.
func parseProgressMode(s string) (progressMode, error) {
	switch s {
	case "auto", "always", "never":
		return progressMode(s), nil
	}
	return "", fmt.Errorf("--progress %q: want auto, always or never", s)
}

func (m progressMode) enabled(w io.Writer) bool {
	switch m {
	case "always":
		return true
	case "never":
		return false
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func newProgress(w io.Writer, mode progressMode, label string, total int64, bytes bool) *progress {
	return &progress{w: w, label: label, total: total, bytes: bytes, enabled: mode.enabled(w), start: time.Now()}
}

// Add advances the bar by n.
func (p *progress) Add(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.drawLocked(false)
}

// Set sets the bar's position and total (a total of 0 keeps the old one)
// and a note printed after it.
func (p *progress) Set(done, total int64, note string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.note = done, note
	if total > 0 {
		p.total = total
	}
	p.drawLocked(false)
}

// Finish draws the final state and ends the line.
func (p *progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.enabled {
		return
	}
	p.drawLocked(true)
	fmt.Fprintln(p.w)
}

func (p *progress) drawLocked(force bool) {
	if !p.enabled || (!force && time.Since(p.drawn) < progressRedraw) {
		return
	}
	p.drawn = time.Now()
	fmt.Fprint(p.w, "\r"+p.line()+"\033[K")
}

func (p *progress) line() string {
	if p.waiting {
		return fmt.Sprintf("%-8s waiting for the cluster  %v", p.label, time.Since(p.start).Round(time.Second))
	}
	frac := 0.0
	if p.total > 0 {
		frac = min(float64(p.done)/float64(p.total), 1)
	}
	filled := int(frac * progressBarWidth)
	bar := strings.Repeat("=", filled)
	if filled < progressBarWidth {
		bar += ">" + strings.Repeat(" ", progressBarWidth-filled-1)
	}
	elapsed := time.Since(p.start)
	s := fmt.Sprintf("%-8s [%s] %3.0f%%  ", p.label, bar, 100*frac)
	if p.bytes {
		s += fmt.Sprintf("%s / %s", humanBytes(p.done), humanBytes(p.total))
		if secs := elapsed.Seconds(); secs > 0.5 {
			rate := float64(p.done) / secs
			s += fmt.Sprintf("  %s/s", humanBytes(int64(rate)))
			if rate > 0 && p.done < p.total {
				s += fmt.Sprintf("  ETA %v", time.Duration(float64(p.total-p.done)/rate*float64(time.Second)).Round(time.Second))
			}
		}
	} else {
		s += fmt.Sprintf("%d / %d", p.done, p.total)
	}
	if p.note != "" {
		s += "  " + p.note
	}
	return s
}

// humanBytes prints a byte count with a binary unit.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
