package tract

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

func openTestStore(t *testing.T, fs vfs.FS, db *pebble.DB) *Store {
	t.Helper()
	s, err := OpenStore(2, "disk", fs, db, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newTestDB(t *testing.T, fs vfs.FS) *pebble.DB {
	t.Helper()
	db, err := pebble.Open("db", &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func metaFor(row uint32, v, seq uint64, data []byte) *tpb.TractMeta {
	return &tpb.TractMeta{Row: row, Stamp: &tpb.Stamp{RowVersion: v, Seq: seq}, Length: uint32(len(data)),
		Crc32C: Checksum(data), Replication: 3, Incarnation: 9}
}

func TestStorePutGetReload(t *testing.T) {
	fs := vfs.NewMem()
	db := newTestDB(t, fs)
	s := openTestStore(t, fs, db)
	g := GUID{7}
	k0, k1, meta := tractKey{g, 0}, tractKey{g, 1}, tractKey{g, MetadataTract}
	d0, d1 := []byte("tract zero"), []byte("a short tract costs its size")
	for _, tc := range []struct {
		k    tractKey
		m    *tpb.TractMeta
		data []byte
	}{
		{k0, metaFor(4, 1, 1, d0), d0},
		{k1, metaFor(5, 1, 1, d1), d1},
		{meta, &tpb.TractMeta{Row: 3, Stamp: &tpb.Stamp{RowVersion: 1, Seq: 1}, Blob: &tpb.BlobMeta{LengthTracts: 2, Replication: 3, Incarnation: 9}}, nil},
	} {
		if err := s.Put(tc.k, tc.m, tc.data); err != nil {
			t.Fatal(err)
		}
	}
	path, ok := s.TractPath(g, 1)
	if !ok {
		t.Fatal("no file for tract 1")
	}
	if st, err := fs.Stat(path); err != nil || st.Size() != int64(len(d1)) {
		t.Fatalf("tract file %s: %v, %v; want %d bytes", path, st, err, len(d1))
	}
	if n, b := s.Usage(); n != 3 || b != uint64(len(d0)+len(d1)) {
		t.Fatalf("usage %d tracts %d bytes", n, b)
	}
	// A newer version replaces the file.
	d0b := []byte("tract zero, second version")
	if err := s.Put(k0, metaFor(4, 2, 1, d0b), d0b); err != nil {
		t.Fatal(err)
	}
	if files, _ := s.UnreferencedFiles(); len(files) != 0 {
		t.Fatalf("old version left behind: %v", files)
	}
	if err := s.SetRowSync(4, &tpb.RowSync{SyncedVersion: 2, SyncedSlot: 1}); err != nil {
		t.Fatal(err)
	}
	// Everything comes back from pebble.
	r := openTestStore(t, fs, db)
	for k, want := range map[tractKey][]byte{k0: d0b, k1: d1} {
		m, ok := r.Get(k)
		if !ok {
			t.Fatalf("%s lost on reload", k)
		}
		got, err := r.ReadData(k, m)
		if err != nil || string(got) != string(want) {
			t.Fatalf("%s after reload: %q, %v", k, got, err)
		}
	}
	if m, ok := r.Get(meta); !ok || m.Blob.GetLengthTracts() != 2 {
		t.Fatalf("metadata tract after reload: %v", m)
	}
	if rs, ok := r.RowSync(4); !ok || rs.SyncedVersion != 2 || rs.SyncedSlot != 1 {
		t.Fatalf("row sync after reload: %v", rs)
	}
	if got := r.RowTracts(4); len(got) != 1 || got[0] != k0 {
		t.Fatalf("row 4 tracts %v", got)
	}
	if rows := r.Rows(); rows[3] != 1 || rows[4] != 1 || rows[5] != 1 {
		t.Fatalf("rows %v", rows)
	}
	// Another disk's records are not this one's.
	other, err := OpenStore(3, "disk3", fs, db, true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := other.Usage(); n != 0 {
		t.Fatalf("disk 3 sees %d of disk 2's tracts", n)
	}
	if err := r.Delete(k1); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Get(k1); ok {
		t.Fatal("deleted tract still there")
	}
	if _, err := fs.Stat(path); err == nil {
		t.Fatal("deleted tract's file still there")
	}
}

func TestStoreDetectsCorruption(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStore(t, fs, newTestDB(t, fs))
	k := tractKey{GUID{1}, 3}
	data := []byte("some bytes worth protecting")
	m := metaFor(1, 1, 1, data)
	if err := s.Put(k, m, data); err != nil {
		t.Fatal(err)
	}
	path, _ := s.TractPath(k.guid, k.tract)
	f, _ := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	f.WriteAt([]byte{'X'}, 3)
	f.Close()
	if _, err := s.ReadData(k, m); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped byte: %v", err)
	}
	fs.Remove(path)
	if _, err := s.ReadData(k, m); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a missing file: %v", err)
	}
	// Data that does not match its record is refused and changes nothing.
	bad := metaFor(1, 2, 1, data)
	bad.Crc32C++
	if err := s.Put(k, bad, data); err == nil {
		t.Fatal("a record that does not match its data was stored")
	}
	if cur, _ := s.Get(k); !stampEqual(cur.Stamp, m.Stamp) {
		t.Fatal("a refused put changed the record")
	}
}

func TestStoreUnreferencedFiles(t *testing.T) {
	fs := vfs.NewMem()
	s := openTestStore(t, fs, newTestDB(t, fs))
	k := tractKey{GUID{0xab}, 0}
	data := []byte("x")
	if err := s.Put(k, metaFor(0, 1, 1, data), data); err != nil {
		t.Fatal(err)
	}
	// A crash after writing a newer version's file, before its record.
	stray := s.fileName(k, &tpb.Stamp{RowVersion: 1, Seq: 2})
	f, _ := fs.Create(stray, vfs.WriteCategoryUnspecified)
	f.Close()
	junk := fs.PathJoin(s.Dir(), "ab", "not-a-tract")
	f, _ = fs.Create(junk, vfs.WriteCategoryUnspecified)
	f.Close()
	files, err := s.UnreferencedFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("unreferenced files %v, want the stray version and the junk", files)
	}
}

func TestParseFileNameRoundTrip(t *testing.T) {
	s := &Store{fs: vfs.NewMem(), dir: "d"}
	k := tractKey{NewGUID(), 12345}
	st := &tpb.Stamp{RowVersion: 77, Seq: 3}
	name := s.fs.PathBase(s.fileName(k, st))
	gk, gst, ok := parseFileName(name)
	if !ok || gk != k || !stampEqual(gst, st) {
		t.Fatalf("parseFileName(%q) = %v %v %v", name, gk, gst, ok)
	}
}

// TestStoreEmbedsSmallTracts: a tract of at most embedBytes keeps its data
// in the database (no file), reads back, is checked against its checksum,
// and moving between embedded and file versions leaves nothing behind.
func TestStoreEmbedsSmallTracts(t *testing.T) {
	fs := vfs.NewMem()
	db := newTestDB(t, fs)
	s, err := OpenStore(2, "disk", fs, db, true, 64)
	if err != nil {
		t.Fatal(err)
	}
	k := tractKey{GUID{9}, 0}
	small, large := []byte("small enough to embed"), bytes.Repeat([]byte("x"), 100)
	for i, data := range [][]byte{small, large, small} {
		m := metaFor(1, uint64(i+1), 1, data)
		if err := s.Put(k, m, data); err != nil {
			t.Fatal(err)
		}
		got, _ := s.Get(k)
		if got.Embedded != (len(data) <= 64) {
			t.Fatalf("version %d of %d bytes: embedded %v", i, len(data), got.Embedded)
		}
		_, isFile := s.TractPath(k.guid, k.tract)
		if isFile == got.Embedded {
			t.Fatalf("version %d: embedded %v, file %v", i, got.Embedded, isFile)
		}
		if b, err := s.ReadData(k, got); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("version %d: read %q, %v", i, b, err)
		}
		if files, _ := s.UnreferencedFiles(); len(files) != 0 {
			t.Fatalf("version %d: files left behind: %v", i, files)
		}
	}
	// Reopened from the database alone.
	r, err := OpenStore(2, "disk", fs, db, true, 64)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := r.Get(k)
	if b, err := r.ReadData(k, m); err != nil || !bytes.Equal(b, small) {
		t.Fatalf("after reopen: %q, %v", b, err)
	}
	// A flipped byte is caught by the checksum.
	if err := db.Set(tractDataKey(2, k), []byte("smalL enough to embed"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadData(k, m); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a corrupt embedded tract: %v", err)
	}
	if err := r.Delete(k); err != nil {
		t.Fatal(err)
	}
	if _, closer, err := db.Get(tractDataKey(2, k)); err == nil {
		closer.Close()
		t.Fatal("the embedded data outlives its tract")
	}
}

// TestStoreUnforwardedMarks: a primary's version is marked with its record
// (one batch), the mark survives a reopen, and Forwarded, MarkUnforwarded
// and Delete keep the marks and the database in step.
func TestStoreUnforwardedMarks(t *testing.T) {
	fs := vfs.NewMem()
	db := newTestDB(t, fs)
	s := openTestStore(t, fs, db)
	g := GUID{9}
	k0, k1, meta := tractKey{g, 0}, tractKey{g, 1}, tractKey{g, MetadataTract}
	d := []byte("stored by the primary")
	if err := s.PutUnforwarded(k0, metaFor(4, 1, 1, d), d); err != nil {
		t.Fatal(err)
	}
	if err := s.PutUnforwarded(meta, &tpb.TractMeta{Row: 3, Stamp: &tpb.Stamp{RowVersion: 1, Seq: 1}, Blob: &tpb.BlobMeta{LengthTracts: 1, Replication: 3, Incarnation: 9}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(k1, metaFor(5, 1, 1, d), d); err != nil { // a replica's copy: no mark
		t.Fatal(err)
	}
	want := func(s *Store, keys ...tractKey) {
		t.Helper()
		got := s.Unforwarded()
		if len(got) != len(keys) {
			t.Fatalf("unforwarded %v, want %v", got, keys)
		}
		for i := range keys {
			if got[i] != keys[i] {
				t.Fatalf("unforwarded %v, want %v", got, keys)
			}
		}
	}
	want(s, meta, k0)
	want(openTestStore(t, fs, db), meta, k0)
	if err := s.Forwarded(meta); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkUnforwarded(k1); err != nil {
		t.Fatal(err)
	}
	want(s, k0, k1)
	want(openTestStore(t, fs, db), k0, k1)
	if err := s.Delete(k0); err != nil {
		t.Fatal(err)
	}
	if err := s.Forwarded(k1); err != nil {
		t.Fatal(err)
	}
	want(s)
	want(openTestStore(t, fs, db))
	// A failed put (data that does not match its record) marks nothing.
	if err := s.PutUnforwarded(k0, metaFor(4, 2, 1, d), []byte("other")); err == nil {
		t.Fatal("a put of data that does not match its record succeeded")
	}
	want(openTestStore(t, fs, db))
}
