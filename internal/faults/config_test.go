package faults

import (
	"strings"
	"testing"
	"time"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		in        string
		want      Config
		canonical string
	}{
		{"", Config{}, "off"},
		{"off", Config{}, "off"},
		{" none ", Config{}, "off"},
		{"fail=0.01", Config{FailRate: 0.01}, "fail=0.01"},
		{
			"fail=0.01,delay=0.05:1ms-20ms,dup=0.01,methods=REGEX,seed=7",
			Config{FailRate: 0.01, DelayRate: 0.05, DelayMin: time.Millisecond, DelayMax: 20 * time.Millisecond, DupRate: 0.01, Methods: "REGEX", Seed: 7},
			"fail=0.01,delay=0.05:1ms-20ms,dup=0.01,methods=REGEX,seed=7",
		},
		{"seed=3, dup=1 ,fail=0", Config{DupRate: 1, Seed: 3}, "dup=1,seed=3"},
		{"delay=1:5ms", Config{DelayRate: 1, DelayMin: 5 * time.Millisecond, DelayMax: 5 * time.Millisecond}, "delay=1:5ms"},
		{"delay=0:5ms-9ms", Config{}, "off"},
		{"methods=^/arbor\\.raft.*(Send|Snapshot)$", Config{Methods: "^/arbor\\.raft.*(Send|Snapshot)$"}, "methods=^/arbor\\.raft.*(Send|Snapshot)$"},
		{"methods=a=b", Config{Methods: "a=b"}, "methods=a=b"},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("Parse(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if s := got.String(); s != tc.canonical {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.in, s, tc.canonical)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct{ in, wantErr string }{
		{"fail", "not key=value"},
		{"=1", "not key=value"},
		{"fail=x", `"x" is not a number`},
		{"fail=1.5", "not in [0, 1]"},
		{"fail=-0.1", "not in [0, 1]"},
		{"fail=NaN", "not in [0, 1]"},
		{"dup=2", "not in [0, 1]"},
		{"fail=0.1,fail=0.2", "given twice"},
		{"drop=0.1", `unknown key "drop"`},
		{"delay=0.1", "no duration"},
		{"delay=0.1:abc", "bad duration"},
		{"delay=0.1:1ms-", "bad duration"},
		{"delay=0.1:20ms-1ms", "minimum 20ms is above maximum 1ms"},
		{"delay=0.1:1ms-31s", "above the limit"},
		{"methods=(", "methods:"},
		{"methods=a{1,2}", "not key=value"},
		{"seed=-1", "not an unsigned"},
		{strings.Repeat("x", maxConfigBytes+1), "more than the limit"},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in)
		if err == nil {
			t.Errorf("Parse(%q) = %+v, want error containing %q", tc.in, got, tc.wantErr)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("Parse(%q) error = %q, want it to contain %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestValidateRejectsHandBuiltConfigs(t *testing.T) {
	for _, c := range []Config{
		{FailRate: 2},
		{DelayRate: 0.5, DelayMin: -time.Millisecond, DelayMax: time.Millisecond},
		{Methods: "a,b"},
		{Methods: strings.Repeat("a", maxMethodsPatternBytes+1)},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want error", c)
		}
	}
}

// FuzzParse checks that Parse never panics and that every configuration it
// accepts survives a round trip through String.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "off", "fail=0.01,delay=0.05:1ms-20ms,dup=0.01,methods=REGEX,seed=7",
		"delay=1:5ms", "fail=1e-3", "methods=a=b", "seed=18446744073709551615", "fail=0x1p-2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse(%q) accepted an invalid config: %v", s, err)
		}
		again, err := Parse(c.String())
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", s, c.String(), err)
		}
		if again != c {
			t.Fatalf("round trip of %q: %+v became %+v via %q", s, c, again, c.String())
		}
	})
}
