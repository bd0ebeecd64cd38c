package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Record encodings. Every record is a format byte followed by its fields
// as varints (zig-zag for signed ones), length-prefixed strings and raw
// GUIDs, in a fixed order. Decoders refuse unknown formats, truncated
// input, trailing bytes and out-of-range fields; they never panic (fuzzed).

const recordFormat = 1

// Versioned values start with a flags byte (see doc.go, Snapshots).
const (
	// flagTombstone marks a version that says "absent from here on".
	flagTombstone = 1 << 0
	// flagHasOlder says older versions of the same prefix exist below this
	// one, so deleting this one must leave a tombstone.
	flagHasOlder = 1 << 1
	flagsKnown   = flagTombstone | flagHasOlder
)

var errCorrupt = errors.New("fs: corrupt metadata")

type encoder struct{ b []byte }

func (e *encoder) u(v uint64)      { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) i(v int64)       { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) guid(g GUID)     { e.b = append(e.b, g[:]...) }
func (e *encoder) str(s string)    { e.u(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) boolean(v bool)  { e.u(boolU(v)) }
func (e *encoder) handle(h Handle) { e.u(h.D); e.u(h.C) }
func newEncoder(capacity int) *encoder {
	return &encoder{b: append(make([]byte, 0, capacity), recordFormat)}
}

func boolU(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

type decoder struct {
	b    []byte
	what string
	err  error
}

func newDecoder(what string, b []byte) *decoder {
	d := &decoder{b: b, what: what}
	if len(b) == 0 {
		d.fail("empty")
	} else if b[0] != recordFormat {
		d.fail(fmt.Sprintf("format %d, want %d", b[0], recordFormat))
	} else {
		d.b = b[1:]
	}
	return d
}

func (d *decoder) fail(why string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s record: %s", errCorrupt, d.what, why)
	}
	d.b = nil
}

func (d *decoder) u() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bounded(max uint64, field string) uint64 {
	v := d.u()
	if v > max {
		d.fail(fmt.Sprintf("%s %d over %d", field, v, max))
		return 0
	}
	return v
}

func (d *decoder) i() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) guid() GUID {
	var g GUID
	if d.err != nil {
		return g
	}
	if len(d.b) < len(g) {
		d.fail("short guid")
		return g
	}
	copy(g[:], d.b)
	d.b = d.b[len(g):]
	return g
}

func (d *decoder) raw(max int, field string) []byte {
	n := d.bounded(uint64(max), field+" length")
	if d.err != nil {
		return nil
	}
	if uint64(len(d.b)) < n {
		d.fail("short " + field)
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *decoder) str(max int, field string) string { return string(d.raw(max, field)) }

func (d *decoder) boolean() bool { return d.bounded(1, "flag") == 1 }

func (d *decoder) handle() Handle { return Handle{D: d.u(), C: d.u()} }

// more reports whether bytes are left (optional trailing fields).
func (d *decoder) more() bool { return d.err == nil && len(d.b) > 0 }

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	return d.err
}

// superblock is the pair (F, 0): the file system's fence and counters.
type superblock struct {
	// Epoch is the snapshot number every write carries (W in doc.go):
	// one more than the newest snapshot taken.
	Epoch uint64
	// Gen changes with every change to the snapshot records, so a writer
	// whose cached snapshot set is stale notices (doc.go, Snapshots).
	Gen uint64
	// Layout is the child-closest id layout, fixed at format time.
	Layout Layout
	// Next ids of the overflow regions (Ursa Minor §3.3).
	NextTooDeep, NextTooWide, NextCatchAll uint64
	// RenameSeq is bumped by every rename that moves a directory to
	// another parent, which serializes them (see Rename).
	RenameSeq uint64
	Created   int64
	// Deleting marks a file system being deleted: it can no longer be
	// opened.
	Deleting bool
}

func (s *superblock) encode() []byte {
	e := newEncoder(64)
	e.u(s.Epoch)
	e.u(s.Gen)
	e.u(uint64(s.Layout.SlotBits))
	e.u(uint64(s.Layout.Levels))
	e.u(uint64(s.Layout.FileBits))
	e.u(s.NextTooDeep)
	e.u(s.NextTooWide)
	e.u(s.NextCatchAll)
	e.u(s.RenameSeq)
	e.i(s.Created)
	e.boolean(s.Deleting)
	return e.b
}

func decodeSuperblock(b []byte) (*superblock, error) {
	d := newDecoder("superblock", b)
	s := &superblock{Epoch: d.u(), Gen: d.u()}
	s.Layout.SlotBits = int(d.bounded(64, "slot bits"))
	s.Layout.Levels = int(d.bounded(64, "levels"))
	s.Layout.FileBits = int(d.bounded(64, "file bits"))
	s.NextTooDeep, s.NextTooWide, s.NextCatchAll = d.u(), d.u(), d.u()
	s.RenameSeq = d.u()
	s.Created = d.i()
	s.Deleting = d.boolean()
	if err := d.done(); err != nil {
		return nil, err
	}
	if s.Epoch == 0 {
		return nil, fmt.Errorf("%w: superblock epoch 0", errCorrupt)
	}
	if err := s.Layout.validate(); err != nil {
		return nil, fmt.Errorf("%w: superblock: %w", errCorrupt, err)
	}
	return s, nil
}

