package testseed

import "testing"

func TestSeedFromTheEnvironment(t *testing.T) {
	t.Setenv(Env, "1234")
	if got := Seed(t); got != 1234 {
		t.Fatalf("seed %d, want 1234 from %s", got, Env)
	}
	t.Setenv(Env, "")
	a, b := Seed(t), Seed(t)
	if a == b {
		t.Fatalf("two random seeds are both %d", a)
	}
}
