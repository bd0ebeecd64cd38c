// Package testseed is the one seed of Arbor's randomised tests (issue 13
// item 7; STYLE.md: "seeded fault runs that replay"). Every test that draws
// random operations, faults or schedules takes its seed from Seed, so one
// variable, ARBOR_SEED, replays any of them:
//
//	ARBOR_SEED=1234 go test -run TestModelConcurrent ./internal/btree/
//
// A run prints its seed; a failure is replayed by setting it. Processes
// and goroutines still interleave as the machine schedules them, so a
// replay repeats the test's own decisions, not the whole history.
package testseed

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// Env is the variable that sets the seed.
const Env = "ARBOR_SEED"

// Seed returns the seed of a randomised test: ARBOR_SEED if set (a value
// that is not an unsigned integer fails the test), else a fresh random
// one. It logs the seed and how to replay it.
func Seed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv(Env); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q is not an unsigned integer: %v", Env, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, Env, seed)
	return seed
}
