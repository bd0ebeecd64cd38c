package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/kv"
)

// memKV is an in-memory key-value store for the kv commands: the B-tree
// over its in-memory page store, the same one for every command run.
type memKV struct {
	store *btree.MemStore
	root  btree.PageRef
	opens int
}

func newMemKV(t *testing.T) *memKV {
	s := btree.NewMemStore(1)
	if err := s.AddExtent(1000, btree.Geometry{PageBytes: 8192, PagesPerBlock: 32, Blocks: 256}); err != nil {
		t.Fatal(err)
	}
	root, err := btree.Create(context.Background(), s, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &memKV{store: s, root: root}
}

func (m *memKV) open(ctx context.Context, _ clusterTarget, _ kv.Space, _ *slog.Logger) (*btree.Tree, func() error, error) {
	m.opens++
	tr, err := btree.Open(ctx, btree.Config{Store: m.store, Root: m.root})
	if err != nil {
		return nil, nil, err
	}
	return tr, func() error { tr.Close(); return nil }, nil
}

// kvRun runs one kv command against m with stdin.
func (m *memKV) run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	ta := newTestApp()
	cmd := newKVCmdWith(&ta.app, m.open)
	cmd.SetArgs(append(args, "--cluster", "127.0.0.1:1", "--insecure"))
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&ta.out)
	cmd.SetErr(&ta.errOut)
	err := cmd.ExecuteContext(context.Background())
	return ta.out.String(), err
}

func TestKVCommands(t *testing.T) {
	m := newMemKV(t)
	mustRun := func(stdin string, args ...string) string {
		t.Helper()
		out, err := m.run(t, stdin, args...)
		if err != nil {
			t.Fatalf("kv %v: %v", args, err)
		}
		return out
	}
	mustRun("", "put", "apple", "red")
	if got := mustRun("", "get", "apple"); got != "red\n" {
		t.Fatalf("get = %q", got)
	}
	var in strings.Builder
	for i := range 100 {
		fmt.Fprintf(&in, "k%03d\tv%d\n", i, i)
	}
	in.WriteString("k005\tlast\n") // a key twice: the last value wins
	mustRun(in.String(), "put", "--stdin", "--parallel", "8")
	if got := mustRun("", "get", "k005"); got != "last\n" {
		t.Fatalf("get k005 = %q", got)
	}
	if got := mustRun("", "scan", "k010", "k013"); got != "k010\tv10\nk011\tv11\nk012\tv12\n" {
		t.Fatalf("scan = %q", got)
	}
	if got := mustRun("", "scan", "k098", ""); got != "k098\tv98\nk099\tv99\n" {
		t.Fatalf("scan to the end = %q", got)
	}
	if got := mustRun("", "scan", "", "", "--limit", "2"); got != "apple\tred\nk000\tv0\n" {
		t.Fatalf("scan --limit = %q", got)
	}
	mustRun("", "del", "k000", "k001", "nothere")
	if _, err := m.run(t, "", "get", "k000"); !errors.Is(err, btree.ErrNotFound) {
		t.Fatalf("get of a deleted key: %v", err)
	}
	got := mustRun("get\tapple\nput\tapple\tgreen\nget\tapple\ndel\tk002\nget\tk002\nput\tpear\tyellow\n", "txn")
	if got != "apple\tred\napple\tgreen\nk002\n" {
		t.Fatalf("txn printed %q", got)
	}
	if got := mustRun("", "get", "pear"); got != "yellow\n" {
		t.Fatalf("get pear = %q", got)
	}
	// Binary keys and values with --hex.
	mustRun("", "put", "--hex", "00ff", "0a09")
	if got := mustRun("", "get", "--hex", "00ff"); got != "0a09\n" {
		t.Fatalf("get --hex = %q", got)
	}
	// A key holding a tab goes with --hex (as given it is refused).
	mustRun("", "put", "--hex", "610962", "01")
	if got := mustRun("", "get", "--hex", "610962"); got != "01\n" {
		t.Fatalf("get --hex of a key with a tab = %q", got)
	}
	mustRun("", "del", "--hex", "610962")
	check := mustRun("", "check")
	if !strings.Contains(check, "keys         100\n") || !strings.HasSuffix(check, "ok\n") {
		t.Fatalf("check printed:\n%s", check)
	}
}

