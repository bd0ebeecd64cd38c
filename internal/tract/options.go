package tract

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// OptionsEnv names the environment variable a node reads its tract store
// options from when --tract is not given (ParseOptions).
const OptionsEnv = "ARBOR_TRACT"

// Options are a node's tract store settings: the server's --tract flag
// (or its config file, or $ARBOR_TRACT), parsed by ParseOptions.
type Options struct {
	// TractSizeBytes is the tract size a directory leader gives the cluster
	// if it is not initialised yet (0: DefaultTractSizeBytes).
	TractSizeBytes uint64
	// Replication is the TLT's k the leader builds the table with (0:
	// DefaultReplication).
	Replication int
	// MinRows: see LayoutOptions.
	MinRows int
	// NoSync acknowledges writes before they are synced to disk.
	NoSync bool
	// Timing overrides (0: the defaults); mostly for tests.
	ScrubInterval, VerifyInterval, OrphanGrace, DropGrace, ReturnGrace time.Duration
	ManagerTick, ManagerSettle                                         time.Duration
}

// ParseOptions parses "key=value,..." with keys tract-size (bytes, with an
// optional KiB/MiB suffix), replication, min-rows, sync (true/false),
// scrub, verify, orphan-grace, drop-grace, return-grace, manager-tick and
// manager-settle (Go durations). An empty spec gives the defaults.
func ParseOptions(spec string) (Options, error) {
	var o Options
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return o, fmt.Errorf("%s: %q is not key=value", OptionsEnv, part)
		}
		var err error
		dur := func(d *time.Duration) {
			*d, err = time.ParseDuration(v)
			if err == nil && (*d < time.Millisecond || *d > 24*time.Hour) {
				err = fmt.Errorf("%v out of [1ms, 24h]", *d)
			}
		}
		switch k {
		case "tract-size":
			o.TractSizeBytes, err = ParseBytes(v)
			if err == nil && (o.TractSizeBytes < minTractSizeBytes || o.TractSizeBytes > maxTractSizeBytes || o.TractSizeBytes&(o.TractSizeBytes-1) != 0) {
				err = fmt.Errorf("must be a power of two in [%d, %d]", minTractSizeBytes, maxTractSizeBytes)
			}
		case "replication":
			o.Replication, err = strconv.Atoi(v)
			if err == nil && (o.Replication < 1 || o.Replication > maxReplication) {
				err = fmt.Errorf("must be in [1, %d]", maxReplication)
			}
		case "min-rows":
			o.MinRows, err = strconv.Atoi(v)
			if err == nil && (o.MinRows < 0 || o.MinRows > maxTLTRows) {
				err = fmt.Errorf("must be in [0, %d]", maxTLTRows)
			}
		case "sync":
			var b bool
			b, err = strconv.ParseBool(v)
			o.NoSync = !b
		case "scrub":
			dur(&o.ScrubInterval)
		case "verify":
			dur(&o.VerifyInterval)
		case "orphan-grace":
			dur(&o.OrphanGrace)
		case "drop-grace":
			dur(&o.DropGrace)
		case "return-grace":
			dur(&o.ReturnGrace)
		case "manager-tick":
			dur(&o.ManagerTick)
		case "manager-settle":
			dur(&o.ManagerSettle)
		default:
			return o, fmt.Errorf("%s: unknown key %q", OptionsEnv, k)
		}
		if err != nil {
			return o, fmt.Errorf("%s: %s=%s: %w", OptionsEnv, k, v, err)
		}
	}
	return o, nil
}

// ParseBytes reads a byte count: a number with an optional KiB, MiB or GiB
// suffix ("4MiB").
func ParseBytes(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		m      uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	return n * mult, nil
}
