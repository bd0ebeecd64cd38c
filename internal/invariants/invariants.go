// Package invariants switches on Arbor's expensive self-checks (STYLE.md
// §7, after pebble's internal/invariants): built with `-tags invariants`,
// Enabled is true and the layers run their whole-state checkers after
// every commit, panicking on the first violation:
//
//   - the directory: its state's invariants (doc.go, checkInvariants)
//     after every applied command;
//   - the B-tree: Tree.Check (fences, heights, order, ownership) after
//     every committed transaction of a Tree.
//
// Without the tag Enabled is a false constant and the checks compile
// away. `make test-invariants` runs the packages' tests with the tag.
package invariants