// TestKVBadInputChangesNothing: malformed or oversize input gets a clear
// error and writes nothing.
func TestKVBadInputChangesNothing(t *testing.T) {
	m := newMemKV(t)
	if _, err := m.run(t, "", "put", "a", "1"); err != nil {
		t.Fatal(err)
	}
	before := m.store.Stats().Commits
	long := strings.Repeat("x", btree.DefaultMaxKeyBytes+1)
	var sixteen strings.Builder
	for i := range btree.MaxTxnValues + 1 {
		fmt.Fprintf(&sixteen, "put\tk%d\tv\n", i)
	}
	cases := []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"oversize key", "", []string{"put", long, "v"}, "key too large"},
		{"oversize value", "", []string{"put", "a", strings.Repeat("v", btree.DefaultMaxValueBytes+1)}, "value too large"},
		{"bulk line without a tab", "a\t1\nb 2\n", []string{"put", "--stdin"}, "line 2: no tab"},
		{"bulk oversize value", "a\t1\nb\t" + strings.Repeat("v", btree.DefaultMaxValueBytes+1) + "\n", []string{"put", "--stdin"}, "pair 2: btree: value too large"},
		{"bulk bad hex", "00\t01\nzz\t01\n", []string{"put", "--stdin", "--hex"}, "line 2: key \"zz\" is not hex"},
		{"txn unknown op", "put\ta\t2\nincr\ta\n", []string{"txn"}, "unknown operation \"incr\""},
		{"txn missing field", "put\ta\n", []string{"txn"}, "put takes 2 tab-separated fields, got 1"},
		{"txn 16 keys", sixteen.String(), []string{"txn"}, "more than 15 distinct keys"},
		{"txn empty", "\n", []string{"txn"}, "no operations"},
		{"del 16 keys", "", append([]string{"del"}, strings.Fields(strings.Repeat("k ", 16))...), "too many values in one transaction: del of 16 keys"},
		{"reversed scan", "", []string{"scan", "z", "a"}, "bad key range"},
		{"del no key", "", []string{"del"}, "at least one key"},
		{"oversize key quoted short", "", []string{"put", long, "v"}, "... (1025 bytes): btree: key too large"},
		{"txn oversize key", "put\t" + long + "\tv\n", []string{"txn"}, "key too large"},
		{"txn oversize value", "put\ta\t" + strings.Repeat("v", btree.DefaultMaxValueBytes+1) + "\n", []string{"txn"}, "value too large"},
		{"bulk key with a line break", "a\t1\nb\rc\t2\n", []string{"put", "--stdin"}, "line 2: key"},
		{"empty key", "", []string{"put", "", "v"}, "the empty key"},
		{"key with a tab", "", []string{"put", "a\tb", "v"}, "give it with --hex"},
		{"key with a newline", "", []string{"put", "a\nb", "v"}, "give it with --hex"},
		{"txn key with a line break", "put\ta\rb\tv\n", []string{"txn"}, "give it with --hex"},
	}
	for _, c := range cases {
		_, err := m.run(t, c.stdin, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if after := m.store.Stats().Commits; after != before {
		t.Errorf("bad input made %d commits", after-before)
	}
	if out, _ := m.run(t, "", "get", "a"); out != "1\n" {
		t.Errorf("a = %q after bad input", out)
	}
}

// TestKVOnDevCluster runs the kv commands against real arbor processes:
// the CLI creates the tree on first use (recording its root in the
// directory), later invocations find it; a node is killed and the data
// is still there.
func TestKVOnDevCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of real processes")
	}
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3})
	flags := []string{"--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", c.AdminCredentialFile()}
	kvRun := func(stdin string, args ...string) (string, error) {
		ta := newTestApp()
		root := newRootCmd(&ta.app)
		root.SetArgs(append(append([]string{"kv"}, args...), flags...))
		root.SetIn(strings.NewReader(stdin))
		err := root.ExecuteContext(context.Background())
		return ta.out.String(), err
	}
	// The extent manager creates the first extents once the storage nodes
	// have registered: wait for the store to be usable. Three first
	// clients race to create the tree (a create-only compare-and-set on
	// the directory's config decides); each must end up writing to the
	// one tree, so each sees the others' keys.
	firsts := [][2]string{{"hello", "world"}, {"first1", "one"}, {"first2", "two"}}
	done := make([]bool, len(firsts))
	deadline := time.Now().Add(60 * time.Second)
	for {
		var wg sync.WaitGroup
		errs := make([]error, len(firsts))
		for i, kv := range firsts {
			if done[i] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = kvRun("", "put", kv[0], kv[1])
			}()
		}
		wg.Wait()
		all, ok := true, 0
		for i, err := range errs {
			if !done[i] && err == nil {
				ok++
			}
			done[i] = done[i] || err == nil
			all = all && done[i]
		}
		if ok > 0 {
			t.Logf("%d of the first puts succeeded together (failures: %v)", ok, errors.Join(errs...))
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kv put never succeeded: %v", errors.Join(errs...))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, kv := range firsts {
		if out, err := kvRun("", "get", kv[0]); err != nil || out != kv[1]+"\n" {
			t.Fatalf("get %s after the racing first puts = %q, %v", kv[0], out, err)
		}
	}
	if _, err := kvRun("", "del", "first1", "first2"); err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	const n = 2000
	for i := range n {
		fmt.Fprintf(&in, "key%05d\tvalue-%d\n", i, i)
	}
	if _, err := kvRun(in.String(), "put", "--stdin"); err != nil {
		t.Fatal(err)
	}
	if out, err := kvRun("", "scan", "key00100", "key00103"); err != nil || out != "key00100\tvalue-100\nkey00101\tvalue-101\nkey00102\tvalue-102\n" {
		t.Fatalf("scan = %q, %v", out, err)
	}
	if out, err := kvRun("get\thello\nput\thello\tagain\ndel\tkey00000\n", "txn"); err != nil || out != "hello\tworld\n" {
		t.Fatalf("txn = %q, %v", out, err)
	}
	// Bad input is refused by the real store too, and changes nothing
	// (the scan below counts every key).
	var sixteen strings.Builder
	for i := range btree.MaxTxnValues + 1 {
		fmt.Fprintf(&sixteen, "put\tnew%02d\tv\n", i)
	}
	for _, bad := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"put", strings.Repeat("k", btree.DefaultMaxKeyBytes+1), "v"}, "key too large"},
		{"", []string{"put", "new", strings.Repeat("v", btree.DefaultMaxValueBytes+1)}, "value too large"},
		{sixteen.String(), []string{"txn"}, "more than 15 distinct keys"},
		{"put\tnew\tv\nput\t" + strings.Repeat("k", btree.DefaultMaxKeyBytes+1) + "\tv\n", []string{"txn"}, "key too large"},
	} {
		if _, err := kvRun(bad.stdin, bad.args...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("kv %s: %v, want an error containing %q", bad.args[0], err, bad.want)
		}
	}
	// Kill one node (of three replicas): everything is still readable.
	if err := c.Kill(3); err != nil {
		t.Fatal(err)
	}
	var out string
	var err error
	for try := 0; try < 60; try++ {
		if out, err = kvRun("", "get", "hello"); err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || out != "again\n" {
		t.Fatalf("get after a kill = %q, %v", out, err)
	}
	out, err = kvRun("", "scan", "", "")
	if err != nil || strings.Count(out, "\n") != n {
		t.Fatalf("scan after a kill: %d lines, %v", strings.Count(out, "\n"), err)
	}
	check, err := kvRun("", "check")
	if err != nil {
		t.Fatalf("check: %v\n%s", err, check)
	}
	t.Logf("kv check on the dev cluster:\n%s", check)
	if os.Getenv("ARBOR_TEST_DEBUG") != "" {
		t.Log(out)
	}
}

