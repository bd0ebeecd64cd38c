//go:build !invariants

package invariants

// Enabled reports whether the expensive checks run (built with -tags
// invariants).
const Enabled = false