// snapshotRecord is the pair (F, 0, 2, n): snapshot n exists in the
// metadata (it is named and listed in the cluster directory).
type snapshotRecord struct {
	Name    string
	Created int64
	// Deleting: the snapshot is gone for readers; a sweep is reclaiming
	// what only it held. Writers still copy on write for it until the
	// record is removed.
	Deleting bool
}

func (r *snapshotRecord) encode() []byte {
	e := newEncoder(16 + len(r.Name))
	e.str(r.Name)
	e.i(r.Created)
	e.boolean(r.Deleting)
	return e.b
}

func decodeSnapshotRecord(b []byte) (*snapshotRecord, error) {
	d := newDecoder("snapshot", b)
	r := &snapshotRecord{Name: d.str(maxSnapshotNameBytes, "name"), Created: d.i(), Deleting: d.boolean()}
	return r, d.done()
}

// inode is an object's attributes (the pair F, 1, D, C, 2, S).
type inode struct {
	Mode       uint32 // file type and permission bits, as in stat(2)
	Uid, Gid   uint32
	Nlink      uint32
	Size       uint64
	Rdev       uint64
	Atime      int64 // nanoseconds since the epoch
	Mtime      int64
	Ctime      int64
	Btime      int64
	Xattrs     uint32 // number of extended attributes
	DataGen    uint64 // bumped by every change to the file's data
	Blob       GUID   // regular files: the blob holding the data
	BlobExists bool   // the blob has been created in the data store
	// TrimFrom, when non-zero, is the offset from which a truncate is
	// still deleting blocks; it is finished before the file grows again.
	TrimFrom uint64
	Target   string // symlinks: the target, when short (else in chunks)
	// Directories:
	Parent     uint64 // D of the parent directory (the root's own D)
	NextChild  uint64 // next child directory slot value
	Entries    uint64 // live names in the directory
	NextCookie uint64 // next readdir cookie
	FileD      uint64 // directory id new files get (see layout.go)
	NextC      uint64 // next file id within FileD
	// Regular files: a data hold (SetHold): session HoldSession closed the
	// file with its data still on the way (a close answered before its
	// flush); other sessions wait to read the file until the hold is
	// cleared or HoldUntil (ns, the server's clock) passes. Both are left
	// out of the encoding when zero, as in records written before holds.
	HoldSession uint64
	HoldUntil   int64
}

func (n *inode) encode() []byte {
	e := newEncoder(96 + len(n.Target))
	e.u(uint64(n.Mode))
	e.u(uint64(n.Uid))
	e.u(uint64(n.Gid))
	e.u(uint64(n.Nlink))
	e.u(n.Size)
	e.u(n.Rdev)
	e.i(n.Atime)
	e.i(n.Mtime)
	e.i(n.Ctime)
	e.i(n.Btime)
	e.u(uint64(n.Xattrs))
	e.u(n.DataGen)
	e.guid(n.Blob)
	e.boolean(n.BlobExists)
	e.u(n.TrimFrom)
	e.str(n.Target)
	e.u(n.Parent)
	e.u(n.NextChild)
	e.u(n.Entries)
	e.u(n.NextCookie)
	e.u(n.FileD)
	e.u(n.NextC)
	if n.HoldSession != 0 {
		e.u(n.HoldSession)
		e.i(n.HoldUntil)
	}
	return e.b
}

func decodeInode(b []byte) (*inode, error) {
	d := newDecoder("inode", b)
	n := &inode{
		Mode: uint32(d.bounded(1<<32-1, "mode")), Uid: uint32(d.bounded(1<<32-1, "uid")), Gid: uint32(d.bounded(1<<32-1, "gid")),
		Nlink: uint32(d.bounded(1<<32-1, "nlink")), Size: d.bounded(maxFileBytes, "size"), Rdev: d.u(),
		Atime: d.i(), Mtime: d.i(), Ctime: d.i(), Btime: d.i(),
		Xattrs: uint32(d.bounded(maxXattrsPerObject, "xattrs")), DataGen: d.u(),
		Blob: d.guid(), BlobExists: d.boolean(), TrimFrom: d.u(),
		Target: d.str(maxInlineSymlinkBytes, "target"),
		Parent: d.u(), NextChild: d.u(), Entries: d.u(), NextCookie: d.u(), FileD: d.u(), NextC: d.u(),
	}
	if d.more() {
		n.HoldSession, n.HoldUntil = d.u(), d.i()
	}
	return n, d.done()
}

// dirent is a name map value: the handle a name points at, its type (the
// S_IFMT bits of its mode) and the name's readdir cookie.
type dirent struct {
	H      Handle
	Type   uint32
	Cookie uint64
}

func (x *dirent) encode() []byte {
	e := newEncoder(24)
	e.handle(x.H)
	e.u(uint64(x.Type))
	e.u(x.Cookie)
	return e.b
}

