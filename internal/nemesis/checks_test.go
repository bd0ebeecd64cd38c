package nemesis

import "testing"

// TestKnownIssue: a checker's output is excused only when every problem
// it lists is a known one; one unknown problem, or output without any
// problem line (the checker could not run), is not.
func TestKnownIssue(t *testing.T) {
	for _, tc := range []struct {
		out   string
		known bool
	}{
		{"exit status 1: TLT version 1: 70 rows\nproblem: blob 0000000000000001cdb9d50a569e8066: metadata on 3/0 differs from the primary's\narbor: verify: 1 problems", true},
		{"TLT version 7\nproblem: blob 00000000000000019640618a10b8496d: no record on the primary of its metadata row\narbor: verify: 1 problems", true},
		{"file system \"chaos\" (number 1): 1 views\npending: 0 orphans\nproblems: 1 dangling, 0 link counts, 0 leaked, 0 other\n  blob 00000000000000019640618a10b8496d is missing; 4 tracts of it are referenced\narbor: file system \"chaos\" has 1 problems", true},
		{"problem: blob 0000000000000001cdb9d50a569e8066: metadata on 3/0 differs from the primary's\nproblem: blob 0000000000000001cdb9d50a569e8066: tract 3 on 2/0 has a bad checksum", false},
		{"problems: 1 dangling, 0 link counts, 0 leaked, 0 other\n  inode 7 names a missing directory\n", false},
		{"arbor: connection refused", false},
		{"", false},
	} {
		if got := knownIssue(tc.out) != ""; got != tc.known {
			t.Errorf("knownIssue(%q) = %v, want %v", tc.out, got, tc.known)
		}
	}
}
