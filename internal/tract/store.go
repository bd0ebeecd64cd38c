package tract

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Keys of the tract store in the node's pebble database (prefix 't'; see the
// package doc):
//
//	t m <disk:4> <guid:16> <tract:8>   TractMeta
//	t d <disk:4> <guid:16> <tract:8>   data of an embedded (small) tract
//	t r <disk:4> <row:4>               RowSync
//	t u <disk:4> <guid:16> <tract:8>   empty: stored as primary, not yet known forwarded
//
// Tract numbers are stored with the sign bit flipped, so the metadata tract
// (-1) sorts before tract 0.
const (
	keyPrefix    = 't'
	kindTract    = 'm'
	kindData     = 'd'
	kindRowSync  = 'r'
	kindUnfwd    = 'u'
	tractsSubdir = "tracts"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C every tract carries.
func Checksum(data []byte) uint32 { return crc32.Checksum(data, crcTable) }

// tractKey names one tract of one blob.
type tractKey struct {
	guid  GUID
	tract int64
}

func (k tractKey) String() string { return fmt.Sprintf("%s/%d", k.guid, k.tract) }

func (k tractKey) less(o tractKey) bool {
	if c := bytes.Compare(k.guid[:], o.guid[:]); c != 0 {
		return c < 0
	}
	return k.tract < o.tract
}

func diskPrefix(kind byte, disk uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{keyPrefix, kind}, disk)
}

func tractMetaKey(disk uint32, k tractKey) []byte {
	b := diskPrefix(kindTract, disk)
	b = append(b, k.guid[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(k.tract)^(1<<63))
}

func unforwardedKey(disk uint32, k tractKey) []byte {
	b := append(diskPrefix(kindUnfwd, disk), k.guid[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(k.tract)^(1<<63))
}

func rowSyncKey(disk uint32, row uint32) []byte {
	return binary.BigEndian.AppendUint32(diskPrefix(kindRowSync, disk), row)
}

func prefixUpperBound(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// ErrCorrupt says a stored tract failed its checksum.
var ErrCorrupt = errors.New("tract failed its checksum")

// Store is one disk's tracts: data in files under DISK/tracts (one file per
// version of a tract, named by its stamp, so a small tract costs its size),
// records in pebble, and every record cached in memory (FDS §2.1: a disk
// holds about a million tracts, so all their metadata fits). A tract of at
// most embedBytes keeps its data in pebble next to its record instead
// (Embedded): one synced write, no file to create and sync (a small file
// written through the file system costs a third of the time).
//
// The order of a write makes a crash at any point harmless: the new file
// is written (and synced) first, then the record that names it, then the
// old file is removed. A file no record names is garbage the scrubber
// removes; a record always names a complete file. An embedded tract's
// data and record are one atomic batch.
//
// Stored *TractMeta values are never modified: a change stores a new one.
type Store struct {
	disk uint32
	dir  string
	fs   vfs.FS
	db   *pebble.DB
	sync bool
	// embedBytes: tracts of at most this many bytes are embedded (0:
	// none).
	embedBytes int

	mu      sync.RWMutex
	tracts  map[tractKey]*tpb.TractMeta
	byRow   map[uint32]map[tractKey]struct{}
	rowSync map[uint32]*tpb.RowSync
	bytes   uint64
	dirs    map[string]bool
	// unforwarded mirrors the durable marks of versions stored as a
	// row's primary and not yet known to be on its other members.
	unforwarded map[tractKey]bool
}

// OpenStore opens disk number disk at path: its records from db (shared
// with the rest of the node) and its files through fs. syncWrites makes
// every write durable before it is acknowledged (fsync of the file, synced
// pebble commit). Tracts of at most embedBytes (0: none) are kept in db.
func OpenStore(disk uint32, path string, fs vfs.FS, db *pebble.DB, syncWrites bool, embedBytes int) (*Store, error) {
	s := &Store{
		disk: disk, dir: fs.PathJoin(path, tractsSubdir), fs: fs, db: db, sync: syncWrites, embedBytes: max(embedBytes, 0),
		tracts: map[tractKey]*tpb.TractMeta{}, byRow: map[uint32]map[tractKey]struct{}{},
		rowSync: map[uint32]*tpb.RowSync{}, dirs: map[string]bool{}, unforwarded: map[tractKey]bool{},
	}
	if err := fs.MkdirAll(s.dir, 0o755); err != nil {
		return nil, fmt.Errorf("tract store %s: %w", s.dir, err)
	}
	if err := s.load(); err != nil {
		return nil, fmt.Errorf("tract store %s: %w", s.dir, err)
	}
	return s, nil
}

func (s *Store) load() error {
	lower := diskPrefix(kindTract, s.disk)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixUpperBound(lower)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(lower):]
		if len(k) != 24 {
			it.Close()
			return fmt.Errorf("malformed tract key %x", it.Key())
		}
		var tk tractKey
		copy(tk.guid[:], k[:16])
		tk.tract = int64(binary.BigEndian.Uint64(k[16:]) ^ (1 << 63))
		m := &tpb.TractMeta{}
		if err := proto.Unmarshal(it.Value(), m); err != nil {
			it.Close()
			return fmt.Errorf("tract %s: %w", tk, err)
		}
		s.index(tk, m)
	}
	if err := it.Close(); err != nil {
		return err
	}
	lower = diskPrefix(kindUnfwd, s.disk)
	it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixUpperBound(lower)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(lower):]
		if len(k) != 24 {
			it.Close()
			return fmt.Errorf("malformed unforwarded key %x", it.Key())
		}
		var tk tractKey
		copy(tk.guid[:], k[:16])
		tk.tract = int64(binary.BigEndian.Uint64(k[16:]) ^ (1 << 63))
		s.unforwarded[tk] = true
	}
	if err := it.Close(); err != nil {
		return err
	}
	lower = diskPrefix(kindRowSync, s.disk)
	it, err = s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixUpperBound(lower)})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()[len(lower):]
		if len(k) != 4 {
			return fmt.Errorf("malformed row key %x", it.Key())
		}
		rs := &tpb.RowSync{}
		if err := proto.Unmarshal(it.Value(), rs); err != nil {
			return fmt.Errorf("row %d: %w", binary.BigEndian.Uint32(k), err)
		}
		s.rowSync[binary.BigEndian.Uint32(k)] = rs
	}
	return nil
}

