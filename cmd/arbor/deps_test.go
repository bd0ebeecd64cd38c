package main

// Modules the project has chosen but whose users have not landed yet. A
// test-only import keeps them in go.mod (go mod tidy counts tests) without
// linking them into the arbor binary. Remove a line once real code uses it.
import (
	_ "github.com/hanwen/go-fuse/v2/fs" // FUSE mount (DESIGN §2.7)
)
