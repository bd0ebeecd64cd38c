package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/security"
)

// The `arbor kv` commands are a KV client running in the CLI process: they
// reach the extent store directly (internal/kv), like any other client of
// the key-value API; there is no KV server. Each opens one key space
// (kvFlags.space): a tenant's own, or the administrators'.

// kvOpener opens the tree of a key space of the cluster; tests put an
// in-memory one in its place.
type kvOpener func(ctx context.Context, target clusterTarget, sp kv.Space, logger *slog.Logger) (*btree.Tree, func() error, error)

// openClusterKV opens the tree of key space sp of the cluster at target.
func openClusterKV(ctx context.Context, target clusterTarget, sp kv.Space, logger *slog.Logger) (*btree.Tree, func() error, error) {
	s, err := kv.Dial(ctx, target.Addrs, sp, logger, target.DialOptions()...)
	if err != nil {
		return nil, nil, err
	}
	return s.Tree, s.Close, nil
}

// Limits of the kv commands' input.
const (
	// maxBulkInputBytes bounds what `kv put --stdin` reads: it validates
	// everything before writing anything, so it holds it all.
	maxBulkInputBytes = 1 << 30
	// maxBulkParallel bounds `kv put --stdin --parallel`.
	maxBulkParallel = 64
	// maxTxnInputBytes bounds what `kv txn` reads.
	maxTxnInputBytes = 1 << 20
)

func newKVCmd(a *app) *cobra.Command {
	return newKVCmdWith(a, func(ctx context.Context, target clusterTarget, sp kv.Space, logger *slog.Logger) (*btree.Tree, func() error, error) {
		if err := probeCluster(ctx, target.Addrs); err != nil {
			return nil, nil, err
		}
		return openClusterKV(ctx, target, sp, logger)
	})
}

// kvFlags are what every kv command takes.
type kvFlags struct {
	cluster clusterFlags
	hex     bool
	tenant  string
}

func (f *kvFlags) register(cmd *cobra.Command) {
	f.cluster.register(cmd)
	cmd.Flags().BoolVar(&f.hex, "hex", false, "keys and values are hex-encoded, in arguments, input and output (for binary data)")
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "an administrator's way to the key space of tenant T (default: a tenant credential's own space; an administrator's own)")
}

// space is the key space the command opens: a tenant credential's own
// (--tenant may name only itself), or, for an administrator, tenant
// --tenant's or else the administrators' own. No credential opens the
// file systems' metadata (kv.SystemSpace).
func (f *kvFlags) space(target clusterTarget) (kv.Space, error) {
	if f.tenant != "" {
		if err := security.CheckName(f.tenant); err != nil {
			return kv.Space{}, fmt.Errorf("--tenant: %w", err)
		}
	}
	if c := target.Credentials; c != nil && c.Identity.Kind == security.KindTenant {
		if f.tenant != "" && f.tenant != c.Identity.Name {
			return kv.Space{}, fmt.Errorf("--tenant %s: the credential of tenant %q opens only its own key space", f.tenant, c.Identity.Name)
		}
		return kv.TenantSpace(c.Identity.Name), nil
	}
	if f.tenant != "" {
		return kv.TenantSpace(f.tenant), nil
	}
	return kv.AdminSpace(), nil
}

// decode turns a key or value as given into bytes.
func (f *kvFlags) decode(what, s string) ([]byte, error) {
	b := []byte(s)
	if f.hex {
		var err error
		if b, err = hex.DecodeString(s); err != nil {
			return nil, fmt.Errorf("%s %s is not hex: %w", what, quoteArg(s), err)
		}
	}
	if what == "key" && len(b) == 0 {
		return nil, errors.New("the empty key is not a key")
	}
	if what == "key" && !f.hex && strings.ContainsAny(s, "\t\n\r") {
		// scan prints KEY<TAB>VALUE lines and put --stdin reads them: such
		// a key could not be told from its neighbours there.
		return nil, fmt.Errorf("key %s holds a tab or a line break: give it with --hex", quoteArg(s))
	}
	return b, nil
}

// maxQuotedArg bounds how much of a key or value an error message quotes:
// a key refused for being too large would otherwise fill the screen.
const maxQuotedArg = 64

// quoteArg quotes s for an error message, cut to maxQuotedArg bytes.
func quoteArg(s string) string {
	if len(s) <= maxQuotedArg {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:maxQuotedArg], len(s))
}

func (f *kvFlags) encode(b []byte) string {
	if f.hex {
		return hex.EncodeToString(b)
	}
	return string(b)
}