// index adds a record to the caches; s.mu must be held (or not yet shared).
func (s *Store) index(k tractKey, m *tpb.TractMeta) {
	if old, ok := s.tracts[k]; ok {
		s.bytes -= uint64(old.Length)
		if rows := s.byRow[old.Row]; rows != nil {
			delete(rows, k)
			if len(rows) == 0 {
				delete(s.byRow, old.Row)
			}
		}
	}
	s.tracts[k] = m
	s.bytes += uint64(m.Length)
	rows := s.byRow[m.Row]
	if rows == nil {
		rows = map[tractKey]struct{}{}
		s.byRow[m.Row] = rows
	}
	rows[k] = struct{}{}
}

func (s *Store) unindex(k tractKey) {
	old, ok := s.tracts[k]
	if !ok {
		return
	}
	delete(s.tracts, k)
	s.bytes -= uint64(old.Length)
	if rows := s.byRow[old.Row]; rows != nil {
		delete(rows, k)
		if len(rows) == 0 {
			delete(s.byRow, old.Row)
		}
	}
}

// Get returns the record of a tract.
func (s *Store) Get(k tractKey) (*tpb.TractMeta, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.tracts[k]
	return m, ok
}

// fileName is the data file of one version of a tract.
func (s *Store) fileName(k tractKey, st *tpb.Stamp) string {
	g := k.guid.String()
	return s.fs.PathJoin(s.dir, g[:2], g+"."+strconv.FormatInt(k.tract, 10)+"."+
		strconv.FormatUint(st.GetRowVersion(), 10)+"."+strconv.FormatUint(st.GetSeq(), 10))
}

