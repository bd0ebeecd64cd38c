// Package fsclienttest is the model test of a file system as its clients
// see it (internal/fsclient's FS): random POSIX operations, data included,
// checked one by one against a plain tree in memory, with snapshots and a
// final fsck (STYLE.md §6). It runs over anything that serves a file
// system: a file system run in process (internal/fsclient's tests) or
// metadata servers with failures injected (internal/meta's tests).
package fsclienttest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/fsclient"
	"github.com/arbor-storage/arbor/internal/testseed"
)

// System is a file system under test.
type System interface {
	// FS is the client the operations go through.
	FS() *fsclient.FS
	// CreateSnapshot takes a snapshot named name and returns its number.
	CreateSnapshot(ctx context.Context, name string) (uint64, error)
	// DeleteSnapshot deletes snapshot n.
	DeleteSnapshot(ctx context.Context, n uint64) error
	// OpenSnapshot returns a client that reads snapshot n.
	OpenSnapshot(t testing.TB, n uint64) *fsclient.FS
	// Check checks the whole file system, data included (fsck).
	Check(ctx context.Context) (*fs.CheckReport, error)
}

// Options configure a model run.
type Options struct {
	// Seed makes the run repeatable.
	Seed uint64
	// Steps is the number of random operations.
	Steps int
	// CompareEvery compares the whole tree every so many steps (0: 500).
	CompareEvery int
	// Between, if set, runs after every step (fault injection: kills,
	// table moves and splits).
	Between func(step int)
	// DataTracts, if set, returns the tracts the data store holds, which
	// after the run must be exactly those the live tree references.
	DataTracts func() int
	// ReclaimWithin is how long an unlinked file may outlive its last
	// close (0: not at all). A metadata server that took a table over
	// recently reclaims such a file once it knows every session's opens
	// (fs.Config.OpensKnown).
	ReclaimWithin time.Duration
}

// Report is what a run did.
type Report struct {
	Ops     map[string]int
	Objects int
	Tracts  int
}

// Seed returns the test's seed: ARBOR_SEED if set, else a random one
// (internal/testseed, the one seed of every randomised test).
func Seed(t testing.TB) uint64 { return testseed.Seed(t) }