func newKVCmdWith(a *app, open kvOpener) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Use the transactional ordered key-value store (the distributed B-tree)",
		Long: `Use the cluster's transactional ordered key-value store: the distributed
B-tree over the extent store, reached directly from this process.

Each tenant has its own key space, the only one its credential reaches
(the extent servers refuse it every other page); an administrator's
credential opens the administrators' own space, or tenant T's with
--tenant T. The file systems' metadata is in a tree of its own that no
kv command opens.

Keys are at most 1 KiB, values at most 4 KiB; a transaction touches at most
15 keys. Keys and values are taken and printed as given, or hex-encoded with
--hex (use it for binary data, and for keys or values holding a tab or a
newline, which the line formats below cannot carry: such a key is refused
without it). The empty key is refused.`,
	}
	// run opens the tree, runs fn, and closes it.
	run := func(cmd *cobra.Command, f *kvFlags, fn func(ctx context.Context, tr *btree.Tree) error) error {
		target, err := f.cluster.resolve(a.getenv)
		if err != nil {
			return err
		}
		// The bound on waiting for the cluster (policy.go).
		ctx, cancel := withStallTimeout(cmd.Context(), f.cluster.timeout)
		defer cancel()
		sp, err := f.space(target)
		if err != nil {
			return err
		}
		tr, closeTree, err := open(ctx, target, sp, a.logger)
		if err != nil {
			return fmt.Errorf("open the key-value store: %w", err)
		}
		defer closeTree()
		return fn(ctx, tr)
	}

	var getF kvFlags
	get := &cobra.Command{
		Use:   "get KEY",
		Short: "Print KEY's value alone (an error if KEY is absent)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := getF.decode("key", args[0])
			if err != nil {
				return err
			}
			return run(cmd, &getF, func(ctx context.Context, tr *btree.Tree) error {
				v, ok, err := tr.Get(ctx, k)
				if err != nil {
					return fmt.Errorf("get %s: %w", quoteArg(args[0]), err)
				}
				if !ok {
					return fmt.Errorf("get %s: %w", quoteArg(args[0]), btree.ErrNotFound)
				}
				_, err = fmt.Fprintln(a.stdout, getF.encode(v))
				return err
			})
		},
	}
	getF.register(get)

	var putF kvFlags
	var stdin bool
	var parallel int
	var progressFlag string
	put := &cobra.Command{
		Use:   "put KEY VALUE | put --stdin",
		Short: "Set KEY to VALUE, or load KEY<TAB>VALUE lines from standard input",
		Long: `Set KEY to VALUE. With --stdin, read KEY<TAB>VALUE lines (a bulk load):
the whole input is checked first, and nothing is written if any line is
bad; then the pairs are written in transactions of 15 consecutive lines,
--parallel of them at a time. A key given twice ends with its last value.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if stdin {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !stdin {
				k, err := putF.decode("key", args[0])
				if err != nil {
					return err
				}
				v, err := putF.decode("value", args[1])
				if err != nil {
					return err
				}
				return run(cmd, &putF, func(ctx context.Context, tr *btree.Tree) error {
					if err := tr.Put(ctx, k, v); err != nil {
						return fmt.Errorf("put %s: %w", quoteArg(args[0]), err)
					}
					return nil
				})
			}
			if parallel < 1 || parallel > maxBulkParallel {
				return fmt.Errorf("--parallel %d outside [1, %d]", parallel, maxBulkParallel)
			}
			mode, err := parseProgressMode(progressFlag)
			if err != nil {
				return err
			}
			pairs, err := readPairs(cmd.InOrStdin(), &putF)
			if err != nil {
				return err
			}
			return run(cmd, &putF, func(ctx context.Context, tr *btree.Tree) error {
				if err := checkPairs(tr, pairs); err != nil {
					return err
				}
				start := time.Now()
				bar := newProgress(a.stderr, mode, "put", int64(len(pairs)), false)
				err := bulkLoad(ctx, tr, pairs, parallel, bar)
				bar.Finish()
				if err != nil {
					return err
				}
				d := time.Since(start)
				fmt.Fprintf(a.stderr, "loaded %d pairs in %v (%.0f/s)\n", len(pairs), d.Round(time.Millisecond), float64(len(pairs))/max(d.Seconds(), 1e-9))
				return nil
			})
		},
	}
	putF.register(put)
	put.Flags().BoolVar(&stdin, "stdin", false, "read KEY<TAB>VALUE lines from standard input")
	put.Flags().IntVar(&parallel, "parallel", 4, "transactions in flight at once with --stdin")
	put.Flags().StringVar(&progressFlag, "progress", "auto", progressUsage+" (with --stdin)")

	var delF kvFlags
	del := &cobra.Command{
		Use:   "del KEY...",
		Short: "Delete keys (at most 15, in one transaction); deleting an absent key is no error",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("del needs at least one key")
			}
			if len(args) > btree.MaxTxnValues {
				return fmt.Errorf("%w: del of %d keys, a transaction touches at most %d: nothing deleted", btree.ErrTooManyValues, len(args), btree.MaxTxnValues)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var keys [][]byte
			for _, s := range args {
				k, err := delF.decode("key", s)
				if err != nil {
					return err
				}
				keys = append(keys, k)
			}
			return run(cmd, &delF, func(ctx context.Context, tr *btree.Tree) error {
				err := tr.Update(ctx, func(tx *btree.Txn) error {
					for _, k := range keys {
						if err := tx.Delete(k); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("del: %w", err)
				}
				return nil
			})
		},
	}
	delF.register(del)

	var scanF kvFlags
	var limit int
	scan := &cobra.Command{
		Use:   "scan FROM TO",
		Short: "Print KEY<TAB>VALUE lines for the keys in [FROM, TO) (TO \"\": to the end)",
		Long: `Print KEY<TAB>VALUE lines for the keys in [FROM, TO), in key order; an
empty TO means the end of the key space. The scan reads one leaf at a time:
a key nobody changes during the scan is printed once with its value, but
the scan as a whole is not one atomic snapshot.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := scanF.decode("FROM", args[0])
			if err != nil {
				return err
			}
			var to []byte
			if args[1] != "" {
				if to, err = scanF.decode("TO", args[1]); err != nil {
					return err
				}
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d is negative", limit)
			}
			return run(cmd, &scanF, func(ctx context.Context, tr *btree.Tree) error {
				w := bufio.NewWriter(a.stdout)
				n := 0
				errLimit := errors.New("limit reached")
				err := tr.Scan(ctx, from, to, func(k, v []byte) error {
					if limit > 0 && n == limit {
						return errLimit
					}
					stepDone(ctx)
					n++
					_, err := fmt.Fprintf(w, "%s\t%s\n", scanF.encode(k), scanF.encode(v))
					return err
				})
				if err != nil && !errors.Is(err, errLimit) {
					w.Flush()
					return fmt.Errorf("scan: %w", err)
				}
				return w.Flush()
			})
		},
	}
	scanF.register(scan)
	scan.Flags().IntVar(&limit, "limit", 0, "print at most this many pairs (0: all)")

	var txnF kvFlags
	txn := &cobra.Command{
		Use:   "txn",
		Short: "Run the operations on standard input as one transaction",
		Long: `Read operations from standard input, one a line, fields separated by a tab:

  get<TAB>KEY
  put<TAB>KEY<TAB>VALUE
  del<TAB>KEY

and run them as one atomic transaction (at most 15 distinct keys). Gets see
the transaction's earlier puts and deletes. For each get, in order, print
KEY<TAB>VALUE, or KEY alone (no tab) if the key is absent. Malformed input
is refused before anything runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ops, err := readTxn(cmd.InOrStdin(), &txnF)
			if err != nil {
				return err
			}
			return run(cmd, &txnF, func(ctx context.Context, tr *btree.Tree) error {
				var out []string
				err := tr.Update(ctx, func(tx *btree.Txn) error {
					out = out[:0]
					for _, op := range ops {
						switch op.kind {
						case "get":
							v, ok, err := tx.Get(op.key)
							if err != nil {
								return err
							}
							if ok {
								out = append(out, txnF.encode(op.key)+"\t"+txnF.encode(v))
							} else {
								out = append(out, txnF.encode(op.key))
							}
						case "put":
							if err := tx.Put(op.key, op.value); err != nil {
								return err
							}
						case "del":
							if err := tx.Delete(op.key); err != nil {
								return err
							}
						}
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("txn: %w", err)
				}
				for _, line := range out {
					if _, err := fmt.Fprintln(a.stdout, line); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	txnF.register(txn)

	var checkF kvFlags
	var checkJSON bool
	check := &cobra.Command{
		Use:   "check",
		Short: "Verify the tree's structure and print its shape",
		Long: `Read the whole tree and verify that every page is sound, that the leaves'
fence keys tile the key space with no gap or overlap (and so every level's),
that heights agree, that every key sits in the page that owns it, that the
right links chain each level in key order and that block headers record
exactly the tree's pages. Print the tree's height, pages per level, keys,
fill and blocks; exit non-zero, listing the problems, if any is found.
Run it while nobody writes: its reads are not one snapshot.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, &checkF, func(ctx context.Context, tr *btree.Tree) error {
				// Checking walks the whole tree without telling how far it
				// got: a long job (policy.go).
				var rep *btree.CheckReport
				err := longJob(ctx, func() (err error) {
					rep, err = tr.Check(ctx)
					return err
				})
				if err != nil {
					return fmt.Errorf("check: %w", err)
				}
				if checkJSON {
					if err := writeJSON(a.stdout, checkView(rep)); err != nil {
						return err
					}
				} else if err := writeCheck(a.stdout, rep); err != nil {
					return err
				}
				if !rep.OK() {
					return fmt.Errorf("check found %d problems", len(rep.Problems))
				}
				return nil
			})
		},
	}
	checkF.register(check)
	check.Flags().BoolVar(&checkJSON, "json", false, "print JSON")

	cmd.AddCommand(get, put, del, scan, txn, check)
	return cmd
}

