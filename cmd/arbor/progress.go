package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/arbor-storage/arbor/internal/overview"

	"github.com/arbor-storage/arbor/internal/meta"
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
	// unit names what a server's job counts ("inodes", "steps"): set, the
	// line shows the count in it, with its rate and ETA, and a total of 0
	// as not known (startJobBar).
	unit string
	// finished: the job is done, however far its count got (a total it
	// never knew is reached).
	finished bool
	// base is the count when the current phase was first seen at start:
	// rates count from there.
	base int64

	mu    sync.Mutex
	done  int64
	drawn time.Time
	note  string
}

// progressUsage is the --progress flag's help, the same on every command.
const progressUsage = "progress on stderr: auto (on a terminal), always or never"

// waitingRedraw is how often a waiting line's clock is redrawn.
const waitingRedraw = time.Second

// startWaiting shows, while a step runs that reports no progress, that
// it is under way and for how long; stop ends the line. It draws nothing
// when disabled. It is startJobBar with no report ever coming.
func startWaiting(w io.Writer, mode progressMode, label string) (stop func()) {
	_, stop = startJobBar(w, mode, label)
	return stop
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
	if p.unit != "" {
		return p.jobLine()
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

// humanBytes prints a byte count with a binary unit, as the overview does.
func humanBytes(n int64) string { return overview.HumanBytes(n) }

// startJobBar shows the progress of a long request a server works on (a
// check, a deletion, a table move): the waiting line until the server's
// first report, then a bar of the current phase, with its rate and ETA
// when the server knows the phase's total, its count and rate when not:
//
//	fsck     [==========>                   ]  36%  1200 / 3300 inodes  850 inodes/s  ETA 2s  step 1/3 load
//
// watch takes the server's reports (meta.Client's *Watch calls); stop
// ends the line. It draws nothing when disabled.
func startJobBar(w io.Writer, mode progressMode, label string) (watch meta.Watch, stop func()) {
	p := newProgress(w, mode, label, 0, false)
	if !p.enabled {
		return nil, func() {}
	}
	p.waiting = true
	var phase string
	watch = func(jp meta.JobProgress) {
		p.mu.Lock()
		defer p.mu.Unlock()
		newPhase := false
		if key := fmt.Sprintf("%d %s", jp.Step, jp.Phase); p.waiting || key != phase {
			// A new phase counts from its start: its rate is its own.
			phase, p.waiting, newPhase = key, false, true
			p.start, p.base = time.Now(), int64(jp.Done)
		}
		p.unit = jp.Unit
		if p.unit == "" {
			p.unit = "items"
		}
		p.done, p.total, p.finished = int64(jp.Done), int64(jp.Total), jp.Finished
		p.note = ""
		if jp.Steps > 0 {
			p.note = fmt.Sprintf("step %d/%d %s", jp.Step, jp.Steps, jp.Phase)
		}
		p.drawLocked(jp.Finished || newPhase) // each phase shows, however short
	}
	p.mu.Lock()
	p.drawLocked(true)
	p.mu.Unlock()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(waitingRedraw)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			// The clock of the waiting line, the rate and ETA of a bar
			// move even between the server's reports.
			p.mu.Lock()
			p.drawLocked(true)
			p.mu.Unlock()
		}
	}()
	return watch, func() {
		close(done)
		wg.Wait()
		p.Finish()
	}
}

// jobLine is the line of a server's job (startJobBar).
func (p *progress) jobLine() string {
	total := p.total
	if p.finished {
		total = max(total, p.done) // all there was, counted or not
	}
	s := fmt.Sprintf("%-8s ", p.label)
	if total > 0 || p.finished {
		frac := 1.0
		if total > 0 {
			frac = min(float64(p.done)/float64(total), 1)
		}
		filled := int(frac * progressBarWidth)
		bar := strings.Repeat("=", filled)
		if filled < progressBarWidth {
			bar += ">" + strings.Repeat(" ", progressBarWidth-filled-1)
		}
		s += fmt.Sprintf("[%s] %3.0f%%  %d / %d %s", bar, 100*frac, p.done, total, p.unit)
	} else {
		s += fmt.Sprintf("%d %s", p.done, p.unit)
	}
	// A move's few steps have no rate worth showing.
	if p.unit != "steps" && !p.finished {
		if secs := time.Since(p.start).Seconds(); secs > 0.5 && p.done > p.base {
			rate := float64(p.done-p.base) / secs
			s += fmt.Sprintf("  %.0f %s/s", rate, p.unit)
			if total > 0 && p.done < total {
				s += fmt.Sprintf("  ETA %v", time.Duration(float64(total-p.done)/rate*float64(time.Second)).Round(time.Second))
			}
		}
	}
	if p.note != "" {
		s += "  " + p.note
	}
	return s
}

// longJobWatched runs job as longJob does, showing its progress as the
// server reports it (startJobBar) as the --progress value mode says; job
// passes the watch to the meta client's *Watch call (nil: not shown).
func (a *app) longJobWatched(ctx context.Context, mode, label string, job func(w meta.Watch) error) error {
	m, err := parseProgressMode(mode)
	if err != nil {
		return err
	}
	watch, stop := startJobBar(a.stderr, m, label)
	defer stop()
	return longJob(ctx, func() error { return job(watch) })
}