// FuzzReadTxn: the `kv txn` input decoder never panics, and what it accepts
// is a well-formed transaction (known operations, at most 15 distinct
// keys) that, written out again, decodes to the same operations.
func FuzzReadTxn(f *testing.F) {
	f.Add("get\ta\nput\ta\tb\ndel\tc\n", false)
	f.Add("put\t00ff\t0a09\r\nget\t00ff\n", true)
	f.Add("put\ta\n", false)
	f.Add("incr\ta\n", false)
	f.Add("\n\n", false)
	f.Add("put\tzz\t01\n", true)
	f.Fuzz(func(t *testing.T, in string, hexMode bool) {
		fl := &kvFlags{hex: hexMode}
		ops, err := readTxn(strings.NewReader(in), fl)
		if err != nil {
			if len(ops) != 0 {
				t.Fatalf("error %v with %d operations", err, len(ops))
			}
			return
		}
		if len(ops) == 0 {
			t.Fatal("no error and no operations")
		}
		keys := map[string]bool{}
		var out strings.Builder
		for _, op := range ops {
			keys[string(op.key)] = true
			switch op.kind {
			case "get", "del":
				if op.value != nil {
					t.Fatalf("%s with a value", op.kind)
				}
				fmt.Fprintf(&out, "%s\t%s\n", op.kind, fl.encode(op.key))
			case "put":
				fmt.Fprintf(&out, "put\t%s\t%s\n", fl.encode(op.key), fl.encode(op.value))
			default:
				t.Fatalf("accepted operation %q", op.kind)
			}
		}
		if len(keys) > btree.MaxTxnValues {
			t.Fatalf("accepted %d distinct keys", len(keys))
		}
		again, err := readTxn(strings.NewReader(out.String()), fl)
		if err != nil {
			t.Fatalf("re-encoded input %q refused: %v", out.String(), err)
		}
		if len(again) != len(ops) {
			t.Fatalf("re-encoded input gives %d operations, want %d", len(again), len(ops))
		}
		for i := range ops {
			if again[i].kind != ops[i].kind || !bytes.Equal(again[i].key, ops[i].key) || !bytes.Equal(again[i].value, ops[i].value) {
				t.Fatalf("operation %d: %+v, then %+v", i, ops[i], again[i])
			}
		}
	})
}

