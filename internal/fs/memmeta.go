package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/arbor-storage/arbor/internal/btree/tuple"
)

// MemMeta is the in-memory twin of the metadata store: an ordered map
// with optimistic transactions. A transaction records what it read (keys
// and scanned ranges) and commits only if none of it changed since it
// started, so transactions are serializable; conflicts run the function
// again. It charges values like the B-tree: one per distinct key read or
// written, and one per scan that starts on a "page" the transaction has
// not touched, plus one per memPageEntries pairs it returns. Its pages
// are a model: the keys of one object (F, 1, D, C) share one, as a small
// directory's inode, names and cookies do in the B-tree. It refuses a
// transaction past MaxTxnValues with ErrTooManyValues, so tests catch an
// operation that would not fit. It can inject conflicts.
type MemMeta struct {
	mu      sync.Mutex
	keys    []string // sorted
	vals    map[string][]byte
	version uint64
	log     []memCommit // recent commits, for validation
	rng     *rand.Rand
	// conflictRate is the probability a commit fails as a conflict.
	conflictRate float64
	commits      int64
	conflicts    int64
	maxValues    int
}

type memCommit struct {
	version uint64
	keys    []string
}

// ErrTooManyValues is returned by MemMeta for a transaction past
// MaxTxnValues values.
var ErrTooManyValues = errors.New("fs: too many values in one transaction")

// memPageEntries is how many pairs the twin assumes share a page.
const memPageEntries = 32

// memMaxAttempts bounds how often MemMeta runs a transaction.
const memMaxAttempts = 1000

// memLogLen bounds the commits kept for validation; an older transaction
// fails as a conflict.
const memLogLen = 1 << 14

// NewMemMeta returns an empty store; seed drives injected conflicts.
func NewMemMeta(seed uint64) *MemMeta {
	return &MemMeta{vals: map[string][]byte{}, rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995))}
}

// SetConflictRate makes commits fail as conflicts with probability p.
func (m *MemMeta) SetConflictRate(p float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.conflictRate = p
}

// MaxValues returns the most values one committed transaction used.
func (m *MemMeta) MaxValues() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.maxValues
}

// Len returns the number of pairs.
func (m *MemMeta) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

// Bytes returns the total size of keys and values.
func (m *MemMeta) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, v := range m.vals {
		n += len(k) + len(v)
	}
	return n
}

type memTxn struct {
	m        *MemMeta
	start    uint64
	readOnly bool
	err      error
	counted  map[string]bool
	pages    map[string]bool
	values   int
	reads    map[string]bool
	ranges   [][2]string // [from, to); to "" means unbounded
	writes   map[string][]byte
	deletes  map[string]bool
}

func (t *memTxn) fail(err error) error {
	if t.err == nil {
		t.err = err
	}
	return err
}

func (t *memTxn) count(k string) error {
	if t.err != nil {
		return t.err
	}
	t.pages[memPage([]byte(k))] = true
	if t.counted[k] {
		return nil
	}
	if t.values+1 > MaxTxnValues {
		return t.fail(fmt.Errorf("%w: key %x would be value %d", ErrTooManyValues, k, t.values+1))
	}
	t.values++
	t.counted[k] = true
	return nil
}

func (t *memTxn) Get(k []byte) ([]byte, bool, error) {
	if err := t.count(string(k)); err != nil {
		return nil, false, err
	}
	ks := string(k)
	t.reads[ks] = true
	if t.deletes[ks] {
		return nil, false, nil
	}
	if v, ok := t.writes[ks]; ok {
		return bytes.Clone(v), true, nil
	}
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	v, ok := t.m.vals[ks]
	return bytes.Clone(v), ok, nil
}

func (t *memTxn) Put(k, v []byte) error {
	if t.readOnly {
		return t.fail(errors.New("fs: Put in a read-only transaction"))
	}
	if err := t.count(string(k)); err != nil {
		return err
	}
	delete(t.deletes, string(k))
	t.writes[string(k)] = bytes.Clone(v)
	return nil
}

func (t *memTxn) Delete(k []byte) error {
	if t.readOnly {
		return t.fail(errors.New("fs: Delete in a read-only transaction"))
	}
	if err := t.count(string(k)); err != nil {
		return err
	}
	delete(t.writes, string(k))
	t.deletes[string(k)] = true
	return nil
}

