package raftengine

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Store is a node's pebble database together with what the engine needs to
// write snapshot files the database can ingest.
type Store struct {
	DB      *pebble.DB
	Options *pebble.Options
	// Dir is the database directory; incoming snapshots are staged in
	// Dir/snapshots on the same file system.
	Dir string

	disk *diskGuard
}

// StoreOptions are OpenStoreWith's.
type StoreOptions struct {
	// FS nil means the real file system; tests pass vfs.NewMem().
	FS     vfs.FS
	Logger *slog.Logger
	// BallastBytes is the space the store keeps in reserve against a
	// full disk (diskfull.go); 0: none, and a full disk stops the node.
	BallastBytes int64
}

// Sizes of a node's pebble database: its block cache, and each memtable
// (fewer, larger flushes: the raft log and the state machines' writes are
// mostly overwritten or deleted before they reach the lower levels).
const (
	storeCacheBytes    = 128 << 20
	storeMemTableBytes = 32 << 20
)

// OpenStore opens (creating if needed) the pebble database in dir, with
// no ballast. fs nil means the real file system; tests pass vfs.NewMem().
func OpenStore(dir string, fs vfs.FS, logger *slog.Logger) (*Store, error) {
	return OpenStoreWith(dir, StoreOptions{FS: fs, Logger: logger})
}

// OpenStoreWith opens (creating if needed) the pebble database in dir.
func OpenStoreWith(dir string, o StoreOptions) (*Store, error) {
	fs, logger := o.FS, o.Logger
	if fs == nil {
		fs = vfs.Default
	}
	if logger == nil {
		logger = slog.Default()
	}
	disk := newDiskGuard(fs, dir, o.BallastBytes, logger.With("component", "disk"))
	dbFS := fs
	if o.BallastBytes > 0 {
		dbFS = vfs.OnDiskFull(fs, func() { disk.enterFull("a write failed: no space left on the device") })
	}
	opts := &pebble.Options{
		FS: dbFS,
		// IngestAndExcise, which installs snapshots atomically, needs at
		// least FormatVirtualSSTables.
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{logger.With("component", "pebble")},
		CacheSize:          storeCacheBytes,
		MemTableSize:       storeMemTableBytes,
	}
	// The state machines look up keys that are mostly absent (page and
	// block locks of the extent store): bloom filters answer those without
	// reading every level. Blocks are stored uncompressed: on these nodes
	// CPU, not disk space, is what runs out first (a profile of the extent
	// store's apply showed compaction's snappy and reads' decompression at
	// a third of the leader's CPU).
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
	}
	opts.EnsureDefaults()
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	disk.start(context.Background())
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open pebble at %s: %w", dir, err)
	}
	s := &Store{DB: db, Options: opts, Dir: dir, disk: disk}
	// Staged snapshots left by a crash are garbage.
	_ = fs.RemoveAll(s.snapshotDir())
	if err := fs.MkdirAll(s.snapshotDir(), 0o755); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create snapshot staging directory: %w", err)
	}
	return s, nil
}

func (s *Store) snapshotDir() string { return filepath.Join(s.Dir, "snapshots") }

// Full reports whether the store's disk is full (diskfull.go): the node
// must not take new writes.
func (s *Store) Full() bool { return s.disk != nil && s.disk.full.Load() }

// Close closes the database.
func (s *Store) Close() error { return s.DB.Close() }

type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug(fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
	panic(&StoreFatalError{Msg: fmt.Sprintf(format, args...)})
}

// StoreFatalError is the value the node's store panics with when pebble
// gives up on it (its logger's Fatalf: a failed commit, a full disk, a
// corrupt file): the database cannot be used any more, and the node must
// stop (fail-stop) rather than serve on. It is a type of its own so that
// whoever recovers a panic (the node's gRPC handlers) tells it from a bug
// with errors.As, not by the message's text.
type StoreFatalError struct {
	// Msg is pebble's message.
	Msg string
}

func (e *StoreFatalError) Error() string { return "store failed: " + e.Msg }