// readPairs reads KEY<TAB>VALUE lines, refusing the input at its first bad
// line. Empty lines are skipped.
func readPairs(r io.Reader, f *kvFlags) ([]btree.KV, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxBulkInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if len(data) > maxBulkInputBytes {
		return nil, fmt.Errorf("standard input exceeds %d bytes: split the load", maxBulkInputBytes)
	}
	var pairs []btree.KV
	for n, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			continue
		}
		ks, vs, ok := strings.Cut(string(line), "\t")
		if !ok {
			return nil, fmt.Errorf("line %d: no tab between key and value: nothing written", n+1)
		}
		k, err := f.decode("key", ks)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: nothing written", n+1, err)
		}
		v, err := f.decode("value", vs)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w: nothing written", n+1, err)
		}
		pairs = append(pairs, btree.KV{Key: k, Value: v})
	}
	return pairs, nil
}

// checkPairs refuses keys and values beyond the tree's bounds, before
// anything is written.
func checkPairs(tr *btree.Tree, pairs []btree.KV) error {
	for i, p := range pairs {
		if len(p.Key) > tr.MaxKeyBytes() {
			return fmt.Errorf("pair %d: %w: %d bytes, the bound is %d: nothing written", i+1, btree.ErrKeyTooLarge, len(p.Key), tr.MaxKeyBytes())
		}
		if len(p.Value) > tr.MaxValueBytes() {
			return fmt.Errorf("pair %d: %w: %d bytes, the bound is %d: nothing written", i+1, btree.ErrValueTooLarge, len(p.Value), tr.MaxValueBytes())
		}
	}
	return nil
}

