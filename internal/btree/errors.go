package btree

import (
	"errors"
	"fmt"
)

// Errors of the B-tree API. Bad input is refused before anything is read
// or written, so it changes nothing.
var (
	// ErrKeyTooLarge: a key longer than the tree's MaxKeyBytes.
	ErrKeyTooLarge = errors.New("btree: key too large")
	// ErrValueTooLarge: a value longer than the tree's MaxValueBytes.
	ErrValueTooLarge = errors.New("btree: value too large")
	// ErrTooManyValues: a transaction touching more than MaxTxnValues
	// values (keys, scanned pages, non-tree pages, block allocations and
	// frees).
	ErrTooManyValues = errors.New("btree: too many values in one transaction")
	// ErrBadRange: a scan whose end is before its start.
	ErrBadRange = errors.New("btree: bad key range")
	// ErrTxnDone: a transaction used after its function returned.
	ErrTxnDone = errors.New("btree: transaction already finished")
	// ErrGaveUp: a transaction kept failing for retryable reasons until
	// its attempts or its deadline ran out; it wraps the last failure.
	ErrGaveUp = errors.New("btree: transaction gave up")
	// ErrCorrupt: the tree's structure is broken in a way no retry fixes
	// (Check reports these).
	ErrCorrupt = errors.New("btree: corrupt tree")
	// ErrNotFound: Get of a missing key, for callers that want an error.
	ErrNotFound = errors.New("btree: key not found")
)

// errRetry marks a failure that the transaction loop handles by running the
// transaction again: a page that failed validation, a conflict, a stale
// pointer. It is never returned to users except wrapped in ErrGaveUp.
type errRetry struct {
	reason string
	err    error
}

func (e *errRetry) Error() string {
	if e.err == nil {
		return "retry: " + e.reason
	}
	return fmt.Sprintf("retry: %s: %v", e.reason, e.err)
}

func (e *errRetry) Unwrap() error { return e.err }

func retry(reason string, err error) error { return &errRetry{reason: reason, err: err} }

// errNeedSplit is the sticky error of a transaction whose insert did not
// fit its leaf: the loop splits the leaf in its own transaction and runs
// the transaction again (FSS §5).
type errNeedSplit struct {
	ref    PageRef
	height int
	lo     []byte
	key    []byte
	// sep, if set, is where to cut a leaf that a transaction's own
	// writes fill: the middle of the page as the transaction would leave
	// it, not of the page as stored (which may hold little).
	sep []byte
}

func (e *errNeedSplit) Error() string {
	return fmt.Sprintf("page %v (height %d) is full for key %q", e.ref, e.height, e.key)
}