func decodeDirent(b []byte) (*dirent, error) {
	d := newDecoder("name", b)
	x := &dirent{H: d.handle(), Type: uint32(d.bounded(sIFMT, "type")), Cookie: d.u()}
	return x, d.done()
}

// cookieEntry is a cookie map value: the entry at that readdir position.
type cookieEntry struct {
	H    Handle
	Type uint32
	Name string
}

func (x *cookieEntry) encode() []byte {
	e := newEncoder(24 + len(x.Name))
	e.handle(x.H)
	e.u(uint64(x.Type))
	e.str(x.Name)
	return e.b
}

func decodeCookieEntry(b []byte) (*cookieEntry, error) {
	d := newDecoder("cookie", b)
	x := &cookieEntry{H: d.handle(), Type: uint32(d.bounded(sIFMT, "type")), Name: d.str(MaxNameBytes, "name")}
	return x, d.done()
}

// blockEntry is a block map value: which tract of which blob holds the
// block, and how many of its bytes are the file's (the rest reads as
// zeros).
type blockEntry struct {
	Blob   GUID
	Tract  uint64
	Length uint64
	// Inline, if not nil, is the block's data itself, kept in the
	// metadata (a small file: doc.go, Data); Tract is then no tract but a
	// number that tells this write of the block from others. The pair
	// stores its first InlineChunkBytes, its chunks the rest (inline.go):
	// decoded from the pair alone it holds only that first part.
	Inline []byte
}

// encode encodes the pair's value: of inline data, only the first
// InlineChunkBytes (the rest goes in chunks, putBlock).
func (x *blockEntry) encode() []byte {
	first := x.Inline[:min(len(x.Inline), InlineChunkBytes)]
	e := newEncoder(32 + len(first))
	e.guid(x.Blob)
	e.u(x.Tract)
	e.u(x.Length)
	if x.Inline != nil {
		e.u(1)
		e.str(string(first))
	}
	return e.b
}

// decodeBlockEntry decodes a pair's value; an inline entry's Inline is
// then its first part (readInlineChunks reads the rest).
func decodeBlockEntry(b []byte) (*blockEntry, error) {
	d := newDecoder("block", b)
	x := &blockEntry{Blob: d.guid(), Tract: d.u(), Length: d.bounded(maxTractBytes, "length")}
	if d.err == nil && len(d.b) > 0 && d.bounded(1, "inline flag") == 1 {
		x.Inline = d.raw(InlineChunkBytes, "inline data")
		switch {
		case d.err != nil:
		case x.Length > MaxInlineBytes:
			d.fail("inline block of more than the inline bound")
		case uint64(len(x.Inline)) != min(x.Length, InlineChunkBytes):
			d.fail("inline data of another length than the block's")
		}
	}
	return x, d.done()
}

// inline reports whether the block's data is in the entry.
func (x *blockEntry) inline() bool { return x.Inline != nil }

// orphanRecord lists an object no name points at any more: it is
// reclaimed once no mount holds it open.
type orphanRecord struct {
	Mount uint64 // the mount that unlinked it (and may hold it open)
	Since int64
}

func (x *orphanRecord) encode() []byte {
	e := newEncoder(24)
	e.u(x.Mount)
	e.i(x.Since)
	return e.b
}

func decodeOrphanRecord(b []byte) (*orphanRecord, error) {
	d := newDecoder("orphan", b)
	x := &orphanRecord{Mount: d.u(), Since: d.i()}
	return x, d.done()
}

// sessionRecord is a live mount: it renews Seen while it runs.
type sessionRecord struct {
	Seen int64
}

func (x *sessionRecord) encode() []byte {
	e := newEncoder(12)
	e.i(x.Seen)
	return e.b
}

func decodeSessionRecord(b []byte) (*sessionRecord, error) {
	d := newDecoder("session", b)
	x := &sessionRecord{Seen: d.i()}
	return x, d.done()
}

// version is what a versioned pair's flags and key say about it.
type version struct {
	Found     bool   // a version at or below the read snapshot exists
	S         uint64 // its snapshot number
	Tombstone bool
	HasOlder  bool
}

// live reports whether the version says the key is present.
func (v version) live() bool { return v.Found && !v.Tombstone }

func encodeVersioned(flags byte, payload []byte) []byte {
	out := make([]byte, 0, 1+len(payload))
	return append(append(out, flags), payload...)
}

func decodeVersioned(b []byte) (flags byte, payload []byte, err error) {
	if len(b) == 0 {
		return 0, nil, fmt.Errorf("%w: empty versioned value", errCorrupt)
	}
	if b[0]&^flagsKnown != 0 {
		return 0, nil, fmt.Errorf("%w: versioned value flags %#x", errCorrupt, b[0])
	}
	if b[0]&flagTombstone != 0 && len(b) != 1 {
		return 0, nil, fmt.Errorf("%w: tombstone with a payload", errCorrupt)
	}
	return b[0], b[1:], nil
}