// bulkLoad writes pairs in transactions of MaxTxnValues consecutive pairs,
// parallel at a time. A batch waits until no earlier batch still in flight
// holds one of its keys, so a key given twice ends with its last value.
//
// Each batch written is an answer from the cluster (stepDone) and moves
// bar by its pairs.
func bulkLoad(ctx context.Context, tr *btree.Tree, pairs []btree.KV, parallel int, bar *progress) error {
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	inFlight := map[string]int{}
	var firstErr error
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for lo := 0; lo < len(pairs); lo += btree.MaxTxnValues {
		batch := pairs[lo:min(lo+btree.MaxTxnValues, len(pairs))]
		// A key twice in one batch: keep its last value (one transaction
		// may touch each key only once as far as values are counted).
		last := map[string]int{}
		for i, p := range batch {
			last[string(p.Key)] = i
		}
		mu.Lock()
		for firstErr == nil && anyInFlight(inFlight, last) {
			cond.Wait()
		}
		if firstErr != nil {
			mu.Unlock()
			break
		}
		for k := range last {
			inFlight[k]++
		}
		mu.Unlock()
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := tr.Update(ctx, func(tx *btree.Txn) error {
				for i, p := range batch {
					if last[string(p.Key)] != i {
						continue
					}
					if err := tx.Put(p.Key, p.Value); err != nil {
						return err
					}
				}
				return nil
			})
			mu.Lock()
			for k := range last {
				if inFlight[k]--; inFlight[k] == 0 {
					delete(inFlight, k)
				}
			}
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("pairs %d to %d: %w", lo+1, lo+len(batch), err)
			}
			if err == nil {
				stepDone(ctx)
				bar.Add(int64(len(batch)))
			}
			cond.Broadcast()
			mu.Unlock()
			<-sem
		}()
	}
	wg.Wait()
	return firstErr
}

func anyInFlight(inFlight map[string]int, keys map[string]int) bool {
	for k := range keys {
		if inFlight[k] > 0 {
			return true
		}
	}
	return false
}

