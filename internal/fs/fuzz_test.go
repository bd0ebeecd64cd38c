package fs

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzDecoders feeds arbitrary bytes to every record decoder: none may
// panic, and whatever one accepts must encode to bytes that decode to the
// same record (so a record read from the store and written back is
// unchanged).
func FuzzDecoders(f *testing.F) {
	f.Add((&superblock{Epoch: 3, Gen: 2, Layout: DefaultLayout, Created: 5}).encode())
	f.Add((&inode{Mode: sIFREG | 0o644, Nlink: 1, Size: 100, Blob: GUID{1}, BlobExists: true, Target: "x"}).encode())
	f.Add((&dirent{H: Handle{D: 1, C: 2}, Type: sIFREG, Cookie: 9}).encode())
	f.Add((&cookieEntry{H: Handle{D: 1, C: 2}, Type: sIFDIR, Name: "n"}).encode())
	f.Add((&blockEntry{Blob: GUID{2}, Tract: 3, Length: 4}).encode())
	f.Add((&blockEntry{Tract: 3, Length: 5, Inline: []byte("small")}).encode())
	// A file of MaxInlineBytes: the pair holds its first part (inline.go).
	f.Add((&blockEntry{Tract: 3, Length: MaxInlineBytes, Inline: make([]byte, MaxInlineBytes)}).encode())
	f.Add((&orphanRecord{Mount: 7, Since: 8}).encode())
	f.Add((&sessionRecord{Seen: 9}).encode())
	f.Add((&snapshotRecord{Name: "s", Created: 1}).encode())
	f.Add([]byte{})
	f.Add([]byte{recordFormat, 0xff, 0xff, 0xff})
	type codec struct {
		name   string
		decode func([]byte) (any, error)
		encode func(any) []byte
	}
	codecs := []codec{
		{"superblock", func(b []byte) (any, error) { return decodeSuperblock(b) }, func(v any) []byte { return v.(*superblock).encode() }},
		{"snapshot", func(b []byte) (any, error) { return decodeSnapshotRecord(b) }, func(v any) []byte { return v.(*snapshotRecord).encode() }},
		{"inode", func(b []byte) (any, error) { return decodeInode(b) }, func(v any) []byte { return v.(*inode).encode() }},
		{"dirent", func(b []byte) (any, error) { return decodeDirent(b) }, func(v any) []byte { return v.(*dirent).encode() }},
		{"cookie", func(b []byte) (any, error) { return decodeCookieEntry(b) }, func(v any) []byte { return v.(*cookieEntry).encode() }},
		{"block", func(b []byte) (any, error) { return decodeBlockEntry(b) }, func(v any) []byte { return v.(*blockEntry).encode() }},
		{"orphan", func(b []byte) (any, error) { return decodeOrphanRecord(b) }, func(v any) []byte { return v.(*orphanRecord).encode() }},
		{"session", func(b []byte) (any, error) { return decodeSessionRecord(b) }, func(v any) []byte { return v.(*sessionRecord).encode() }},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range codecs {
			v, err := c.decode(b)
			if err != nil {
				continue
			}
			again, err := c.decode(c.encode(v))
			if err != nil {
				t.Fatalf("%s: re-encoding of an accepted record does not decode: %v", c.name, err)
			}
			if !reflect.DeepEqual(v, again) {
				t.Fatalf("%s: %+v became %+v", c.name, v, again)
			}
		}
		if flags, payload, err := decodeVersioned(b); err == nil {
			if !bytes.Equal(encodeVersioned(flags, payload), b) {
				t.Fatalf("versioned value %x does not round-trip", b)
			}
		}
		if prefix, s, err := splitVersion(b); err == nil {
			if !bytes.Equal(versioned(prefix, s), b) {
				t.Fatalf("versioned key %x does not round-trip", b)
			}
		}
	})
}