func (t *memTxn) Scan(from, to []byte, limit int) ([]KV, error) {
	if t.err != nil {
		return nil, t.err
	}
	t.m.mu.Lock()
	i := sort.SearchStrings(t.m.keys, string(from))
	var out []KV
	seen := map[string]bool{}
	for ; i < len(t.m.keys); i++ {
		k := t.m.keys[i]
		if to != nil && k >= string(to) {
			break
		}
		seen[k] = true
		out = append(out, KV{Key: []byte(k), Value: bytes.Clone(t.m.vals[k])})
	}
	t.m.mu.Unlock()
	// The transaction's own writes on top.
	for k, v := range t.writes {
		if k >= string(from) && (to == nil || k < string(to)) && !seen[k] {
			out = append(out, KV{Key: []byte(k), Value: bytes.Clone(v)})
		} else if seen[k] {
			for j := range out {
				if string(out[j].Key) == k {
					out[j].Value = bytes.Clone(v)
				}
			}
		}
	}
	out = slices.DeleteFunc(out, func(kv KV) bool { return t.deletes[string(kv.Key)] })
	sort.Slice(out, func(a, b int) bool { return bytes.Compare(out[a].Key, out[b].Key) < 0 })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	end := ""
	if to != nil {
		end = string(to)
	}
	if limit > 0 && len(out) == limit {
		end = string(out[len(out)-1].Key) + "\x00"
	}
	t.ranges = append(t.ranges, [2]string{string(from), end})
	// Charge it: free if it starts on a page this transaction touched and
	// reads no more than a page's worth of pairs.
	page := memPage(from)
	if cost := len(out) / memPageEntries; !t.pages[page] || cost > 0 {
		if !t.pages[page] {
			cost++
		}
		if t.values+cost > MaxTxnValues {
			return nil, t.fail(fmt.Errorf("%w: scan at %x would be value %d", ErrTooManyValues, from, t.values+cost))
		}
		t.values += cost
		t.pages[page] = true
	}
	return out, nil
}

func (m *MemMeta) run(ctx context.Context, readOnly bool, fn func(MetaTxn) error) error {
	for attempt := 0; attempt < memMaxAttempts; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		m.mu.Lock()
		t := &memTxn{m: m, start: m.version, readOnly: readOnly, counted: map[string]bool{}, pages: map[string]bool{}, reads: map[string]bool{},
			writes: map[string][]byte{}, deletes: map[string]bool{}}
		m.mu.Unlock()
		ferr := fn(t)
		if t.err != nil {
			return t.err
		}
		if ferr != nil {
			return ferr
		}
		ok := m.commit(t)
		if ok {
			return nil
		}
		if attempt > 4 {
			time.Sleep(time.Duration(m.rng.IntN(200)) * time.Microsecond)
		}
	}
	return fmt.Errorf("fs: memmeta transaction gave up after %d attempts", memMaxAttempts)
}

func (m *MemMeta) commit(t *memTxn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if (len(t.writes) > 0 || len(t.deletes) > 0) && m.conflictRate > 0 && m.rng.Float64() < m.conflictRate {
		m.conflicts++
		return false
	}
	if t.start < m.version && (len(m.log) == 0 || m.log[0].version > t.start+1) {
		// Validation needs commits older than the log keeps.
		m.conflicts++
		return false
	}
	for _, c := range m.log {
		if c.version <= t.start {
			continue
		}
		for _, k := range c.keys {
			if t.reads[k] {
				m.conflicts++
				return false
			}
			for _, r := range t.ranges {
				if k >= r[0] && (r[1] == "" || k < r[1]) {
					m.conflicts++
					return false
				}
			}
		}
	}
	m.maxValues = max(m.maxValues, t.values)
	if len(t.writes) == 0 && len(t.deletes) == 0 {
		return true
	}
	m.version++
	var changed []string
	for k, v := range t.writes {
		if _, ok := m.vals[k]; !ok {
			i := sort.SearchStrings(m.keys, k)
			m.keys = slices.Insert(m.keys, i, k)
		}
		m.vals[k] = v
		changed = append(changed, k)
	}
	for k := range t.deletes {
		if _, ok := m.vals[k]; ok {
			i := sort.SearchStrings(m.keys, k)
			m.keys = slices.Delete(m.keys, i, i+1)
			delete(m.vals, k)
		}
		changed = append(changed, k)
	}
	m.log = append(m.log, memCommit{version: m.version, keys: changed})
	if len(m.log) > memLogLen {
		m.log = slices.Delete(m.log, 0, len(m.log)-memLogLen)
	}
	m.commits++
	return true
}

// Update implements MetaStore.
func (m *MemMeta) Update(ctx context.Context, fn func(MetaTxn) error) error {
	return m.run(ctx, false, fn)
}

// View implements MetaStore.
func (m *MemMeta) View(ctx context.Context, fn func(MetaTxn) error) error {
	return m.run(ctx, true, fn)
}

// Scan implements MetaStore: pairs are read in batches, each under the
// lock, so changes during the scan may or may not be seen.
func (m *MemMeta) Scan(ctx context.Context, from, to []byte, fn func(k, v []byte) error) error {
	resume := string(from)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		m.mu.Lock()
		i := sort.SearchStrings(m.keys, resume)
		var batch []KV
		for ; i < len(m.keys) && len(batch) < memPageEntries; i++ {
			k := m.keys[i]
			if to != nil && k >= string(to) {
				break
			}
			batch = append(batch, KV{Key: []byte(k), Value: bytes.Clone(m.vals[k])})
		}
		m.mu.Unlock()
		if len(batch) == 0 {
			return nil
		}
		for _, kv := range batch {
			if err := fn(kv.Key, kv.Value); err != nil {
				return err
			}
		}
		resume = string(batch[len(batch)-1].Key) + "\x00"
	}
}

// memPage is the twin's page of a key: the object prefix (F, 1, D, C) of
// an object key, else the key's first two elements.
func memPage(k []byte) string {
	t, err := tuple.Unpack(k)
	if err != nil {
		return string(k)
	}
	n := 2
	if len(t) >= 4 {
		if s, ok := t[1].(int64); ok && s == spaceObjects {
			n = 4
		}
	}
	n = min(n, len(t))
	return string(tuple.MustPack(t[:n]))
}