// parseFileName is the inverse of fileName's last element.
func parseFileName(name string) (tractKey, *tpb.Stamp, bool) {
	parts := strings.Split(name, ".")
	if len(parts) != 4 {
		return tractKey{}, nil, false
	}
	g, err := ParseGUID(parts[0])
	if err != nil {
		return tractKey{}, nil, false
	}
	t, err1 := strconv.ParseInt(parts[1], 10, 64)
	v, err2 := strconv.ParseUint(parts[2], 10, 64)
	q, err3 := strconv.ParseUint(parts[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return tractKey{}, nil, false
	}
	return tractKey{guid: g, tract: t}, &tpb.Stamp{RowVersion: v, Seq: q}, true
}

func tractDataKey(disk uint32, k tractKey) []byte {
	b := append(diskPrefix(kindData, disk), k.guid[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(k.tract)^(1<<63))
}

// ReadData reads a data tract's bytes and checks them against the record.
func (s *Store) ReadData(k tractKey, m *tpb.TractMeta) ([]byte, error) {
	if m.Blob != nil || m.Length == 0 {
		return nil, nil
	}
	if m.Embedded {
		v, closer, err := s.db.Get(tractDataKey(s.disk, k))
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, fmt.Errorf("tract %s: embedded data missing: %w", k, ErrCorrupt)
		}
		if err != nil {
			return nil, fmt.Errorf("tract %s: %w", k, err)
		}
		data := bytes.Clone(v)
		closer.Close()
		if len(data) != int(m.Length) || Checksum(data) != m.Crc32C {
			return nil, fmt.Errorf("tract %s: %d embedded bytes with checksum %08x, recorded %d with %08x: %w", k, len(data), Checksum(data), m.Length, m.Crc32C, ErrCorrupt)
		}
		return data, nil
	}
	f, err := s.fs.Open(s.fileName(k, m.Stamp))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("tract %s: data file is missing: %w", k, ErrCorrupt)
		}
		return nil, fmt.Errorf("tract %s: %w", k, err)
	}
	defer f.Close()
	data := make([]byte, m.Length)
	n, err := io.ReadFull(f, data)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("tract %s: read: %w", k, err)
	}
	if n != int(m.Length) {
		return nil, fmt.Errorf("tract %s: %d of %d bytes on disk: %w", k, n, m.Length, ErrCorrupt)
	}
	if Checksum(data) != m.Crc32C {
		return nil, fmt.Errorf("tract %s: checksum %08x, recorded %08x: %w", k, Checksum(data), m.Crc32C, ErrCorrupt)
	}
	return data, nil
}

// Put stores a version of a tract: data (which must match m's length and
// checksum) for a data tract, nothing but the record for the metadata
// tract. It replaces the previous version. The caller serialises Puts of
// one tract.
func (s *Store) Put(k tractKey, m *tpb.TractMeta, data []byte) error {
	return s.put(k, m, data, false)
}

// PutUnforwarded is Put for a row's primary, which stores a version before
// it forwards it: the record and a mark saying the version may be missing
// on the row's other members are one batch, so a primary that crashes
// before (or while) forwarding knows after its restart what to forward
// again. Forwarded removes the mark.
func (s *Store) PutUnforwarded(k tractKey, m *tpb.TractMeta, data []byte) error {
	return s.put(k, m, data, true)
}

func (s *Store) put(k tractKey, m *tpb.TractMeta, data []byte, unforwarded bool) error {
	if m.Blob == nil {
		if len(data) != int(m.Length) || Checksum(data) != m.Crc32C {
			return fmt.Errorf("tract %s: data does not match its record (%d bytes, want %d)", k, len(data), m.Length)
		}
	}
	old, hadOld := s.Get(k)
	embed := m.Blob == nil && m.Length > 0 && int(m.Length) <= s.embedBytes
	if m.Embedded != embed {
		m = proto.Clone(m).(*tpb.TractMeta) // stored records are never modified
		m.Embedded = embed
	}
	if m.Blob == nil && m.Length > 0 && !embed {
		if err := s.writeFile(s.fileName(k, m.Stamp), data); err != nil {
			return fmt.Errorf("tract %s: %w", k, err)
		}
	}
	val, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.Set(tractMetaKey(s.disk, k), val, nil); err != nil {
		return err
	}
	switch {
	case embed:
		if err := b.Set(tractDataKey(s.disk, k), data, nil); err != nil {
			return err
		}
	case hadOld && old.Embedded:
		if err := b.Delete(tractDataKey(s.disk, k), nil); err != nil {
			return err
		}
	}
	if unforwarded {
		if err := b.Set(unforwardedKey(s.disk, k), nil, nil); err != nil {
			return err
		}
	}
	if err := b.Commit(s.writeOpts()); err != nil {
		return fmt.Errorf("tract %s: record: %w", k, err)
	}
	s.mu.Lock()
	s.index(k, m)
	if unforwarded {
		s.unforwarded[k] = true
	}
	s.mu.Unlock()
	if hadOld && old.Blob == nil && old.Length > 0 && !old.Embedded && !proto.Equal(old.Stamp, m.Stamp) {
		if err := s.fs.Remove(s.fileName(k, old.Stamp)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("tract %s: remove the old version: %w", k, err)
		}
	}
	return nil
}

