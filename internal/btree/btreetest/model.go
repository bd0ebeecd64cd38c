// Package btreetest holds the B-tree's model test, shared by the tests
// over the in-memory twin (package btree) and over real extents (package
// extentstore): random programs (gets, puts, deletes, atomic scans and
// multi-key transactions) run by concurrent clients, checked against a
// plain map, sequentially step by step and concurrently for
// linearizability (porcupine), ending with the tree's own Check.
package btreetest

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/arbor-storage/arbor/internal/btree"
)

// A program is what one client operation does: a sequence of steps run in
// one transaction (a lone get, put or delete uses the one-key calls).
type StepKind int

const (
	StepGet StepKind = iota
	StepPut
	StepDel
	StepScan
)

type Step struct {
	kind     StepKind
	key, val string
	to       string // scan: [key, to)
	limit    int
}

type Program []Step

type StepResult struct {
	found bool
	val   string
	pairs []btree.KV
}

type Output struct {
	Results []StepResult
	Unknown bool // ErrAmbiguous: applied or not
}

func (p Program) String() string {
	var parts []string
	for _, s := range p {
		switch s.kind {
		case StepGet:
			parts = append(parts, "get "+s.key)
		case StepPut:
			parts = append(parts, "put "+s.key+"="+s.val)
		case StepDel:
			parts = append(parts, "del "+s.key)
		case StepScan:
			parts = append(parts, fmt.Sprintf("scan [%s,%s) %d", s.key, s.to, s.limit))
		}
	}
	return strings.Join(parts, "; ")
}

// State is the reference: a plain map, never mutated once built.
type State map[string]string

// apply runs p on s; it returns the new state and the results p must see.
func (s State) apply(p Program) (State, []StepResult) {
	next := s
	copied := false
	write := func() {
		if !copied {
			next = make(State, len(s)+1)
			for k, v := range s {
				next[k] = v
			}
			copied = true
		}
	}
	var res []StepResult
	for _, st := range p {
		switch st.kind {
		case StepGet:
			v, ok := next[st.key]
			res = append(res, StepResult{found: ok, val: v})
		case StepPut:
			write()
			next[st.key] = st.val
			res = append(res, StepResult{})
		case StepDel:
			write()
			delete(next, st.key)
			res = append(res, StepResult{})
		case StepScan:
			var ks []string
			for k := range next {
				if k >= st.key && (st.to == "" || k < st.to) {
					ks = append(ks, k)
				}
			}
			sort.Strings(ks)
			if st.limit > 0 && len(ks) > st.limit {
				ks = ks[:st.limit]
			}
			var pairs []btree.KV
			for _, k := range ks {
				pairs = append(pairs, btree.KV{Key: []byte(k), Value: []byte(next[k])})
			}
			res = append(res, StepResult{pairs: pairs})
		}
	}
	return next, res
}

func resultsEqual(a, b []StepResult) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].found != b[i].found || a[i].val != b[i].val || len(a[i].pairs) != len(b[i].pairs) {
			return false
		}
		for j := range a[i].pairs {
			if !bytes.Equal(a[i].pairs[j].Key, b[i].pairs[j].Key) || !bytes.Equal(a[i].pairs[j].Value, b[i].pairs[j].Value) {
				return false
			}
		}
	}
	return true
}

// NewModel returns the porcupine model starting from the state initial:
// the state is the whole map (scans and transactions span keys, so the
// history cannot be partitioned by key).
// An operation with an unknown outcome may or may not have happened.
func NewModel(initial State) porcupine.NondeterministicModel {
	return porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{initial} },
		Step: func(state, input, output interface{}) []interface{} {
			s := state.(State)
			p := input.(Program)
			out := output.(Output)
			next, want := s.apply(p)
			if out.Unknown {
				return []interface{}{s, next}
			}
			if !resultsEqual(want, out.Results) {
				return nil
			}
			return []interface{}{next}
		},
		Equal: func(a, b interface{}) bool {
			x, y := a.(State), b.(State)
			if len(x) != len(y) {
				return false
			}
			for k, v := range x {
				if w, ok := y[k]; !ok || w != v {
					return false
				}
			}
			return true
		},
		Hash: func(state interface{}) uint64 {
			var h uint64
			for k, v := range state.(State) {
				f := fnv.New64a()
				f.Write([]byte(k))
				f.Write([]byte{0})
				f.Write([]byte(v))
				h ^= f.Sum64()
			}
			return h
		},
		DescribeOperation: func(input, output interface{}) string {
			out := output.(Output)
			return fmt.Sprintf("%v -> %+v", input, out)
		},
	}
}