type txnOp struct {
	kind       string
	key, value []byte
}

// readTxn reads and validates a transaction's operations.
func readTxn(r io.Reader, f *kvFlags) ([]txnOp, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxTxnInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	if len(data) > maxTxnInputBytes {
		return nil, fmt.Errorf("transaction input exceeds %d bytes", maxTxnInputBytes)
	}
	var ops []txnOp
	keys := map[string]bool{}
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		fields := strings.Split(line, "\t")
		var op txnOp
		op.kind = fields[0]
		want := map[string]int{"get": 2, "del": 2, "put": 3}[op.kind]
		if want == 0 {
			return nil, fmt.Errorf("line %d: unknown operation %s (get, put or del): nothing done", n+1, quoteArg(op.kind))
		}
		if len(fields) != want {
			return nil, fmt.Errorf("line %d: %s takes %d tab-separated fields, got %d: nothing done", n+1, op.kind, want-1, len(fields)-1)
		}
		if op.key, err = f.decode("key", fields[1]); err != nil {
			return nil, fmt.Errorf("line %d: %w: nothing done", n+1, err)
		}
		if op.kind == "put" {
			if op.value, err = f.decode("value", fields[2]); err != nil {
				return nil, fmt.Errorf("line %d: %w: nothing done", n+1, err)
			}
		}
		keys[string(op.key)] = true
		if len(keys) > btree.MaxTxnValues {
			return nil, fmt.Errorf("line %d: %w: more than %d distinct keys: nothing done", n+1, btree.ErrTooManyValues, btree.MaxTxnValues)
		}
		ops = append(ops, op)
	}
	if len(ops) == 0 {
		return nil, errors.New("no operations on standard input")
	}
	return ops, nil
}

// CheckView is what `arbor kv check --json` prints.
type CheckView struct {
	OK            bool           `json:"ok"`
	Height        int            `json:"height"`
	Pages         []int          `json:"pages_per_level"`
	Keys          int64          `json:"keys"`
	LeafFill      float64        `json:"leaf_fill"`
	InnerFill     float64        `json:"inner_fill"`
	Blocks        int            `json:"blocks"`
	SplitRuns     int            `json:"blocks_split_runs"`
	ExtentPages   map[string]int `json:"extent_pages"`
	Problems      []string       `json:"problems"`
	ProblemsShown int            `json:"problems_shown"`
}

func checkView(r *btree.CheckReport) CheckView {
	v := CheckView{
		OK: r.OK(), Height: r.Height, Pages: r.Pages, Keys: r.Keys, LeafFill: r.LeafFill(), InnerFill: r.InnerFill(),
		Blocks: r.Blocks, SplitRuns: r.SplitRuns, ExtentPages: map[string]int{}, Problems: r.Problems, ProblemsShown: len(r.Problems),
	}
	for e, n := range r.Extents {
		v.ExtentPages[fmt.Sprint(e)] = n
	}
	if v.Problems == nil {
		v.Problems = []string{}
	}
	return v
}

func writeCheck(w io.Writer, r *btree.CheckReport) error {
	var levels []string
	for h := len(r.Pages) - 1; h >= 0; h-- {
		levels = append(levels, fmt.Sprint(r.Pages[h]))
	}
	var exts []string
	ids := make([]uint64, 0, len(r.Extents))
	for e := range r.Extents {
		ids = append(ids, e)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, e := range ids {
		exts = append(exts, fmt.Sprintf("%d:%d", e, r.Extents[e]))
	}
	b := &strings.Builder{}
	fmt.Fprintf(b, "height       %d (%d levels)\n", r.Height, r.Height+1)
	fmt.Fprintf(b, "pages        %s (root level first)\n", strings.Join(levels, " / "))
	fmt.Fprintf(b, "keys         %d\n", r.Keys)
	fmt.Fprintf(b, "leaf fill    %.1f%%\n", 100*r.LeafFill())
	fmt.Fprintf(b, "inner fill   %.1f%%\n", 100*r.InnerFill())
	fmt.Fprintf(b, "blocks       %d (%d holding more than one run of a level)\n", r.Blocks, r.SplitRuns)
	fmt.Fprintf(b, "extents      %s (extent:pages)\n", strings.Join(exts, " "))
	if r.OK() {
		b.WriteString("ok\n")
	} else {
		fmt.Fprintf(b, "PROBLEMS (%d shown):\n", len(r.Problems))
		for _, p := range r.Problems {
			fmt.Fprintf(b, "  %s\n", p)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