// Run runs random operations against sys and the model, one at a time,
// comparing every result and, now and then, the whole tree and every
// snapshot; then deletes the snapshots and checks that the stores hold
// nothing more than the live tree needs.
func Run(t testing.TB, sys System, o Options) Report {
	t.Helper()
	if o.CompareEvery == 0 {
		o.CompareEvery = 500
	}
	r := &modelRun{t: t, ctx: context.Background(), rng: rand.New(rand.NewPCG(o.Seed, 17)), sys: sys,
		f: sys.FS(), m: newModel(), handles: map[int]fs.Handle{0: fs.RootHandle}, open: map[int]*openFile{},
		snaps: map[uint64]*model{}, ops: map[string]int{}, opts: o}
	for i := range o.Steps {
		r.step()
		if i%o.CompareEvery == o.CompareEvery-1 {
			r.compare(fmt.Sprintf("step %d", i), r.f, r.m)
		}
		if o.Between != nil {
			o.Between(i)
		}
	}
	for _, of := range r.open {
		for range of.n {
			r.check("release", r.f.Release(r.ctx, of.h), 0)
		}
	}
	r.open = map[int]*openFile{}
	// Flushes after close (fsclient FSConfig.FlushAfterClose) land before
	// the stores are checked.
	r.check("syncfs", r.f.SyncAll(r.ctx), 0)
	r.compare("end", r.f, r.m)
	for n, sm := range r.snaps {
		r.compare(fmt.Sprintf("snapshot %d", n), sys.OpenSnapshot(t, n), sm)
	}
	rep, err := sys.Check(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %d problems: %v", len(rep.Problems), rep.Problems)
	}
	for n := range r.snaps {
		if err := sys.DeleteSnapshot(r.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = sys.Check(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Garbage != 0 {
		t.Fatalf("check after deleting every snapshot: garbage %d, %d problems: %v", rep.Garbage, len(rep.Problems), rep.Problems)
	}
	if o.DataTracts != nil {
		if tracts := o.DataTracts(); tracts != rep.Tracts {
			t.Fatalf("the data store holds %d tracts, the live tree references %d", tracts, rep.Tracts)
		}
	}
	return Report{Ops: r.ops, Objects: rep.Objects, Tracts: rep.Tracts}
}

// The model: a plain tree of nodes in memory (STYLE.md §6). Hard links
// share a node.
type mNode struct {
	id       int
	typ      uint32
	perm     uint32
	data     []byte
	target   string
	children map[string]*mNode
	xattrs   map[string]string
}

func (n *mNode) isDir() bool { return n.typ == syscall.S_IFDIR }

type model struct {
	root   *mNode
	nextID int
}

func newModel() *model {
	return &model{root: &mNode{id: 0, typ: syscall.S_IFDIR, perm: 0o755, children: map[string]*mNode{}}, nextID: 1}
}

// clone deep-copies the tree, keeping hard links shared.
func (m *model) clone() *model {
	seen := map[*mNode]*mNode{}
	var cp func(n *mNode) *mNode
	cp = func(n *mNode) *mNode {
		if c, ok := seen[n]; ok {
			return c
		}
		c := &mNode{id: n.id, typ: n.typ, perm: n.perm, data: bytes.Clone(n.data), target: n.target}
		if n.xattrs != nil {
			c.xattrs = map[string]string{}
			for k, v := range n.xattrs {
				c.xattrs[k] = v
			}
		}
		seen[n] = c
		if n.children != nil {
			c.children = map[string]*mNode{}
			for name, ch := range n.children {
				c.children[name] = cp(ch)
			}
		}
		return c
	}
	return &model{root: cp(m.root), nextID: m.nextID}
}

// paths lists every path of the tree ("" is the root), in order.
func (m *model) paths() []string {
	var out []string
	var walk func(p string, n *mNode)
	walk = func(p string, n *mNode) {
		out = append(out, p)
		names := make([]string, 0, len(n.children))
		for name := range n.children {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			walk(path.Join(p, name), n.children[name])
		}
	}
	walk("", m.root)
	return out
}

func (m *model) lookup(p string) *mNode {
	n := m.root
	if p == "" {
		return n
	}
	for _, part := range splitPath(p) {
		if n == nil || !n.isDir() {
			return nil
		}
		n = n.children[part]
	}
	return n
}

func splitPath(p string) []string {
	if p == "" {
		return nil
	}
	return bytes2str(bytes.Split([]byte(p), []byte("/")))
}

func bytes2str(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

// nlinks counts each node's names in the tree.
func (m *model) nlinks() map[*mNode]int {
	out := map[*mNode]int{}
	var walk func(n *mNode)
	walk = func(n *mNode) {
		for _, ch := range n.children {
			out[ch]++
			if ch.isDir() {
				out[n]++ // the child's ".."
				walk(ch)
			}
		}
	}
	walk(m.root)
	return out
}

// modelRun drives an FS and the model with the same random operations.
type modelRun struct {
	t       testing.TB
	ctx     context.Context
	rng     *rand.Rand
	sys     System
	f       *fsclient.FS
	m       *model
	handles map[int]fs.Handle // model node id -> handle
	open    map[int]*openFile
	snaps   map[uint64]*model
	nextSn  uint64
	ops     map[string]int
	opts    Options
}

type openFile struct {
	node *mNode
	h    fs.Handle
	n    int // open handles
}

func (r *modelRun) pickPath(filter func(*mNode) bool) (string, *mNode) {
	var cands []string
	for _, p := range r.m.paths() {
		if filter == nil || filter(r.m.lookup(p)) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return "", nil
	}
	p := cands[r.rng.IntN(len(cands))]
	return p, r.m.lookup(p)
}

func (r *modelRun) handleOf(p string) fs.Handle {
	return r.handles[r.m.lookup(p).id]
}

func (r *modelRun) name() string {
	names := []string{"a", "b", "c", "d", "e", "f", "g"}
	return names[r.rng.IntN(len(names))]
}

func (r *modelRun) check(what string, err error, want syscall.Errno) {
	r.t.Helper()
	got := fs.Errno(err)
	if got != want {
		r.t.Fatalf("%s: got error %v (%v), want %v", what, got, err, want)
	}
}

// boundary returns a size at or next to a boundary of inline data: 0,
// the chunks' edges, fs.MaxInlineBytes, the first block's end.
func (r *modelRun) boundary() int {
	edges := []int{0, fs.InlineChunkBytes, 2 * fs.InlineChunkBytes, fs.MaxInlineBytes, fs.MaxInlineBytes + fs.InlineChunkBytes}
	return max(0, edges[r.rng.IntN(len(edges))]+r.rng.IntN(3)-1)
}

func isDirNode(n *mNode) bool  { return n != nil && n.isDir() }
func isFileNode(n *mNode) bool { return n != nil && n.typ == syscall.S_IFREG }

// below reports whether directory node d is a or inside a.
func (r *modelRun) below(dpath, apath string) bool {
	return dpath == apath || (apath == "" || len(dpath) > len(apath) && dpath[:len(apath)+1] == apath+"/")
}

func (r *modelRun) step() {
	ctx := r.ctx
	switch op := r.rng.IntN(100); {
	case op < 12: // create a file, directory, symlink or fifo
		dp, dn := r.pickPath(isDirNode)
		name := r.name()
		kind := r.rng.IntN(4)
		var a fs.Attr
		var err error
		switch kind {
		case 0:
			a, err = r.f.Create(ctx, r.handleOf(dp), name, 0o644, fs.Cred{Uid: 5, Gid: 6})
		case 1:
			a, err = r.f.Mkdir(ctx, r.handleOf(dp), name, 0o750, fs.Cred{})
		case 2:
			a, err = r.f.Symlink(ctx, r.handleOf(dp), name, "target-"+strconv.Itoa(r.m.nextID), fs.Cred{})
		case 3:
			a, err = r.f.Mknod(ctx, r.handleOf(dp), name, syscall.S_IFIFO|0o600, 0, fs.Cred{})
		}
		r.ops["create"]++
		if dn.children[name] != nil {
			r.check("create existing", err, syscall.EEXIST)
			return
		}
		r.check("create", err, 0)
		if kind == 0 {
			// Create opens the file (creat(2)); close it.
			r.check("release after create", r.f.Release(ctx, a.Handle), 0)
		}
		n := &mNode{id: r.m.nextID}
		r.m.nextID++
		switch kind {
		case 0:
			n.typ, n.perm = syscall.S_IFREG, 0o644
		case 1:
			n.typ, n.perm, n.children = syscall.S_IFDIR, 0o750, map[string]*mNode{}
		case 2:
			n.typ, n.perm, n.target = syscall.S_IFLNK, 0o777, "target-"+strconv.Itoa(n.id)
		case 3:
			n.typ, n.perm = syscall.S_IFIFO, 0o600
		}
		dn.children[name] = n
		r.handles[n.id] = a.Handle
	case op < 17: // hard link
		sp, sn := r.pickPath(func(n *mNode) bool { return n != nil && !n.isDir() })
		if sn == nil {
			return
		}
		dp, dn := r.pickPath(isDirNode)
		name := r.name()
		_, err := r.f.Link(ctx, r.handleOf(sp), r.handleOf(dp), name)
		r.ops["link"]++
		if dn.children[name] != nil {
			r.check("link over existing", err, syscall.EEXIST)
			return
		}
		r.check("link", err, 0)
		dn.children[name] = sn
	case op < 27: // unlink or rmdir
		p, n := r.pickPath(func(n *mNode) bool { return n != r.m.root })
		if n == nil {
			return
		}
		dir, name := path.Split(p)
		dir = trimSlash(dir)
		rmdir := r.rng.IntN(2) == 0
		var err error
		if rmdir {
			err = r.f.Rmdir(ctx, r.handleOf(dir), name)
		} else {
			err = r.f.Unlink(ctx, r.handleOf(dir), name)
		}
		r.ops["remove"]++
		switch {
		case rmdir && !n.isDir():
			r.check("rmdir of non-dir", err, syscall.ENOTDIR)
		case !rmdir && n.isDir():
			r.check("unlink of dir", err, syscall.EISDIR)
		case rmdir && len(n.children) > 0:
			r.check("rmdir of non-empty", err, syscall.ENOTEMPTY)
		default:
			r.check("remove", err, 0)
			delete(r.m.lookup(dir).children, name)
		}
	case op < 42: // rename, with its edge cases
		sp, sn := r.pickPath(func(n *mNode) bool { return n != r.m.root })
		if sn == nil {
			return
		}
		dp, dn := r.pickPath(isDirNode)
		name := r.name()
		if r.rng.IntN(4) == 0 {
			// Onto an existing name, to replace it.
			if names := sortedNames(dn); len(names) > 0 {
				name = names[r.rng.IntN(len(names))]
			}
		}
		sdir, sname := path.Split(sp)
		sdir = trimSlash(sdir)
		var flags uint32
		if r.rng.IntN(8) == 0 {
			flags = fs.RenameNoReplace
		}
		err := r.f.Rename(ctx, r.handleOf(sdir), sname, r.handleOf(dp), name, flags)
		r.ops["rename"]++
		target := dn.children[name]
		switch {
		case target != nil && flags&fs.RenameNoReplace != 0 && !(target == sn && false):
			r.check("rename noreplace", err, syscall.EEXIST)
		case target == sn:
			r.check("rename onto itself", err, 0)
		case sn.isDir() && r.below(dp, sp):
			r.check("rename into itself", err, syscall.EINVAL)
		case target != nil && sn.isDir() && !target.isDir():
			r.check("rename dir over file", err, syscall.ENOTDIR)
		case target != nil && !sn.isDir() && target.isDir():
			r.check("rename file over dir", err, syscall.EISDIR)
		case target != nil && target.isDir() && len(target.children) > 0:
			r.check("rename over full dir", err, syscall.ENOTEMPTY)
		default:
			r.check("rename", err, 0)
			delete(r.m.lookup(sdir).children, sname)
			dn.children[name] = sn
		}
	case op < 57: // write
		p, n := r.pickPath(isFileNode)
		if n == nil {
			return
		}
		h := r.handleOf(p)
		off := r.rng.IntN(300 << 10)
		buf := make([]byte, r.rng.IntN(20<<10)+1)
		if r.rng.IntN(2) == 0 {
			// A small file's sizes: its data ends at or next to a
			// boundary of inline data (fs.MaxInlineBytes, its chunks).
			end := r.boundary()
			off = r.rng.IntN(end + 1)
			if r.rng.IntN(2) == 0 {
				off = 0
			}
			buf = make([]byte, max(1, end-off))
		}
		for i := range buf {
			buf[i] = byte(r.rng.Uint32())
		}
		_, err := r.f.Write(ctx, h, int64(off), buf)
		r.ops["write"]++
		r.check("write", err, 0)
		if off+len(buf) > len(n.data) {
			n.data = append(n.data, make([]byte, off+len(buf)-len(n.data))...)
		}
		copy(n.data[off:], buf)
		if r.rng.IntN(3) == 0 {
			r.check("flush", r.f.Flush(ctx, h), 0)
		}
	case op < 62: // truncate
		p, n := r.pickPath(isFileNode)
		if n == nil {
			return
		}
		size := r.rng.IntN(len(n.data) + 40<<10)
		if r.rng.IntN(2) == 0 {
			size = r.boundary() // back to (or around) a small file's sizes
		}
		_, err := r.f.SetAttr(ctx, r.handleOf(p), fs.SetAttrIn{Valid: fs.SetSize, Size: uint64(size)})
		r.ops["truncate"]++
		r.check("truncate", err, 0)
		if size < len(n.data) {
			n.data = n.data[:size]
		} else {
			n.data = append(n.data, make([]byte, size-len(n.data))...)
		}
	case op < 67: // read and compare
		p, n := r.pickPath(isFileNode)
		if n == nil {
			return
		}
		got := make([]byte, len(n.data)+10)
		k, err := r.f.Read(ctx, r.handleOf(p), 0, got)
		r.ops["read"]++
		r.check("read", err, 0)
		if !bytes.Equal(got[:k], n.data) {
			r.t.Fatalf("read %s: %d bytes, want %d (first difference at %d)", p, k, len(n.data), firstDiff(got[:k], n.data))
		}
	case op < 73: // open, or unlink an open file and use it, or close
		if len(r.open) > 0 && r.rng.IntN(2) == 0 {
			ids := make([]int, 0, len(r.open))
			for id := range r.open {
				ids = append(ids, id)
			}
			slices.Sort(ids)
			of := r.open[ids[r.rng.IntN(len(ids))]]
			// Still readable and writable, named or not.
			got := make([]byte, len(of.node.data)+10)
			k, err := r.f.Read(ctx, of.h, 0, got)
			r.check("read open file", err, 0)
			if !bytes.Equal(got[:k], of.node.data) {
				r.t.Fatalf("read of open file %v: %d bytes, want %d", of.h, k, len(of.node.data))
			}
			buf := []byte("written while open")
			_, err = r.f.Write(ctx, of.h, 7, buf)
			r.check("write open file", err, 0)
			if 7+len(buf) > len(of.node.data) {
				of.node.data = append(of.node.data, make([]byte, 7+len(buf)-len(of.node.data))...)
			}
			copy(of.node.data[7:], buf)
			r.check("release", r.f.Release(ctx, of.h), 0)
			r.ops["release"]++
			of.n--
			if of.n == 0 {
				delete(r.open, of.node.id)
				if r.m.nlinks()[of.node] == 0 {
					deadline := time.Now().Add(r.opts.ReclaimWithin)
					for {
						_, err := r.f.GetAttr(ctx, of.h)
						if fs.Errno(err) == syscall.ENOENT {
							break
						}
						if time.Now().After(deadline) {
							r.t.Fatalf("unlinked file %v lives on %v after its last close: %v", of.h, r.opts.ReclaimWithin, err)
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
			}
			return
		}
		p, n := r.pickPath(isFileNode)
		if n == nil {
			return
		}
		h := r.handleOf(p)
		_, err := r.f.Open(ctx, h)
		r.check("open", err, 0)
		r.ops["open"]++
		of := r.open[n.id]
		if of == nil {
			of = &openFile{node: n, h: h}
			r.open[n.id] = of
		}
		of.n++
	case op < 78: // extended attributes
		p, n := r.pickPath(nil)
		h := r.handleOf(p)
		name := "user." + r.name()
		switch r.rng.IntN(3) {
		case 0:
			v := "v" + strconv.Itoa(r.rng.IntN(100))
			r.check("setxattr", r.f.SetXattr(ctx, h, name, []byte(v), 0), 0)
			if n.xattrs == nil {
				n.xattrs = map[string]string{}
			}
			n.xattrs[name] = v
		case 1:
			err := r.f.RemoveXattr(ctx, h, name)
			if _, ok := n.xattrs[name]; ok {
				r.check("removexattr", err, 0)
				delete(n.xattrs, name)
			} else {
				r.check("removexattr missing", err, syscall.ENODATA)
			}
		case 2:
			v, err := r.f.GetXattr(ctx, h, name)
			if want, ok := n.xattrs[name]; ok {
				r.check("getxattr", err, 0)
				if string(v) != want {
					r.t.Fatalf("getxattr %s %s = %q, want %q", p, name, v, want)
				}
			} else {
				r.check("getxattr missing", err, syscall.ENODATA)
			}
		}
		r.ops["xattr"]++
	case op < 82: // chmod
		p, n := r.pickPath(func(n *mNode) bool { return n != nil && n.typ != syscall.S_IFLNK })
		perm := uint32(r.rng.IntN(0o1000))
		_, err := r.f.SetAttr(ctx, r.handleOf(p), fs.SetAttrIn{Valid: fs.SetMode, Mode: perm})
		r.check("chmod", err, 0)
		n.perm = perm
		r.ops["chmod"]++
	case op < 86: // snapshot
		r.nextSn++
		// A snapshot holds what the stores hold: this client's buffered
		// writes are in it only once flushed.
		r.check("sync", r.f.SyncAll(ctx), 0)
		n, err := r.sys.CreateSnapshot(ctx, "s"+strconv.Itoa(int(r.nextSn)))
		r.check("snapshot", err, 0)
		r.snaps[n] = r.m.clone()
		r.ops["snapshot"]++
	case op < 88: // delete a snapshot
		if len(r.snaps) == 0 {
			return
		}
		nums := make([]uint64, 0, len(r.snaps))
		for n := range r.snaps {
			nums = append(nums, n)
		}
		slices.Sort(nums)
		n := nums[r.rng.IntN(len(nums))]
		r.check("delete snapshot", r.sys.DeleteSnapshot(ctx, n), 0)
		delete(r.snaps, n)
		r.ops["snapshot-delete"]++
	case op < 91: // verify a snapshot
		for n, sm := range r.snaps {
			r.compare(fmt.Sprintf("snapshot %d", n), r.sys.OpenSnapshot(r.t, n), sm)
			break
		}
	default: // readdir of a directory
		p, n := r.pickPath(isDirNode)
		ents, err := r.f.ReadDir(ctx, r.handleOf(p), 0, 0)
		r.check("readdir", err, 0)
		if got, want := entryNames(ents), sortedNames(n); !slices.Equal(sortedCopy(got), want) {
			r.t.Fatalf("readdir %q: %v, want %v", p, got, want)
		}
	}
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

func sortedNames(n *mNode) []string {
	out := make([]string, 0, len(n.children))
	for name := range n.children {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func entryNames(ents []fs.DirEntry) []string {
	out := make([]string, len(ents))
	for i, e := range ents {
		out[i] = e.Name
	}
	return out
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// compare checks that f shows exactly the model's tree: names, types,
// link counts, permissions, sizes, contents, targets and attributes.
func (r *modelRun) compare(what string, f *fsclient.FS, m *model) {
	r.t.Helper()
	ctx := r.ctx
	links := m.nlinks()
	seen := map[*mNode]fs.Handle{}
	var walk func(p string, h fs.Handle, n *mNode)
	walk = func(p string, h fs.Handle, n *mNode) {
		a, err := f.GetAttr(ctx, h)
		if err != nil {
			r.t.Fatalf("%s: getattr %q: %v", what, p, err)
		}
		if prev, ok := seen[n]; ok && prev != h {
			r.t.Fatalf("%s: %q: hard link has handle %v, another name has %v", what, p, h, prev)
		}
		seen[n] = h
		if a.Mode&syscall.S_IFMT != n.typ || a.Mode&0o7777 != n.perm {
			r.t.Fatalf("%s: %q: mode %o, want %o", what, p, a.Mode, n.typ|n.perm)
		}
		want := links[n]
		if n.isDir() {
			// links counts its names (one, none for the root) and its
			// subdirectories' "..".
			want = 2 + links[n]
			if n != m.root {
				want--
			}
		}
		if int(a.Nlink) != want {
			r.t.Fatalf("%s: %q: nlink %d, want %d", what, p, a.Nlink, want)
		}
		switch n.typ {
		case syscall.S_IFREG:
			if a.Size != uint64(len(n.data)) {
				r.t.Fatalf("%s: %q: size %d, want %d", what, p, a.Size, len(n.data))
			}
			got := make([]byte, len(n.data)+10)
			k, err := f.Read(ctx, h, 0, got)
			if err != nil || !bytes.Equal(got[:k], n.data) {
				r.t.Fatalf("%s: %q: read %d bytes (%v), want %d (first difference %d)", what, p, k, err, len(n.data), firstDiff(got[:k], n.data))
			}
		case syscall.S_IFLNK:
			tg, err := f.Readlink(ctx, h)
			if err != nil || tg != n.target {
				r.t.Fatalf("%s: %q: readlink %q (%v), want %q", what, p, tg, err, n.target)
			}
		case syscall.S_IFDIR:
			ents, err := f.ReadDir(ctx, h, 0, 0)
			if err != nil {
				r.t.Fatalf("%s: readdir %q: %v", what, p, err)
			}
			if got := sortedCopy(entryNames(ents)); !slices.Equal(got, sortedNames(n)) {
				r.t.Fatalf("%s: readdir %q: %v, want %v", what, p, got, sortedNames(n))
			}
			for _, e := range ents {
				ch := n.children[e.Name]
				la, err := f.Lookup(ctx, h, e.Name)
				if err != nil || la.Handle != e.Handle {
					r.t.Fatalf("%s: lookup %q/%q: %v %v, readdir says %v", what, p, e.Name, la.Handle, err, e.Handle)
				}
				walk(path.Join(p, e.Name), e.Handle, ch)
			}
		}
		names, err := f.ListXattr(ctx, h)
		if err != nil {
			r.t.Fatalf("%s: listxattr %q: %v", what, p, err)
		}
		var want2 []string
		for k := range n.xattrs {
			want2 = append(want2, k)
		}
		sort.Strings(want2)
		if got := sortedCopy(names); !slices.Equal(got, want2) {
			r.t.Fatalf("%s: listxattr %q: %v, want %v", what, p, got, want2)
		}
	}
	walk("", fs.RootHandle, m.root)
}
