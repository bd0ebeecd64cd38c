package nemesis

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Summary is what a run did and found.
type Summary struct {
	Seed   uint64
	Nodes  int
	Cycles int
	// CyclesRun is how many cycles ran (fewer than Cycles if interrupted).
	CyclesRun int
	// Duration is the whole run's, start-up and final checks included.
	Duration time.Duration

	log *slog.Logger // every finding is logged when found

	mu sync.Mutex
	// Ops counts workload operations by worker: acknowledged and failed.
	Ops map[string]*OpCount
	// Faults counts the faults injected, by kind.
	Faults map[string]int
	// Recovery holds, by fault kind, how long after the heal the cluster
	// was healthy and served every kind of request again.
	Recovery map[string][]Recovery
	// Checks holds each checker's runs.
	Checks map[string]*CheckStats
	// Acknowledged objects at the last check, and bank operations checked.
	Files, Blobs, Keys, BankOps int
	// Lost lists acknowledged data that did not read back; Failures every
	// other violated invariant.
	Lost, Failures []Finding
}

// OpCount counts one worker's operations.
type OpCount struct{ OK, Failed int }

// Recovery is one recovery's times, from the heal.
type Recovery struct{ Healthy, Serving time.Duration }

// CheckStats counts a checker's runs: how many passed at the first try,
// and the longest it took to pass (retries included).
type CheckStats struct {
	Runs, FirstTry int
	Longest        time.Duration
}

// Finding is one problem, in the cycle it was found.
type Finding struct {
	Cycle  int
	Kind   string
	Detail string
}

func newSummary(cfg Config) *Summary {
	return &Summary{log: cfg.Logger, Seed: cfg.Seed, Nodes: cfg.Nodes, Cycles: cfg.Cycles, Ops: map[string]*OpCount{},
		Faults: map[string]int{}, Recovery: map[string][]Recovery{}, Checks: map[string]*CheckStats{}}
}

// Failed reports whether the run found anything wrong.
func (s *Summary) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.Lost) > 0 || len(s.Failures) > 0
}

func (s *Summary) op(worker string, err error) {
	s.mu.Lock()
	c := s.Ops[worker]
	if c == nil {
		c = &OpCount{}
		s.Ops[worker] = c
	}
	if err == nil {
		c.OK++
	} else {
		c.Failed++
	}
	s.mu.Unlock()
	var le *lossError
	if errors.As(err, &le) {
		s.lose(-1, worker, le.what)
	}
}

func (s *Summary) fault(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Faults[kind]++
}

func (s *Summary) recovered(kind string, healthy, serving time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Recovery[kind] = append(s.Recovery[kind], Recovery{Healthy: healthy, Serving: serving})
}

func (s *Summary) check(name string, first bool, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.Checks[name]
	if c == nil {
		c = &CheckStats{}
		s.Checks[name] = c
	}
	c.Runs++
	if first {
		c.FirstTry++
	}
	c.Longest = max(c.Longest, took)
}

func (s *Summary) checked(files, blobs, keys, bankOps int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Files, s.Blobs, s.Keys = files, blobs, keys
	s.BankOps += bankOps
}

func (s *Summary) lose(cycle int, kind, detail string) {
	s.log.Error("nemesis: LOST", "cycle", cycle, "kind", kind, "detail", detail)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Lost = append(s.Lost, Finding{Cycle: cycle, Kind: kind, Detail: detail})
}

func (s *Summary) fail(cycle int, kind, detail string) {
	s.log.Error("nemesis: problem", "cycle", cycle, "kind", kind, "detail", detail)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Failures = append(s.Failures, Finding{Cycle: cycle, Kind: kind, Detail: detail})
}

// brief is a one-line state for the cycle lines.
func (s *Summary) brief() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok, failed := 0, 0
	for _, c := range s.Ops {
		ok += c.OK
		failed += c.Failed
	}
	return fmt.Sprintf("%d ops acknowledged, %d failed; %d files, %d blobs, %d keys checked; %d lost, %d other problems",
		ok, failed, s.Files, s.Blobs, s.Keys, len(s.Lost), len(s.Failures))
}

// Print writes the summary.
func (s *Summary) Print(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(w, "nemesis summary: seed %d, %d nodes, %d of %d cycles in %v\n", s.Seed, s.Nodes, s.CyclesRun, s.Cycles, s.Duration.Round(time.Second))
	fmt.Fprintf(w, "operations (acknowledged / failed):\n")
	for _, name := range slices.Sorted(maps.Keys(s.Ops)) {
		c := s.Ops[name]
		fmt.Fprintf(w, "  %-8s %7d / %d\n", name, c.OK, c.Failed)
	}
	fmt.Fprintf(w, "checked at the end: %d files (through both mounts), %d blobs, %d keys; %d bank operations checked for linearizability\n",
		s.Files, s.Blobs, s.Keys, s.BankOps)
	fmt.Fprintf(w, "faults and recovery (from the heal: healthy, serving KV, blob and file writes again; median / max):\n")
	for _, kind := range slices.Sorted(maps.Keys(s.Faults)) {
		rs := s.Recovery[kind]
		h := make([]time.Duration, len(rs))
		v := make([]time.Duration, len(rs))
		for i, r := range rs {
			h[i], v[i] = r.Healthy, r.Serving
		}
		fmt.Fprintf(w, "  %-11s %3d   healthy %s   serving %s\n", kind, s.Faults[kind], medMax(h), medMax(v))
	}
	fmt.Fprintf(w, "checks (runs, passed at the first try, longest until passed):\n")
	for _, name := range slices.Sorted(maps.Keys(s.Checks)) {
		c := s.Checks[name]
		fmt.Fprintf(w, "  %-11s %3d runs, %3d at the first try, longest %v\n", name, c.Runs, c.FirstTry, c.Longest.Round(time.Millisecond))
	}
	if len(s.Lost) == 0 {
		fmt.Fprintf(w, "lost: nothing\n")
	} else {
		fmt.Fprintf(w, "LOST (%d):\n", len(s.Lost))
		printFindings(w, s.Lost)
	}
	if len(s.Failures) == 0 {
		fmt.Fprintf(w, "other problems: none\n")
	} else {
		fmt.Fprintf(w, "OTHER PROBLEMS (%d):\n", len(s.Failures))
		printFindings(w, s.Failures)
	}
}

func printFindings(w io.Writer, fs []Finding) {
	const maxShown = 50
	for i, f := range fs {
		if i == maxShown {
			fmt.Fprintf(w, "  ... and %d more\n", len(fs)-maxShown)
			break
		}
		cycle := fmt.Sprintf("cycle %d", f.Cycle)
		if f.Cycle < 0 {
			cycle = "during the workload"
		}
		fmt.Fprintf(w, "  [%s] %s: %s\n", cycle, f.Kind, strings.ReplaceAll(f.Detail, "\n", "\n      "))
	}
}

func medMax(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("%v / %v", s[len(s)/2].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond))
}
