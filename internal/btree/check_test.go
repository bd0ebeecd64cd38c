package btree

import (
	"context"
	"strings"
	"testing"
)

// TestCheckFindsDamage: Check (what `arbor kv check` runs) passes a sound
// tree and reports each kind of damage written straight into the store: a
// gap between leaves, a page at the wrong height, a torn page, a broken
// right link, a page its block header does not know and a leaked page.
func TestCheckFindsDamage(t *testing.T) {
	ctx := context.Background()
	// rewrite replaces the page at ref with what change makes of it,
	// behind the tree's back.
	rewrite := func(t *testing.T, env *testEnv, ref PageRef, change func(p *page) []byte) {
		t.Helper()
		data, slot, err := env.store.Read(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		p, err := decodePage(data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.store.Commit(ctx, []Op{{Kind: OpWrite, Ref: ref, Slot: slot, Data: change(p.clone())}}); err != nil {
			t.Fatal(err)
		}
	}
	// A leaf in the middle of the key space, and its block's header.
	middleLeaf := func(t *testing.T, tr *Tree) located {
		t.Helper()
		loc, err := tr.locate(ctx, key(150), 0)
		if err != nil {
			t.Fatal(err)
		}
		if loc.p.hiInf || len(loc.p.keys) < 2 {
			t.Fatalf("leaf %v is the last or holds %d keys", loc.ref, len(loc.p.keys))
		}
		return loc
	}
	headerOf := func(t *testing.T, tr *Tree, ref PageRef) PageRef {
		t.Helper()
		g, err := tr.geometry(ctx, ref.Extent)
		if err != nil {
			t.Fatal(err)
		}
		h := ref
		h.Page = g.BlockOf(ref.Page)
		return h
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, env *testEnv, tr *Tree)
		want   []string
	}{
		{"gap between leaves", func(t *testing.T, env *testEnv, tr *Tree) {
			loc := middleLeaf(t, tr)
			rewrite(t, env, loc.ref, func(p *page) []byte {
				// Drop the last key and end the page at it: the range
				// from there to the next leaf belongs to no page.
				last := len(p.keys) - 1
				p.hi = p.keys[last]
				p.keys, p.vals = p.keys[:last], p.vals[:last]
				return p.encode()
			})
		}, []string{"but the next begins at", "its parent gives it"}},
		{"wrong height", func(t *testing.T, env *testEnv, tr *Tree) {
			loc, err := tr.locate(ctx, key(150), 1)
			if err != nil {
				t.Fatal(err)
			}
			rewrite(t, env, loc.ref, func(p *page) []byte { p.height++; return p.encode() })
		}, []string{"want a tree page of height 1"}},
		{"torn page", func(t *testing.T, env *testEnv, tr *Tree) {
			loc := middleLeaf(t, tr)
			rewrite(t, env, loc.ref, func(p *page) []byte {
				b := p.encode()
				b[len(b)-1] ^= 0xff // the CRC no longer matches
				return b
			})
		}, []string{"is stale or does not decode"}},
		{"broken right link", func(t *testing.T, env *testEnv, tr *Tree) {
			loc := middleLeaf(t, tr)
			rewrite(t, env, loc.ref, func(p *page) []byte { p.next = tr.Root(); return p.encode() })
		}, []string{"links to", "the next page is"}},
		{"page unknown to its block header", func(t *testing.T, env *testEnv, tr *Tree) {
			loc := middleLeaf(t, tr)
			hdr := headerOf(t, tr, loc.ref)
			rewrite(t, env, hdr, func(p *page) []byte { p.used[loc.ref.Page-hdr.Page] = false; return p.encode() })
		}, []string{"not marked used in the header"}},
		{"leaked page", func(t *testing.T, env *testEnv, tr *Tree) {
			// Mark a free page of some leaf's block used.
			for i := 0; i < 300; i += 5 {
				loc, err := tr.locate(ctx, key(i), 0)
				if err != nil {
					t.Fatal(err)
				}
				hdr := headerOf(t, tr, loc.ref)
				data, _, err := env.store.Read(ctx, hdr)
				if err != nil {
					t.Fatal(err)
				}
				h, err := decodePage(data)
				if err != nil {
					t.Fatal(err)
				}
				for j, u := range h.used {
					if !u {
						rewrite(t, env, hdr, func(p *page) []byte { p.used[j] = true; return p.encode() })
						return
					}
				}
			}
			t.Fatal("every leaf's block is full")
		}, []string{"marked used but not in the tree (leaked)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnv(t, 5, testGeometry)
			tr := env.open(t, func(c *Config) { c.RebalanceQueue = -1 })
			loadKeys(t, tr, 300)
			if rep := mustCheck(t, tr); rep.Height < 2 {
				t.Fatalf("tree of height %d: too low", rep.Height)
			}
			c.damage(t, env, tr)
			// A fresh client: nothing cached hides the damage.
			rep, err := env.open(t, func(c *Config) { c.RebalanceQueue = -1 }).Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() {
				t.Fatal("check found no problem")
			}
			all := strings.Join(rep.Problems, "\n")
			for _, w := range c.want {
				if !strings.Contains(all, w) {
					t.Errorf("problems do not mention %q:\n%s", w, all)
				}
			}
			t.Logf("%s", all)
		})
	}
}
