package nemesis

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/arbor-storage/arbor/internal/btree"
)

// kvWorker puts keys with known values and reads acknowledged ones back.
type kvWorker struct {
	tree *btree.Tree
	rng  *rand.Rand

	mu        sync.Mutex
	seq       int
	acked     map[string][]byte
	keys      []string
	uncertain int
	checked   int // keys[:checked] were verified at an earlier pause
}

func newKVWorker(tree *btree.Tree, seed uint64) *kvWorker {
	return &kvWorker{tree: tree, rng: rand.New(rand.NewPCG(seed, 0x6b76)), acked: map[string][]byte{}}
}

func (w *kvWorker) step(ctx context.Context) error {
	w.mu.Lock()
	put := len(w.keys) == 0 || w.rng.IntN(2) == 0
	var key string
	var val []byte
	if put {
		w.seq++
		key = fmt.Sprintf("chaos/k/%06d", w.seq)
		val = make([]byte, 16+w.rng.IntN(200))
		fillRandom(w.rng, val)
	} else {
		key = w.keys[w.rng.IntN(len(w.keys))]
		val = w.acked[key]
	}
	w.mu.Unlock()
	if put {
		if err := w.tree.Put(ctx, []byte(key), val); err != nil {
			w.mu.Lock()
			w.uncertain++
			w.mu.Unlock()
			return fmt.Errorf("kv put %s: %w", key, err)
		}
		w.mu.Lock()
		w.acked[key] = val
		w.keys = append(w.keys, key)
		w.mu.Unlock()
		return nil
	}
	got, ok, err := w.tree.Get(ctx, []byte(key))
	if err != nil {
		return fmt.Errorf("kv get %s: %w", key, err)
	}
	if !ok || !bytes.Equal(got, val) {
		return &lossError{what: fmt.Sprintf("acknowledged key %s read back as %q (found %v)", key, got, ok)}
	}
	return nil
}

// verify reads acknowledged keys back: all of them if full, else those
// acknowledged since the last verify and a sample of the older ones.
func (w *kvWorker) verify(ctx context.Context, full bool) (lost []string, keys int) {
	w.mu.Lock()
	acked := make(map[string][]byte, len(w.acked))
	for k, v := range w.acked {
		acked[k] = v
	}
	keyList := sampleOlder(w.keys, w.checked, full, w.rng)
	w.checked = len(w.keys)
	total := len(w.keys)
	w.mu.Unlock()
	for _, k := range keyList {
		var got []byte
		var ok bool
		var err error
		for attempt := 0; attempt < 3; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, opTimeout)
			got, ok, err = w.tree.Get(cctx, []byte(k))
			cancel()
			if err == nil {
				break
			}
		}
		switch {
		case err != nil:
			lost = append(lost, fmt.Sprintf("acknowledged key %s cannot be read: %v", k, err))
		case !ok:
			lost = append(lost, fmt.Sprintf("acknowledged key %s is gone", k))
		case !bytes.Equal(got, acked[k]):
			lost = append(lost, fmt.Sprintf("acknowledged key %s has the wrong value", k))
		}
	}
	return lost, total
}

// verifySample is how many of the objects verified at earlier pauses a
// pause verifies again (all of them at the end).
const verifySample = 100

// sampleOlder returns items[checked:] and, unless full, verifySample
// random items of items[:checked] (all of items if full).
func sampleOlder[T any](items []T, checked int, full bool, rng *rand.Rand) []T {
	if full || checked <= verifySample {
		return append([]T(nil), items...)
	}
	out := append([]T(nil), items[checked:]...)
	for range verifySample {
		out = append(out, items[rng.IntN(checked)])
	}
	return out
}

// The bank: accounts whose balances only move between each other.
const (
	bankAccounts = 8
	bankInitial  = 100
	bankTotal    = bankAccounts * bankInitial
	// porcupineTimeout bounds the linearizability check of one segment.
	porcupineTimeout = time.Minute
)

type balances [bankAccounts]int64

