package fs

import (
	"context"
	"time"
)

// Early answers and replays (internal/meta doc.go, Early replies). A
// metadata server may answer an operation once it is applied to its
// cache, before it is durable; if the server then loses it (it dies, a
// commit is aborted), the client sends it again to whoever serves the
// table next, which must reproduce what the first run answered. The
// engine helps in three ways:
//
//   - WithOpTime fixes the time an operation stamps (the replay sends the
//     first run's), so a replayed create has the times the client saw.
//   - WithWant names the handle and blob a replayed create gave the first
//     time, which the replay takes again (allocWanted).
//   - WithEarly tells the engine its caller may be answered early: work
//     that must only follow a durable change (reclaiming an unlinked
//     file's tracts) goes to the background, whose transactions wait for
//     durability; and a transaction that drew ids from Config.Shared (a
//     draw a replay would not repeat) asks its store for a durable answer
//     (DurableTxn); and work that cannot be undone after a change
//     (emptying the tracts a block commit replaced) waits for the change
//     to be durable (afterDurable).

type opTimeKey struct{}

// WithOpTime returns ctx whose operations stamp t (as mtime, ctime ...)
// instead of the clock's time.
func WithOpTime(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, opTimeKey{}, t)
}

// opNow is the time an operation stamps.
func (f *FS) opNow(ctx context.Context) time.Time {
	if t, ok := ctx.Value(opTimeKey{}).(time.Time); ok {
		return t
	}
	return f.now()
}

// Want is what a replayed create must give: the first run's handle and,
// for a regular file, its blob, which must be one of the file system's
// own (its number in the GUID's first 8 bytes, as newGUID makes them):
// any other is refused with EINVAL.
type Want struct {
	Handle Handle
	Blob   GUID
}

type wantKey struct{}

// WithWant returns ctx for a replayed create that must give w.
func WithWant(ctx context.Context, w Want) context.Context {
	return context.WithValue(ctx, wantKey{}, w)
}

func wantOf(ctx context.Context) (Want, bool) {
	w, ok := ctx.Value(wantKey{}).(Want)
	return w, ok
}

type replayKey struct{}

// WithReplay returns ctx for an operation its session runs again because
// the server that answered it early lost it (meta's client replay). Its
// session held what it touched then: a data commit to a file orphaned
// while open, whose orphan record names no session (it was unlinked at an
// owner that did not know the opens yet), is taken from it although the
// owner has not heard of the open yet (the session tells it after its
// replays, and no such orphan is reclaimed before every session has).
func WithReplay(ctx context.Context) context.Context {
	return context.WithValue(ctx, replayKey{}, true)
}

func isReplay(ctx context.Context) bool {
	r, _ := ctx.Value(replayKey{}).(bool)
	return r
}

type earlyKey struct{}

// WithEarly returns ctx for an operation whose caller may be answered
// before its writes are durable.
func WithEarly(ctx context.Context) context.Context {
	return context.WithValue(ctx, earlyKey{}, true)
}

func isEarly(ctx context.Context) bool {
	e, _ := ctx.Value(earlyKey{}).(bool)
	return e
}

// DurableTxn is implemented by a MetaTxn whose store may answer before
// its commit is durable: RequireDurable says this transaction's caller
// must not be answered before (a replay could not reproduce it).
type DurableTxn interface {
	RequireDurable()
}

// requireDurable asks tx's store, if it answers early, not to.
func requireDurable(tx MetaTxn) {
	if d, ok := tx.(DurableTxn); ok {
		d.RequireDurable()
	}
}

// DurableWaiter is implemented by a MetaStore that may answer early:
// WaitDurable returns once every write it applied before the call is
// durable (an error: some may never be).
type DurableWaiter interface {
	WaitDurable(ctx context.Context) error
}

// afterDurable runs fn, work that must follow the operation's writes and
// cannot be undone, now, or for an operation answered early in the
// background once the store says its writes are durable. If they never
// are, fn does not run: what it does is queued durably by those writes
// (tracts to free) for the background passes.
func (f *FS) afterDurable(ctx context.Context, fn func(ctx context.Context)) {
	w, ok := f.meta.(DurableWaiter)
	if !isEarly(ctx) || !ok {
		fn(ctx)
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), durableWait)
		defer cancel()
		if w.WaitDurable(ctx) == nil {
			fn(ctx)
		}
	}()
}

// freeTractsWhenDurable frees the tracts of es once the operation that
// queued them is durable. With none to free it does nothing: a waiter
// would make the store commit at once (WaitDurable hurries it), and a
// commit per flush would undo the store's group commit.
func (f *FS) freeTractsWhenDurable(ctx context.Context, es []blockEntry) {
	if len(es) == 0 {
		return
	}
	f.afterDurable(ctx, func(ctx context.Context) { f.freeTracts(ctx, es) })
}

// durableWait bounds afterDurable's background work.
const durableWait = time.Minute