// FuzzReadPairs: the `kv put --stdin` decoder never panics, and what it
// accepts, written out again, decodes to the same pairs.
func FuzzReadPairs(f *testing.F) {
	f.Add("a\t1\nb\t2\n", false)
	f.Add("00\t01\r\n\nff\t\n", true)
	f.Add("a 1\n", false)
	f.Add("a\t1\tx\n", false)
	f.Fuzz(func(t *testing.T, in string, hexMode bool) {
		fl := &kvFlags{hex: hexMode}
		pairs, err := readPairs(strings.NewReader(in), fl)
		if err != nil {
			return
		}
		var out strings.Builder
		for _, p := range pairs {
			fmt.Fprintf(&out, "%s\t%s\n", fl.encode(p.Key), fl.encode(p.Value))
		}
		again, err := readPairs(strings.NewReader(out.String()), fl)
		if err != nil {
			t.Fatalf("re-encoded input %q refused: %v", out.String(), err)
		}
		if len(again) != len(pairs) {
			t.Fatalf("re-encoded input gives %d pairs, want %d", len(again), len(pairs))
		}
		for i := range pairs {
			if !bytes.Equal(again[i].Key, pairs[i].Key) || !bytes.Equal(again[i].Value, pairs[i].Value) {
				t.Fatalf("pair %d: %q=%q, then %q=%q", i, pairs[i].Key, pairs[i].Value, again[i].Key, again[i].Value)
			}
		}
	})
}

// TestKVPutStdinProgress: kv put --stdin draws its bar with --progress
// always (into a buffer, not a terminal) and none by default there.
func TestKVPutStdinProgress(t *testing.T) {
	m := newMemKV(t)
	var in strings.Builder
	for i := range 40 {
		fmt.Fprintf(&in, "p%03d\tv\n", i)
	}
	for _, tc := range []struct {
		flag string
		bar  bool
	}{{"always", true}, {"auto", false}, {"never", false}} {
		ta := newTestApp()
		cmd := newKVCmdWith(&ta.app, m.open)
		cmd.SetArgs([]string{"put", "--stdin", "--progress", tc.flag, "--cluster", "127.0.0.1:1", "--insecure"})
		cmd.SetIn(strings.NewReader(in.String()))
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		stderr := ta.errOut.String()
		if got := strings.Contains(stderr, "] 100%  40 / 40"); got != tc.bar {
			t.Fatalf("--progress %s: bar drawn %v:\n%q", tc.flag, got, stderr)
		}
		if !strings.Contains(stderr, "loaded 40 pairs") {
			t.Fatalf("--progress %s: %q", tc.flag, stderr)
		}
	}
	ta := newTestApp()
	cmd := newKVCmdWith(&ta.app, m.open)
	cmd.SetArgs([]string{"put", "--stdin", "--progress", "sometimes", "--cluster", "127.0.0.1:1", "--insecure"})
	cmd.SetIn(strings.NewReader("k\tv\n"))
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "want auto, always or never") {
		t.Fatalf("--progress sometimes: %v", err)
	}
}
