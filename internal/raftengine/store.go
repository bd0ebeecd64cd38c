package raftengine

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"
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
}

// OpenStore opens (creating if needed) the pebble database in dir. fs nil
// means the real file system; tests pass vfs.NewMem().
func OpenStore(dir string, fs vfs.FS, logger *slog.Logger) (*Store, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := &pebble.Options{
		FS: fs,
		// IngestAndExcise, which installs snapshots atomically, needs at
		// least FormatVirtualSSTables.
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             pebbleLogger{logger.With("component", "pebble")},
	}
	opts.EnsureDefaults()
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create store directory: %w", err)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open pebble at %s: %w", dir, err)
	}
	s := &Store{DB: db, Options: opts, Dir: dir}
	// Staged snapshots left by a crash are garbage.
	_ = fs.RemoveAll(s.snapshotDir())
	if err := fs.MkdirAll(s.snapshotDir(), 0o755); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("create snapshot staging directory: %w", err)
	}
	return s, nil
}

func (s *Store) snapshotDir() string { return filepath.Join(s.Dir, "snapshots") }

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
	panic(fmt.Sprintf(format, args...))
}
