package fs

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"syscall"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// TractLengther is implemented by data stores that can tell a tract's
// stored length without reading it (fsck's leak check).
type TractLengther interface {
	TractLength(ctx context.Context, g GUID, i uint64) (int, error)
}

// CheckOptions narrow a check.
type CheckOptions struct {
	// Data reads every referenced tract (else only their lengths).
	Data bool
	// Progress, if set, is told what the check is doing: its stage
	// ("load": the objects read, counted by their inodes; "views"; then
	// "blobs"), and how far it got in it (total 0: not known yet). Each
	// stage ends with a call where done == total.
	Progress func(stage string, done, total int)
}

// checkLoadReport is how many inodes Check loads between two reports of
// its progress: often enough for a bar to move on a small file system,
// rarely enough to cost nothing next to the scan.
const checkLoadReport = 16

// maxCheckProblems bounds the problems a report lists (it counts all).
const maxCheckProblems = 200

// CheckReport is what Check found.
type CheckReport struct {
	Views   int // the live file system and each live snapshot
	Objects int // objects at the head
	Names   int
	Blocks  int // block pairs at the head
	Inline  int // block pairs of any view that hold their data (small files)
	Tracts  int // distinct tracts referenced by any view
	Blobs   int
	Orphans int // orphan records (pending reclaim)
	Queued  int // blobs queued for deletion
	// FreeingTracts are tracts queued to be emptied (F, 5).
	FreeingTracts int
	Garbage       int // versions no view reads (a sweep reclaims them)
	Dangling      int // names whose object is missing
	// Lost counts blocks whose acknowledged data is gone: a tract holding
	// fewer bytes than its block says, past its blob's end, or of a blob
	// that no longer exists; an inline block's chunk missing or short.
	// LostData holds the first of those findings
	// (they are in Problems too), so a checker such as the nemesis can
	// tell lost data from other problems without reading the text.
	Lost      int
	LostData  []string
	LinkCount int // objects whose link count is wrong
	Leaked    int // tracts or objects nothing references
	Other     int
	Problems  []string
}

// OK reports whether nothing is wrong.
func (r *CheckReport) OK() bool { return r.ProblemCount() == 0 }

// ProblemCount is the number of problems found, of every kind.
func (r *CheckReport) ProblemCount() int {
	return r.Lost + r.Dangling + r.LinkCount + r.Leaked + r.Other
}

func (r *CheckReport) problem(counter *int, format string, args ...any) {
	*counter++
	if len(r.Problems) < maxCheckProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
	if counter == &r.Lost && len(r.LostData) < maxCheckProblems {
		r.LostData = append(r.LostData, fmt.Sprintf(format, args...))
	}
}

// unlistedOrphan confirms, in one transaction, that object h has no name
// and no orphan record: the load read its inode before the orphan records,
// and an orphan reclaimed in between (inode and record deleted together)
// would otherwise show as leaked while the check runs beside the
// metadata servers' reclaim.
func (f *FS) unlistedOrphan(ctx context.Context, h Handle) (bool, error) {
	var leaked bool
	err := f.meta.View(ctx, func(tx MetaTxn) error {
		n, err := readInode(tx, f.keys, h, headSnapshot)
		if errnoOf(err) == syscall.ENOENT {
			leaked = false
			return nil
		}
		if err != nil {
			return err
		}
		_, listed, err := tx.Get(f.keys.orphan(h))
		leaked = err == nil && n.Nlink == 0 && !listed
		return err
	})
	if err != nil {
		return false, fmt.Errorf("check: confirm object %v: %w", h, err)
	}
	return leaked, nil
}

// checkKey is one versioned key of the file system and its versions.
type checkKey struct {
	prefix []byte
	t      tuple.Tuple
	vs     []keyVersion
}

// at returns the version a reader at snapshot s sees (nil if none or a
// tombstone).
func (k *checkKey) at(s uint64) []byte {
	for _, kv := range k.vs {
		if kv.v.S <= s {
			if kv.v.Tombstone {
				return nil
			}
			_, payload, _ := decodeVersioned(kv.value)
			return payload
		}
	}
	return nil
}