func (s *Store) writeOpts() *pebble.WriteOptions {
	if s.sync {
		return pebble.Sync
	}
	return pebble.NoSync
}

func (s *Store) writeFile(name string, data []byte) error {
	dir := s.fs.PathDir(name)
	s.mu.RLock()
	made := s.dirs[dir]
	s.mu.RUnlock()
	if !made {
		if err := s.fs.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		s.mu.Lock()
		s.dirs[dir] = true
		s.mu.Unlock()
	}
	f, err := s.fs.Create(name, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	// vfs.File.Write may modify its argument; the caller's buffer is not
	// ours to change.
	if _, err := f.Write(append([]byte(nil), data...)); err != nil {
		f.Close()
		return err
	}
	if s.sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// Delete removes a tract (record, then file).
func (s *Store) Delete(k tractKey) error {
	old, ok := s.Get(k)
	if !ok {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	if err := b.Delete(tractMetaKey(s.disk, k), nil); err != nil {
		return err
	}
	if old.Embedded {
		if err := b.Delete(tractDataKey(s.disk, k), nil); err != nil {
			return err
		}
	}
	s.mu.RLock()
	marked := s.unforwarded[k]
	s.mu.RUnlock()
	if marked {
		if err := b.Delete(unforwardedKey(s.disk, k), nil); err != nil {
			return err
		}
	}
	if err := b.Commit(s.writeOpts()); err != nil {
		return fmt.Errorf("tract %s: %w", k, err)
	}
	s.mu.Lock()
	s.unindex(k)
	delete(s.unforwarded, k)
	s.mu.Unlock()
	if old.Blob == nil && old.Length > 0 && !old.Embedded {
		if err := s.fs.Remove(s.fileName(k, old.Stamp)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("tract %s: %w", k, err)
		}
	}
	return nil
}

// MarkUnforwarded records durably that k's stored version may be missing
// on the row's other members (see PutUnforwarded).
func (s *Store) MarkUnforwarded(k tractKey) error {
	s.mu.RLock()
	marked := s.unforwarded[k]
	s.mu.RUnlock()
	if marked {
		return nil
	}
	if err := s.db.Set(unforwardedKey(s.disk, k), nil, s.writeOpts()); err != nil {
		return fmt.Errorf("tract %s: mark unforwarded: %w", k, err)
	}
	s.mu.Lock()
	s.unforwarded[k] = true
	s.mu.Unlock()
	return nil
}

// Forwarded removes k's mark: every member holds its stored version (or
// the version is no longer this store's to forward). The removal need
// not be durable: a mark that survives a crash costs one forward more,
// which a replica takes as a repeat.
func (s *Store) Forwarded(k tractKey) error {
	s.mu.RLock()
	marked := s.unforwarded[k]
	s.mu.RUnlock()
	if !marked {
		return nil
	}
	if err := s.db.Delete(unforwardedKey(s.disk, k), pebble.NoSync); err != nil {
		return fmt.Errorf("tract %s: clear unforwarded: %w", k, err)
	}
	s.mu.Lock()
	delete(s.unforwarded, k)
	s.mu.Unlock()
	return nil
}

// Unforwarded returns the tracts marked as possibly missing on their
// row's other members, sorted.
func (s *Store) Unforwarded() []tractKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedKeys(s.unforwarded)
}

// RowTracts returns the tracts the store holds in a row, sorted.
func (s *Store) RowTracts(row uint32) []tractKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedKeys(s.byRow[row])
}

// Rows returns the rows the store holds tracts of, with their counts.
func (s *Store) Rows() map[uint32]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[uint32]int, len(s.byRow))
	for r, ks := range s.byRow {
		out[r] = len(ks)
	}
	return out
}