func accountKey(i int) []byte { return []byte(fmt.Sprintf("chaos/bank/%d", i)) }

var auditKey = []byte("chaos/bank/audit")

// bankInput is one bank operation: a transfer of amount from one account
// to another, or an audit of every account.
type bankInput struct {
	audit    bool
	from, to int
	amount   int64
}

// bankOutput is what it saw: for a transfer the two balances it read, for
// an audit every balance; unknown if the operation failed (it may or may
// not have happened).
type bankOutput struct {
	unknown bool
	read    balances
}

// bank runs transfers and audits and records their history for porcupine,
// in segments that end at each pause of the workload.
type bank struct {
	tree  *btree.Tree
	start time.Time

	mu   sync.Mutex
	rngs [2]*rand.Rand
	// history of the current segment; init is the state it starts from
	// (the audit at the last pause); carried are the previous segment's
	// operations of unknown outcome (they may still take effect).
	history  []porcupine.Operation
	init     balances
	carried  []porcupine.Operation
	segments int
	ops      int
}

func newBank(ctx context.Context, tree *btree.Tree, seed uint64) (*bank, error) {
	b := &bank{tree: tree, start: time.Now()}
	for i := range b.rngs {
		b.rngs[i] = rand.New(rand.NewPCG(seed+uint64(i), 0x62616e6b))
	}
	for i := range bankAccounts {
		b.init[i] = bankInitial
	}
	err := tree.Update(ctx, func(tx *btree.Txn) error {
		for i := range bankAccounts {
			if err := tx.Put(accountKey(i), []byte(strconv.Itoa(bankInitial))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("nemesis: set up the bank: %w", err)
	}
	return b, nil
}

func (b *bank) now() int64 { return int64(time.Since(b.start)) }

func readBalance(tx *btree.Txn, i int) (int64, error) {
	v, ok, err := tx.Get(accountKey(i))
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("account %d is missing", i)
	}
	return strconv.ParseInt(string(v), 10, 64)
}

// step runs one transfer, or (one time in ten) an audit, for client c.
func (b *bank) step(ctx context.Context, c int) error {
	b.mu.Lock()
	rng := b.rngs[c]
	in := bankInput{audit: rng.IntN(10) == 0}
	if !in.audit {
		in.from = rng.IntN(bankAccounts)
		in.to = (in.from + 1 + rng.IntN(bankAccounts-1)) % bankAccounts
		in.amount = 1 + rng.Int64N(20)
	}
	b.mu.Unlock()
	call := b.now()
	out, err := b.do(ctx, in)
	ret := b.now()
	if err != nil {
		out = bankOutput{unknown: true}
		ret = -1 // completes at the end of the segment, or later
	}
	b.mu.Lock()
	b.history = append(b.history, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
	b.ops++
	b.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bank: %w", err)
	}
	if in.audit {
		if sum := total(out.read); sum != bankTotal {
			return &lossError{what: fmt.Sprintf("bank audit: the accounts hold %d, not %d: %v", sum, bankTotal, out.read)}
		}
	}
	return nil
}

func total(bal balances) int64 {
	var s int64
	for _, v := range bal {
		s += v
	}
	return s
}

// do runs one operation as one B-tree transaction. An audit writes a
// counter so that it commits (and so is checked against every page it
// read) like a transfer.
func (b *bank) do(ctx context.Context, in bankInput) (bankOutput, error) {
	var out bankOutput
	err := b.tree.Update(ctx, func(tx *btree.Txn) error {
		out = bankOutput{}
		if in.audit {
			for i := range bankAccounts {
				v, err := readBalance(tx, i)
				if err != nil {
					return err
				}
				out.read[i] = v
			}
			return tx.Put(auditKey, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)))
		}
		f, err := readBalance(tx, in.from)
		if err != nil {
			return err
		}
		t, err := readBalance(tx, in.to)
		if err != nil {
			return err
		}
		out.read[in.from], out.read[in.to] = f, t
		if err := tx.Put(accountKey(in.from), []byte(strconv.FormatInt(f-in.amount, 10))); err != nil {
			return err
		}
		return tx.Put(accountKey(in.to), []byte(strconv.FormatInt(t+in.amount, 10)))
	})
	return out, err
}

