package faults

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Limits on a fault configuration.
const (
	// maxFaultDelay bounds an injected delay: longer ones look like hung
	// processes rather than slow networks, and would stall shutdown.
	maxFaultDelay = 30 * time.Second
	// maxMethodsPatternBytes bounds the methods regular expression.
	maxMethodsPatternBytes = 1024
	// maxConfigBytes bounds a whole configuration string.
	maxConfigBytes = 4096
)

// Config says which faults to inject. The zero Config injects nothing.
type Config struct {
	// FailRate is the probability that a call fails (request or reply lost,
	// half each) or that a stream message is dropped.
	FailRate float64
	// DelayRate is the probability that a call or message is delayed by a
	// uniformly random duration in [DelayMin, DelayMax].
	DelayRate          float64
	DelayMin, DelayMax time.Duration
	// DupRate is the probability that a call or message is sent twice.
	DupRate float64
	// Methods is a regular expression over full gRPC method names
	// ("/package.Service/Method"); only matching calls are faulted. Empty
	// matches every method.
	Methods string
	// Seed seeds the decisions. Zero asks the injector to pick one.
	Seed uint64
}

// Enabled reports whether c injects any fault.
func (c Config) Enabled() bool {
	return c.FailRate > 0 || c.DelayRate > 0 || c.DupRate > 0
}

// configKeys lists the keys of the text form, in canonical order.
var configKeys = []string{"fail", "delay", "dup", "methods", "seed"}

// Parse reads a configuration in the --faults / ARBOR_FAULTS syntax: a
// comma-separated list of key=value pairs, each key at most once:
//
//	fail=P             probability that a call or message fails
//	delay=P:MIN-MAX    probability of a delay, uniform in [MIN, MAX]
//	delay=P:D          probability of a delay of exactly D
//	dup=P              probability that a call or message is duplicated
//	methods=REGEX      only fault matching methods (no commas in REGEX)
//	seed=N             seed of the random decisions (default: random)
//
// for example "fail=0.01,delay=0.05:1ms-20ms,dup=0.01,seed=42". The empty
// string, "off" and "none" mean no faults. Probabilities are in [0, 1];
// durations use Go syntax ("250us", "20ms") and are at most 30s.
func Parse(s string) (Config, error) {
	var c Config
	if len(s) > maxConfigBytes {
		return Config{}, fmt.Errorf("faults: configuration is %d bytes, more than the limit of %d", len(s), maxConfigBytes)
	}
	s = strings.TrimSpace(s)
	if s == "" || s == "off" || s == "none" {
		return c, nil
	}
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		key, value, ok := strings.Cut(part, "=")
		if !ok || key == "" {
			return Config{}, fmt.Errorf("faults: %q is not key=value (keys: %s; a methods pattern cannot contain commas)",
				part, strings.Join(configKeys, ", "))
		}
		if seen[key] {
			return Config{}, fmt.Errorf("faults: %q given twice", key)
		}
		seen[key] = true
		var err error
		switch key {
		case "fail":
			c.FailRate, err = parseRate(value)
		case "dup":
			c.DupRate, err = parseRate(value)
		case "delay":
			c.DelayRate, c.DelayMin, c.DelayMax, err = parseDelay(value)
		case "methods":
			c.Methods = value
		case "seed":
			c.Seed, err = strconv.ParseUint(value, 10, 64)
			if err != nil {
				err = fmt.Errorf("%q is not an unsigned 64-bit integer", value)
			}
		default:
			return Config{}, fmt.Errorf("faults: unknown key %q (keys: %s)", key, strings.Join(configKeys, ", "))
		}
		if err != nil {
			return Config{}, fmt.Errorf("faults: %s: %w", key, err)
		}
	}
	if c.DelayRate == 0 {
		// A delay that never happens has no range worth keeping; dropping
		// it keeps Parse(c.String()) == c.
		c.DelayMin, c.DelayMax = 0, 0
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func parseRate(s string) (float64, error) {
	p, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	return p, checkRate(p)
}

func checkRate(p float64) error {
	if math.IsNaN(p) || p < 0 || p > 1 {
		return fmt.Errorf("probability %v is not in [0, 1]", p)
	}
	return nil
}

func parseDelay(s string) (rate float64, lo, hi time.Duration, err error) {
	rs, span, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, 0, fmt.Errorf("%q has no duration: use P:MIN-MAX or P:D", s)
	}
	if rate, err = parseRate(rs); err != nil {
		return 0, 0, 0, err
	}
	los, his, isRange := strings.Cut(span, "-")
	if lo, err = time.ParseDuration(los); err != nil {
		return 0, 0, 0, fmt.Errorf("bad duration %q: %w", los, err)
	}
	hi = lo
	if isRange {
		if hi, err = time.ParseDuration(his); err != nil {
			return 0, 0, 0, fmt.Errorf("bad duration %q: %w", his, err)
		}
	}
	return rate, lo, hi, nil
}

// Validate checks c's bounds. Parse validates; callers that build a Config
// by hand must call it before use.
func (c Config) Validate() error {
	var errs []error
	for _, r := range []struct {
		name string
		p    float64
	}{{"fail", c.FailRate}, {"delay", c.DelayRate}, {"dup", c.DupRate}} {
		if err := checkRate(r.p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
	}
	switch {
	case c.DelayMin < 0 || c.DelayMax < 0:
		errs = append(errs, fmt.Errorf("delay: negative duration %v-%v", c.DelayMin, c.DelayMax))
	case c.DelayMin > c.DelayMax:
		errs = append(errs, fmt.Errorf("delay: minimum %v is above maximum %v", c.DelayMin, c.DelayMax))
	case c.DelayMax > maxFaultDelay:
		errs = append(errs, fmt.Errorf("delay: maximum %v is above the limit of %v", c.DelayMax, maxFaultDelay))
	}
	if len(c.Methods) > maxMethodsPatternBytes {
		errs = append(errs, fmt.Errorf("methods: pattern is %d bytes, more than the limit of %d", len(c.Methods), maxMethodsPatternBytes))
	} else if strings.Contains(c.Methods, ",") {
		errs = append(errs, errors.New("methods: pattern cannot contain commas (use | for alternatives)"))
	} else if _, err := regexp.Compile(c.Methods); err != nil {
		errs = append(errs, fmt.Errorf("methods: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("faults: invalid configuration: %w", err)
	}
	return nil
}

// String returns c in canonical Parse syntax: keys in a fixed order, zero
// values left out, "off" for the zero Config. Parse(c.String()) == c for
// every valid c whose delay range is zero when its delay rate is.
func (c Config) String() string {
	var parts []string
	if c.FailRate > 0 {
		parts = append(parts, "fail="+formatRate(c.FailRate))
	}
	if c.DelayRate > 0 {
		d := "delay=" + formatRate(c.DelayRate) + ":" + c.DelayMin.String()
		if c.DelayMax != c.DelayMin {
			d += "-" + c.DelayMax.String()
		}
		parts = append(parts, d)
	}
	if c.DupRate > 0 {
		parts = append(parts, "dup="+formatRate(c.DupRate))
	}
	if c.Methods != "" {
		parts = append(parts, "methods="+c.Methods)
	}
	if c.Seed != 0 {
		parts = append(parts, "seed="+strconv.FormatUint(c.Seed, 10))
	}
	if len(parts) == 0 {
		return "off"
	}
	return strings.Join(parts, ",")
}

func formatRate(p float64) string { return strconv.FormatFloat(p, 'g', -1, 64) }