// Run executes p against tr: a lone get, put or delete with the one-key
// calls, anything else in one transaction (View if it only reads).
func Run(ctx context.Context, tr *btree.Tree, p Program) ([]StepResult, error) {
	if len(p) == 1 {
		st := p[0]
		switch st.kind {
		case StepGet:
			v, ok, err := tr.Get(ctx, []byte(st.key))
			return []StepResult{{found: ok, val: string(v)}}, err
		case StepPut:
			return []StepResult{{}}, tr.Put(ctx, []byte(st.key), []byte(st.val))
		case StepDel:
			return []StepResult{{}}, tr.Delete(ctx, []byte(st.key))
		}
	}
	var res []StepResult
	readOnly := true
	for _, st := range p {
		readOnly = readOnly && (st.kind == StepGet || st.kind == StepScan)
	}
	fn := func(tx *btree.Txn) error {
		res = res[:0]
		for _, st := range p {
			var r StepResult
			var err error
			switch st.kind {
			case StepGet:
				var v []byte
				v, r.found, err = tx.Get([]byte(st.key))
				r.val = string(v)
			case StepPut:
				err = tx.Put([]byte(st.key), []byte(st.val))
			case StepDel:
				err = tx.Delete([]byte(st.key))
			case StepScan:
				var to []byte
				if st.to != "" {
					to = []byte(st.to)
				}
				r.pairs, err = tx.Scan([]byte(st.key), to, st.limit)
			}
			if err != nil {
				return err
			}
			res = append(res, r)
		}
		return nil
	}
	var err error
	if readOnly {
		err = tr.View(ctx, fn)
	} else {
		err = tr.Update(ctx, fn)
	}
	return res, err
}

// Generator makes random programs over a small key space, so clients
// collide and pages split and merge.
type Generator struct {
	r      *rand.Rand
	keys   int
	client int
	seq    int
}

// NewGenerator returns the generator of one client over keys keys.
func NewGenerator(seed uint64, client, keys int) *Generator {
	return &Generator{r: rand.New(rand.NewPCG(seed, uint64(client)+10)), keys: keys, client: client}
}

func (g *Generator) key() string { return fmt.Sprintf("key%03d", g.r.IntN(g.keys)) }

func (g *Generator) val() string {
	g.seq++
	// Values of varied length make pages fill unevenly.
	return fmt.Sprintf("c%d.%d%s", g.client, g.seq, strings.Repeat("x", g.r.IntN(40)))
}

func (g *Generator) Next() Program {
	switch x := g.r.IntN(100); {
	case x < 25:
		return Program{{kind: StepGet, key: g.key()}}
	case x < 50:
		return Program{{kind: StepPut, key: g.key(), val: g.val()}}
	case x < 65:
		return Program{{kind: StepDel, key: g.key()}}
	case x < 75:
		from := g.key()
		to := ""
		if g.r.IntN(4) > 0 {
			to = fmt.Sprintf("key%03d", g.r.IntN(g.keys)+1)
		}
		if to != "" && to < from {
			from, to = to, from
		}
		return Program{{kind: StepScan, key: from, to: to, limit: 1 + g.r.IntN(6)}}
	default:
		n := 2 + g.r.IntN(5)
		var p Program
		for range n {
			switch g.r.IntN(4) {
			case 0:
				p = append(p, Step{kind: StepGet, key: g.key()})
			case 1, 2:
				p = append(p, Step{kind: StepPut, key: g.key(), val: g.val()})
			default:
				p = append(p, Step{kind: StepDel, key: g.key()})
			}
		}
		return p
	}
}