// endSegment closes the current segment with an audit (run while the
// workload is paused), checks the segment's history for linearizability,
// and starts the next segment from the audit's balances. It returns the
// problems found and the segment's size.
func (b *bank) endSegment(ctx context.Context) (problems []string, ops int) {
	call := b.now()
	var out bankOutput
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		out, err = b.do(cctx, bankInput{audit: true})
		cancel()
		if err == nil {
			break
		}
	}
	if err != nil {
		return []string{fmt.Sprintf("bank: the audit at the pause failed: %v", err)}, 0
	}
	ret := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if sum := total(out.read); sum != bankTotal {
		problems = append(problems, fmt.Sprintf("bank: the accounts hold %d, not %d: %v", sum, bankTotal, out.read))
	}
	hist := append(append([]porcupine.Operation(nil), b.carried...), b.history...)
	hist = append(hist, porcupine.Operation{ClientId: 2, Input: bankInput{audit: true}, Call: call, Output: out, Return: ret})
	end := b.now() + int64(time.Hour)
	var carried []porcupine.Operation
	for i := range hist {
		if hist[i].Return < 0 {
			hist[i].Return = end
			if !b.isCarried(hist[i]) {
				carried = append(carried, hist[i])
			}
		}
	}
	ops = len(b.history)
	model := bankModel(b.init)
	res, _ := porcupine.CheckOperationsVerbose(model, hist, porcupineTimeout)
	switch res {
	case porcupine.Illegal:
		problems = append(problems, fmt.Sprintf("bank: the history of %d operations since the last pause is not linearizable (start %v, end %v)", len(hist), b.init, out.read))
	case porcupine.Unknown:
		problems = append(problems, fmt.Sprintf("bank: porcupine could not decide on %d operations within %v", len(hist), porcupineTimeout))
	}
	// The next segment starts from the audit; an unknown transfer of this
	// segment may still land in the next one (a prepared transaction that
	// a reader finishes), and is carried once.
	for i := range carried {
		carried[i].Call = ret
	}
	b.init, b.history, b.carried = out.read, nil, carried
	b.segments++
	return problems, ops
}

// isCarried reports whether op came from the previous segment (it is not
// carried again).
func (b *bank) isCarried(op porcupine.Operation) bool {
	for _, c := range b.carried {
		if c.Call == op.Call && c.ClientId == op.ClientId && c.Input == op.Input {
			return true
		}
	}
	return false
}

// bankModel is the bank's sequential specification, starting from init.
// A transfer must have read the balances the state holds; an operation of
// unknown outcome may have happened or not.
func bankModel(init balances) porcupine.Model {
	m := &porcupine.NondeterministicModel{
		Init: func() []any { return []any{init} },
		Step: func(state, input, output any) []any {
			s, in, out := state.(balances), input.(bankInput), output.(bankOutput)
			if in.audit {
				if out.unknown || out.read == s {
					return []any{s}
				}
				return nil
			}
			next := s
			next[in.from] -= in.amount
			next[in.to] += in.amount
			if out.unknown {
				return []any{s, next}
			}
			if out.read[in.from] != s[in.from] || out.read[in.to] != s[in.to] {
				return nil
			}
			return []any{next}
		},
		Equal: func(a, b any) bool { return a.(balances) == b.(balances) },
		DescribeOperation: func(input, output any) string {
			in, out := input.(bankInput), output.(bankOutput)
			if in.audit {
				return fmt.Sprintf("audit -> %v (unknown %v)", out.read, out.unknown)
			}
			return fmt.Sprintf("move %d from %d to %d -> read %d,%d (unknown %v)", in.amount, in.from, in.to, out.read[in.from], out.read[in.to], out.unknown)
		},
	}
	return m.ToModel()
}