// Keys returns every tract the store holds, sorted.
func (s *Store) Keys() []tractKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedKeys(s.tracts)
}

// sortedKeys returns the tracts m holds, sorted.
func sortedKeys[V any](m map[tractKey]V) []tractKey {
	out := make([]tractKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].less(out[j]) })
	return out
}

// Usage returns the number of tracts and bytes of data stored.
func (s *Store) Usage() (tracts, bytes uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return uint64(len(s.tracts)), s.bytes
}

// RowSync returns what the store recorded of its last catch-up of a row.
func (s *Store) RowSync(row uint32) (*tpb.RowSync, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rs, ok := s.rowSync[row]
	return rs, ok
}

// SetRowSync records a finished catch-up of a row (nil: forget the row).
func (s *Store) SetRowSync(row uint32, rs *tpb.RowSync) error {
	var err error
	if rs == nil {
		err = s.db.Delete(rowSyncKey(s.disk, row), s.writeOpts())
	} else {
		var val []byte
		if val, err = proto.Marshal(rs); err == nil {
			err = s.db.Set(rowSyncKey(s.disk, row), val, s.writeOpts())
		}
	}
	if err != nil {
		return fmt.Errorf("row %d: %w", row, err)
	}
	s.mu.Lock()
	if rs == nil {
		delete(s.rowSync, row)
	} else {
		s.rowSync[row] = rs
	}
	s.mu.Unlock()
	return nil
}

// RowSyncs returns every row's record.
func (s *Store) RowSyncs() map[uint32]*tpb.RowSync {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[uint32]*tpb.RowSync, len(s.rowSync))
	for r, rs := range s.rowSync {
		out[r] = rs
	}
	return out
}

// UnreferencedFiles returns data files no record names (left by a crash
// between writing a file and its record, or by a failed removal). A file
// for a version newer than the record may be a write in progress: callers
// must give it time (the scrubber uses the file's age).
func (s *Store) UnreferencedFiles() ([]string, error) {
	subdirs, err := s.fs.List(s.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, sub := range subdirs {
		names, err := s.fs.List(s.fs.PathJoin(s.dir, sub))
		if err != nil {
			continue
		}
		for _, n := range names {
			k, st, ok := parseFileName(n)
			path := s.fs.PathJoin(s.dir, sub, n)
			if !ok {
				out = append(out, path)
				continue
			}
			m, has := s.Get(k)
			if !has || m.Embedded || !proto.Equal(m.Stamp, st) {
				out = append(out, path)
			}
		}
	}
	return out, nil
}

// FS returns the file system the store's files live on.
func (s *Store) FS() vfs.FS { return s.fs }

// Dir returns the directory of the store's files.
func (s *Store) Dir() string { return s.dir }

// TractPath returns the file that holds a data tract's current version
// (tests corrupt it; operators may look at it).
func (s *Store) TractPath(g GUID, tract int64) (string, bool) {
	k := tractKey{guid: g, tract: tract}
	m, ok := s.Get(k)
	if !ok || m.Blob != nil || m.Length == 0 || m.Embedded {
		return "", false
	}
	return s.fileName(k, m.Stamp), true
}

// stampLess orders stamps (nil is the oldest).
func stampLess(a, b *tpb.Stamp) bool {
	if a.GetRowVersion() != b.GetRowVersion() {
		return a.GetRowVersion() < b.GetRowVersion()
	}
	return a.GetSeq() < b.GetSeq()
}

func stampEqual(a, b *tpb.Stamp) bool {
	return a.GetRowVersion() == b.GetRowVersion() && a.GetSeq() == b.GetSeq()
}

func stampString(s *tpb.Stamp) string {
	return fmt.Sprintf("%d.%d", s.GetRowVersion(), s.GetSeq())
}