// Check walks the file system's metadata and its blobs and reports
// dangling names, wrong link counts, leaked tracts and objects, and every
// other broken invariant, for the live file system and each live
// snapshot. It reads everything and holds the metadata in memory; it is
// meant for a quiet file system (changes during the check may show as
// problems).
func (f *FS) Check(ctx context.Context, opts CheckOptions) (*CheckReport, error) {
	r := &CheckReport{}
	k := f.keys
	progress := func(stage string, done, total int) {
		if opts.Progress != nil {
			opts.Progress(stage, done, total)
		}
	}
	sb, err := f.readSuperblock(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := f.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	views := []uint64{headSnapshot}
	for _, in := range infos {
		if !in.Deleting {
			views = append(views, in.Number)
		}
	}
	r.Views = len(views)
	live := &snapSet{nums: append([]uint64(nil), views[1:]...)}
	sort.Slice(live.nums, func(i, j int) bool { return live.nums[i] < live.nums[j] })

	// Load every versioned key.
	var all []*checkKey
	var cur *checkKey
	loaded := 0 // inodes read, what progress counts (a metadata server keeps their count)
	from := k.objects()
	err = f.meta.Scan(ctx, from, endOf(from), func(key, value []byte) error {
		if isTableRecord(key) {
			return nil // a metadata server's record of its table
		}
		prefix, s, err := splitVersion(key)
		if err != nil {
			return err
		}
		v, _, err := parseVersion(s, value)
		if err != nil {
			return err
		}
		if s > sb.Epoch {
			r.problem(&r.Other, "key %x: version %d is past the epoch %d", prefix, s, sb.Epoch)
		}
		if cur == nil || !bytes.Equal(cur.prefix, prefix) {
			t, err := tuple.Unpack(prefix)
			if err != nil {
				return fmt.Errorf("%w: key %x", errCorrupt, key)
			}
			cur = &checkKey{prefix: bytes.Clone(prefix), t: t}
			all = append(all, cur)
			if _, ok := InodePrefix(key); ok {
				if loaded++; loaded%checkLoadReport == 0 {
					progress("load", loaded, 0)
				}
			}
		}
		cur.vs = append(cur.vs, keyVersion{key: bytes.Clone(key), value: bytes.Clone(value), v: v})
		return nil
	})
	if err != nil {
		return nil, err
	}
	progress("load", loaded, loaded)
	// Version invariants.
	for _, ck := range all {
		if checkKind(ck) == kindInline {
			continue // versioned by their block pair (inline.go): checked below
		}
		keep := neededVersions(ck.vs, live)
		for i, kv := range ck.vs {
			if !keep[i] {
				r.Garbage++
			}
			older := i+1 < len(ck.vs)
			if older && !kv.v.HasOlder {
				r.problem(&r.Other, "key %x version %d: older versions exist but it says none", ck.prefix, kv.v.S)
			}
		}
	}
	checkInlineChunks(r, all)
	orphans := map[Handle]bool{}
	op := k.orphanPrefix()
	err = f.meta.Scan(ctx, op, endOf(op), func(key, _ []byte) error {
		t, err := tuple.Unpack(key)
		if err != nil || len(t) != 4 {
			return fmt.Errorf("%w: orphan key %x", errCorrupt, key)
		}
		d, _ := asUint(t[2])
		c, _ := asUint(t[3])
		orphans[Handle{D: d, C: c}] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.Orphans = len(orphans)
	bq := k.blobQueuePrefix()
	queued := map[GUID]bool{}
	err = f.meta.Scan(ctx, bq, endOf(bq), func(key, _ []byte) error {
		t, err := tuple.Unpack(key)
		if err == nil && len(t) == 3 {
			if b, ok := t[2].([]byte); ok && len(b) == 16 {
				var g GUID
				copy(g[:], b)
				queued[g] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.Queued = len(queued)
	freeing := map[tractKey]bool{} // tracts queued to empty (F, 5)
	recs, err := f.queuedTractFrees(ctx)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		for _, t := range rec.tracts {
			freeing[tractKey{rec.blob, t}] = true
		}
	}
	r.FreeingTracts = len(freeing)

	// Each view's namespace.
	referenced := map[tractKey]blockEntry{} // every tract any view reads
	blobs := map[GUID]bool{}                // every blob any view's inodes name
	maxBlock := pow2Floor(uint64(f.tractSize))
	for vi, s := range views {
		progress("views", vi, len(views))
		name := "live"
		if s != headSnapshot {
			name = fmt.Sprintf("snapshot %d", s)
		}
		inodes := map[Handle]*inode{}
		type nameRef struct {
			dir  Handle
			name string
			x    *dirent
		}
		var names []nameRef
		cookies := map[Handle]map[uint64]*cookieEntry{}
		blocks := map[Handle]map[uint64]blockEntry{}
		for _, ck := range all {
			payload := ck.at(s)
			if payload == nil {
				continue
			}
			if len(ck.t) < 5 {
				r.problem(&r.Other, "%s: key %x is too short", name, ck.prefix)
				continue
			}
			d, _ := asUint(ck.t[2])
			c, _ := asUint(ck.t[3])
			kind, _ := asUint(ck.t[4])
			h := Handle{D: d, C: c}
			switch kind {
			case kindInode:
				n, err := decodeInode(payload)
				if err != nil {
					r.problem(&r.Other, "%s: inode %v: %v", name, h, err)
					continue
				}
				inodes[h] = n
			case kindName:
				x, err := decodeDirent(payload)
				nb, _ := ck.t[5].([]byte)
				if err != nil || len(ck.t) != 6 {
					r.problem(&r.Other, "%s: name %q in %v: %v", name, nb, h, err)
					continue
				}
				names = append(names, nameRef{h, string(nb), x})
			case kindCookie:
				ce, err := decodeCookieEntry(payload)
				c, _ := asUint(ck.t[5])
				if err != nil || len(ck.t) != 6 {
					r.problem(&r.Other, "%s: cookie %d in %v: %v", name, c, h, err)
					continue
				}
				if cookies[h] == nil {
					cookies[h] = map[uint64]*cookieEntry{}
				}
				cookies[h][c] = ce
			case kindBlock:
				e, err := decodeBlockEntry(payload)
				o, _ := asUint(ck.t[5])
				if err != nil || len(ck.t) != 6 {
					r.problem(&r.Other, "%s: block %d of %v: %v", name, o, h, err)
					continue
				}
				if blocks[h] == nil {
					blocks[h] = map[uint64]blockEntry{}
				}
				blocks[h][o] = *e
			}
		}
		// Names and cookies.
		refs := map[Handle]int{}
		subdirs := map[Handle]int{}
		entries := map[Handle]uint64{}
		parentOf := map[Handle]Handle{}
		for _, nr := range names {
			if s == headSnapshot {
				r.Names++
			}
			entries[nr.dir]++
			dn := inodes[nr.dir]
			if dn == nil || dn.Mode&sIFMT != sIFDIR {
				r.problem(&r.Dangling, "%s: name %q is in %v, which is not a directory", name, nr.name, nr.dir)
				continue
			}
			n := inodes[nr.x.H]
			if n == nil {
				r.problem(&r.Dangling, "%s: name %q in %v points at missing object %v", name, nr.name, nr.dir, nr.x.H)
				continue
			}
			if n.Mode&sIFMT != nr.x.Type {
				r.problem(&r.Other, "%s: name %q in %v says type %o, the object is %o", name, nr.name, nr.dir, nr.x.Type, n.Mode&sIFMT)
			}
			refs[nr.x.H]++
			if nr.x.Type == sIFDIR {
				subdirs[nr.dir]++
				parentOf[nr.x.H] = nr.dir
			}
			ce := cookies[nr.dir][nr.x.Cookie]
			if ce == nil || ce.H != nr.x.H || ce.Name != nr.name {
				r.problem(&r.Other, "%s: name %q in %v has no matching cookie %d", name, nr.name, nr.dir, nr.x.Cookie)
			} else {
				ce.Name = "\x00matched"
			}
			if nr.x.Cookie >= dn.NextCookie {
				r.problem(&r.Other, "%s: name %q in %v has cookie %d, not below the next %d", name, nr.name, nr.dir, nr.x.Cookie, dn.NextCookie)
			}
		}
		for dir, cs := range cookies {
			for c, ce := range cs {
				if ce.Name != "\x00matched" {
					r.problem(&r.Dangling, "%s: cookie %d in %v (%q) has no name", name, c, dir, ce.Name)
				}
			}
		}
		// Link counts and reachability.
		for h, n := range inodes {
			if s == headSnapshot {
				r.Objects++
			}
			if n.Mode&sIFMT == sIFREG && !n.Blob.IsZero() {
				blobs[n.Blob] = true
			}
			switch {
			case n.Mode&sIFMT == sIFDIR:
				if h == RootHandle {
					if refs[h] != 0 {
						r.problem(&r.LinkCount, "%s: the root has %d names", name, refs[h])
					}
				} else if n.Nlink == 0 {
					if s == headSnapshot && !orphans[h] {
						if leaked, err := f.unlistedOrphan(ctx, h); err != nil {
							return nil, err
						} else if leaked {
							r.problem(&r.Leaked, "%s: removed directory %v is not listed as an orphan", name, h)
						}
					}
					continue
				} else if refs[h] != 1 {
					r.problem(&r.LinkCount, "%s: directory %v has %d names", name, h, refs[h])
				} else if parentOf[h].D != n.Parent {
					r.problem(&r.Other, "%s: directory %v is in %v but says its parent is %x", name, h, parentOf[h], n.Parent)
				}
				if want := 2 + uint32(subdirs[h]); n.Nlink != want {
					r.problem(&r.LinkCount, "%s: directory %v has link count %d, want %d", name, h, n.Nlink, want)
				}
				if n.Entries != entries[h] {
					r.problem(&r.LinkCount, "%s: directory %v counts %d entries, has %d", name, h, n.Entries, entries[h])
				}
			default:
				if int(n.Nlink) != refs[h] {
					r.problem(&r.LinkCount, "%s: object %v has link count %d and %d names", name, h, n.Nlink, refs[h])
				}
				if n.Nlink == 0 && s == headSnapshot && !orphans[h] {
					if leaked, err := f.unlistedOrphan(ctx, h); err != nil {
						return nil, err
					} else if leaked {
						r.problem(&r.Leaked, "%s: object %v has no name and is not listed as an orphan", name, h)
					}
				}
			}
		}
		// Blocks.
		for h, bs := range blocks {
			n := inodes[h]
			if n == nil || n.Mode&sIFMT != sIFREG {
				r.problem(&r.Dangling, "%s: %d blocks of missing or non-regular object %v", name, len(bs), h)
				continue
			}
			for o, e := range bs {
				if s == headSnapshot {
					r.Blocks++
				}
				start, size := blockAt(o, maxBlock)
				switch {
				case start != o:
					r.problem(&r.Other, "%s: block of %v at %d is not on a block boundary", name, h, o)
				case e.Length > size:
					r.problem(&r.Other, "%s: block of %v at %d holds %d bytes, more than its size %d", name, h, o, e.Length, size)
				case o >= n.Size && n.TrimFrom == 0:
					r.problem(&r.Leaked, "%s: block of %v at %d is past the end (%d)", name, h, o, n.Size)
				case e.Blob != n.Blob:
					r.problem(&r.Other, "%s: block of %v at %d is in blob %v, the file's is %v", name, h, o, e.Blob, n.Blob)
				case e.inline() && (o != 0 || e.Length > MaxInlineBytes):
					r.problem(&r.Other, "%s: inline block of %v at %d holds %d bytes: only a first block of at most %d is kept inline", name, h, o, e.Length, MaxInlineBytes)
				}
				if e.inline() {
					r.Inline++
					continue // no tract
				}
				referenced[tractKey{e.Blob, e.Tract}] = e
			}
		}
	}
	progress("views", len(views), len(views))
	r.Tracts = len(referenced)
	r.Blobs = len(blobs)
	// The data store: every referenced tract is there, and nothing else.
	perBlob := map[GUID][]uint64{}
	for tk := range referenced {
		perBlob[tk.blob] = append(perBlob[tk.blob], tk.tract)
	}
	lengther, _ := f.data.(TractLengther)
	done := 0
	progress("blobs", 0, len(blobs))
	for g := range blobs {
		done++
		progress("blobs", done, len(blobs))
		size, ok, err := f.data.BlobTracts(ctx, g)
		if err != nil {
			return nil, fmt.Errorf("blob %v: %w", g, err)
		}
		if !ok {
			if len(perBlob[g]) > 0 {
				r.problem(&r.Lost, "blob %v is missing; %d tracts of it are referenced", g, len(perBlob[g]))
			}
			continue
		}
		for _, i := range perBlob[g] {
			e := referenced[tractKey{g, i}]
			if i >= size {
				r.problem(&r.Lost, "tract %v/%d is past the blob's end (%d tracts)", g, i, size)
				continue
			}
			var n int
			if opts.Data || lengther == nil {
				data, err := f.data.ReadTract(ctx, g, i)
				if err != nil {
					r.problem(&r.Dangling, "tract %v/%d: %v", g, i, err)
					continue
				}
				n = len(data)
			} else if n, err = lengther.TractLength(ctx, g, i); err != nil {
				r.problem(&r.Dangling, "tract %v/%d: %v", g, i, err)
				continue
			}
			if uint64(n) < e.Length {
				r.problem(&r.Lost, "tract %v/%d holds %d bytes; its block says %d", g, i, n, e.Length)
			}
		}
		if lengther == nil {
			continue
		}
		for i := uint64(0); i < size; i++ {
			if _, ok := referenced[tractKey{g, i}]; ok || freeing[tractKey{g, i}] {
				continue
			}
			n, err := lengther.TractLength(ctx, g, i)
			if err != nil {
				r.problem(&r.Other, "tract %v/%d: %v", g, i, err)
				continue
			}
			if n > 0 {
				r.problem(&r.Leaked, "tract %v/%d holds %d bytes that no block references", g, i, n)
			}
		}
	}
	return r, nil
}

// tractKey names one tract of one blob.
type tractKey struct {
	blob  GUID
	tract uint64
}

// checkKind returns the kind of an object's key (0 if it is too short).
func checkKind(ck *checkKey) uint64 {
	if len(ck.t) < 5 {
		return 0
	}
	kind, _ := asUint(ck.t[4])
	return kind
}

// checkInlineChunks checks every version of every inline block pair
// against its chunks (inline.go): each chunk its length says it has is
// there at the pair's version and holds what it should, and every chunk
// belongs to such a version.
func checkInlineChunks(r *CheckReport, all []*checkKey) {
	type chunkID struct {
		h    Handle
		i, s uint64
	}
	chunks := map[chunkID]int{} // chunk -> its data's length
	for _, ck := range all {
		if checkKind(ck) != kindInline {
			continue
		}
		i, ok := uint64(0), len(ck.t) == 6
		if ok {
			i, ok = asUint(ck.t[5])
		}
		d, _ := asUint(ck.t[2])
		c, _ := asUint(ck.t[3])
		h := Handle{D: d, C: c}
		for _, kv := range ck.vs {
			_, payload, err := decodeVersioned(kv.value)
			if err != nil || !ok || i == 0 || kv.v.Tombstone || kv.v.HasOlder {
				r.problem(&r.Other, "inline chunk key %x version %d is malformed", ck.prefix, kv.v.S)
				continue
			}
			chunks[chunkID{h, i, kv.v.S}] = len(payload)
		}
	}
	for _, ck := range all {
		if checkKind(ck) != kindBlock || len(ck.t) != 6 {
			continue
		}
		if o, _ := asUint(ck.t[5]); o != 0 {
			continue
		}
		d, _ := asUint(ck.t[2])
		c, _ := asUint(ck.t[3])
		h := Handle{D: d, C: c}
		for _, kv := range ck.vs {
			if kv.v.Tombstone {
				continue
			}
			_, payload, err := decodeVersioned(kv.value)
			if err != nil {
				continue // the views report it
			}
			e, err := decodeBlockEntry(payload)
			if err != nil || !e.inline() {
				continue
			}
			for i := uint64(1); i <= inlineChunks(e.Length); i++ {
				id := chunkID{h, i, kv.v.S}
				n, ok := chunks[id]
				want := min(e.Length-i*InlineChunkBytes, InlineChunkBytes)
				switch {
				case !ok:
					r.problem(&r.Lost, "inline block of %v at version %d (%d bytes) has no chunk %d", h, kv.v.S, e.Length, i)
				case uint64(n) != want:
					r.problem(&r.Lost, "inline chunk %d of %v at version %d holds %d bytes, want %d", i, h, kv.v.S, n, want)
				}
				delete(chunks, id)
			}
		}
	}
	for id, n := range chunks {
		r.problem(&r.Leaked, "inline chunk %d of %v at version %d (%d bytes) belongs to no inline block", id.i, id.h, id.s, n)
	}
}
