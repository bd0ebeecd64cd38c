package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/directory"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
)

// tractClients are a command's connections to the directory and the tract
// store.
type tractClients struct {
	dir    *directory.Client
	tract  *tract.Client
	cancel context.CancelFunc
}

func (c *tractClients) Close() {
	c.tract.Close()
	c.dir.Close()
	c.cancel()
}

// dialTract connects to the cluster's directory and tract store. The
// context it returns bounds the command's waits on the cluster
// (--timeout, policy.go); it ends with Close.
func (a *app) dialTract(ctx context.Context, cf *clusterFlags) (context.Context, *tractClients, error) {
	target, ctx, cancel, err := cf.connect(ctx, a.getenv)
	if err != nil {
		return nil, nil, err
	}
	dir, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("connect to the directory: %w", err)
	}
	tc, err := tract.NewClient(tract.ClientConfig{Directory: dir, DialOptions: target.DialOptions(), Logger: a.logger})
	if err != nil {
		dir.Close()
		cancel()
		return nil, nil, err
	}
	return ctx, &tractClients{dir: dir, tract: tc, cancel: cancel}, nil
}

func newBlobCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "blob",
		Short: "Store and fetch blobs in the tract store",
		Long: `Blobs are byte sequences named by 128-bit ids, stored in fixed-size tracts
spread over every disk of the cluster and replicated (FDS).

  arbor blob put FILE       store a file; prints the new blob's id
  arbor blob get ID OUT     fetch a blob into a file
  arbor blob stat ID        show a blob's size and replication
  arbor blob rm ID          delete a blob
  arbor blob verify         check every replica of every tract`,
	}
	cmd.AddCommand(newBlobPutCmd(a), newBlobGetCmd(a), newBlobStatCmd(a), newBlobRmCmd(a), newBlobVerifyCmd(a))
	return cmd
}

// transferFlags are the flags of put and get.
type transferFlags struct {
	cf       clusterFlags
	progress string
}

func (f *transferFlags) register(cmd *cobra.Command) {
	f.cf.register(cmd)
	cmd.Flags().StringVar(&f.progress, "progress", "auto", progressUsage)
}

func (f *transferFlags) mode() (progressMode, error) { return parseProgressMode(f.progress) }

func newBlobPutCmd(a *app) *cobra.Command {
	var f transferFlags
	var replication int
	var id, layout, tenant string
	cmd := &cobra.Command{
		Use:   "put FILE",
		Short: "Store a file as a new blob and print its id",
		Long: `Store a file as a new blob and print its id. The blob belongs to the
tenant of the credential (issue 15): only that tenant's credentials (and
administrators) can get, stat or delete it. An administrator gives a blob
to tenant T with --tenant T (without it: a blob of the cluster's own,
which no tenant reaches).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := f.mode()
			if err != nil {
				return err
			}
			if tenant != "" {
				if err := security.CheckName(tenant); err != nil {
					return fmt.Errorf("--tenant: %w", err)
				}
			}
			l := tract.Layout{Replicas: replication}
			if layout != "" {
				if replication != 0 {
					return fmt.Errorf("--layout and --replication: give one (--layout replicas:%d)", replication)
				}
				if l, err = tract.ParseLayout(layout); err != nil {
					return err
				}
			}
			g := tract.NewGUID()
			if id != "" {
				if g, err = tract.ParseGUID(id); err != nil {
					return err
				}
			}
			file, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer file.Close()
			info, err := file.Stat()
			if err != nil {
				return err
			}
			if !info.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file", args[0])
			}
			ctx, c, err := a.dialTract(cmd.Context(), &f.cf)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := putFile(ctx, c.tract, g, l, tenant, file, info.Size(), newProgress(a.stderr, mode, "put", info.Size(), true)); err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, g)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&replication, "replication", 0, "replicas of each tract (default: 3, or the TLT's row width if smaller)")
	cmd.Flags().StringVar(&layout, "layout", "", "the blob's layout: replicas:K, or ec:D+P for Reed-Solomon stripes (ec: 5+2); needs TLT rows of D+P servers in distinct failure domains")
	cmd.Flags().StringVar(&id, "id", "", "the blob's id, 32 hexadecimal digits (default: random)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant the blob belongs to (default: the credential's tenant; an administrator's: none)")
	return cmd
}

// putFile creates blob g for tenant ("": the caller's) and writes size
// bytes of r into it, tract by tract, keeping the client's simultaneous
// limit of writes in flight.
func putFile(ctx context.Context, c *tract.Client, g tract.GUID, layout tract.Layout, tenant string, r io.ReaderAt, size int64, bar *progress) error {
	ts, err := c.TractSize(ctx)
	if err != nil {
		return err
	}
	b, err := c.CreateTenantBlob(ctx, g, layout, 0, tenant)
	if err != nil {
		return fmt.Errorf("create blob %s: %w", g, err)
	}
	defer b.Close()
	n := uint64((size + int64(ts) - 1) / int64(ts))
	if n > 0 {
		got, err := b.Extend(ctx, n)
		if err != nil {
			return fmt.Errorf("extend blob %s: %w", g, err)
		}
		if got != n {
			return fmt.Errorf("blob %s has %d tracts after extending a new blob by %d: another writer is using it", g, got, n)
		}
	}
	err = forEachTract(ctx, n, c.SimultaneousLimit(), func(ctx context.Context, i uint64) error {
		off := int64(i) * int64(ts)
		buf := make([]byte, min(int64(ts), size-off))
		if _, err := r.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if err := b.WriteTract(ctx, i, buf); err != nil {
			return fmt.Errorf("write tract %d: %w", i, err)
		}
		stepDone(ctx)
		bar.Add(int64(len(buf)))
		return nil
	})
	bar.Finish()
	return err
}

// transferWindowStart is how many tracts a transfer has in flight before
// its first one completes. The tracts in flight share the link and the
// servers fairly, so the first answer comes only once about all of them
// have moved: with the client's whole simultaneous limit at once (256 MiB
// of 1 MiB tracts) that is after 256 MiB, which a loaded cluster or a slow
// link takes longer than --timeout to move, and a put that never stopped
// moving data failed for want of an answer. Starting with a few bounds the
// first wait by a few tracts, and each completion admitting two more
// (TCP's slow start) reaches the full limit within log2(limit) rounds.
const transferWindowStart = 4

// forEachTract runs f for tracts 0..n-1 with at most limit at once and
// returns the first error (the others are cancelled). It starts with
// transferWindowStart at once and lets one more run after each success,
// so that answers come from the start (see transferWindowStart).
func forEachTract(ctx context.Context, n uint64, limit int, f func(ctx context.Context, i uint64) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	limit = max(limit, 1)
	next := make(chan uint64)
	var (
		once    sync.Once
		first   error
		wg      sync.WaitGroup
		mu      sync.Mutex
		workers int
		worker  func()
	)
	spawn := func() { // with mu held
		workers++
		wg.Add(1)
		go worker()
	}
	worker = func() {
		defer wg.Done()
		for i := range next {
			if err := f(ctx, i); err != nil {
				once.Do(func() { first = err; cancel() })
				continue
			}
			mu.Lock()
			if workers < limit {
				spawn()
			}
			mu.Unlock()
		}
	}
	mu.Lock()
	for range min(limit, transferWindowStart) {
		spawn()
	}
	mu.Unlock()
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

func newBlobGetCmd(a *app) *cobra.Command {
	var f transferFlags
	cmd := &cobra.Command{
		Use:   "get ID OUT",
		Short: "Fetch a blob into the file OUT (- for standard output)",
		Long: `Fetch a blob into the file OUT, or to standard output if OUT is -.
The file appears only once the whole blob is in it (it is written to a
temporary file beside it, then renamed): a failed get leaves nothing behind.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := f.mode()
			if err != nil {
				return err
			}
			g, err := tract.ParseGUID(args[0])
			if err != nil {
				return err
			}
			ctx, c, err := a.dialTract(cmd.Context(), &f.cf)
			if err != nil {
				return err
			}
			defer c.Close()
			if args[1] == "-" {
				return streamBlob(ctx, c.tract, g, a.stdout, mode, a.stderr)
			}
			return getInto(args[1], func(out *os.File) error {
				return getFile(ctx, c.tract, g, out, mode, a.stderr)
			})
		},
	}
	f.register(cmd)
	return cmd
}

// getInto runs get on a temporary file beside path and renames it to path
// once get succeeded; else it removes it.
func getInto(path string, get func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".arbor-get-*")
	if err != nil {
		return err
	}
	err = tmp.Chmod(0o644) // as a file created by a shell redirect (umask 022)
	if err == nil {
		err = get(tmp)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// openForGet opens blob g for reading and runs fetch with it, its tract
// size, its number of tracts and a progress bar over them.
func openForGet(ctx context.Context, c *tract.Client, g tract.GUID, mode progressMode, stderr io.Writer,
	fetch func(b *tract.Blob, ts int, n uint64, bar *progress) error) error {
	ts, err := c.TractSize(ctx)
	if err != nil {
		return err
	}
	b, err := c.OpenBlob(ctx, g)
	if err != nil {
		return fmt.Errorf("open blob %s: %w", g, err)
	}
	defer b.Close()
	n := b.Info().Tracts // OpenBlob just read the length
	bar := newProgress(stderr, mode, "get", int64(n)*int64(ts), true)
	defer bar.Finish()
	return fetch(b, ts, n, bar)
}

// streamBlob writes blob g to w, tract after tract.
func streamBlob(ctx context.Context, c *tract.Client, g tract.GUID, w io.Writer, mode progressMode, stderr io.Writer) error {
	return openForGet(ctx, c, g, mode, stderr, func(b *tract.Blob, ts int, n uint64, bar *progress) error {
		for i := range n {
			data, err := b.ReadTract(ctx, i)
			if err != nil {
				return fmt.Errorf("read tract %d: %w", i, err)
			}
			stepDone(ctx)
			if _, err := w.Write(data); err != nil {
				return err
			}
			if i < n-1 && len(data) < ts {
				// A short tract before the last: zeros up to the next, as
				// getFile leaves a hole there.
				if _, err := w.Write(make([]byte, ts-len(data))); err != nil {
					return err
				}
			}
			bar.Add(int64(ts))
		}
		return nil
	})
}

// getFile reads blob g into out: tract i at offset i×tract size, the file
// ending at the last tract's end.
func getFile(ctx context.Context, c *tract.Client, g tract.GUID, out *os.File, mode progressMode, stderr io.Writer) error {
	return openForGet(ctx, c, g, mode, stderr, func(b *tract.Blob, ts int, n uint64, bar *progress) error {
		var mu sync.Mutex
		end := int64(0)
		err := forEachTract(ctx, n, c.SimultaneousLimit(), func(ctx context.Context, i uint64) error {
			data, err := b.ReadTract(ctx, i)
			if err != nil {
				return fmt.Errorf("read tract %d: %w", i, err)
			}
			stepDone(ctx)
			off := int64(i) * int64(ts)
			if _, err := out.WriteAt(data, off); err != nil {
				return err
			}
			mu.Lock()
			if i == n-1 {
				end = off + int64(len(data))
			}
			mu.Unlock()
			bar.Add(int64(ts))
			return nil
		})
		if err != nil {
			return err
		}
		return out.Truncate(end)
	})
}

func newBlobStatCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat ID",
		Short: "Show a blob's length, size, layout and where each tract's replicas or shards live",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := tract.ParseGUID(args[0])
			if err != nil {
				return err
			}
			ctx, c, err := a.dialTract(cmd.Context(), &cf)
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := statBlob(ctx, c.tract, g)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.stdout, st)
			}
			fmt.Fprintf(a.stdout, "blob:        %s\ntracts:      %d (tract size %s)\nbytes:       %d (%s)\nreplication: %d\nlayout:      %s\ncreated:     %s\nmodified:    %s\n",
				st.ID, st.Tracts, humanBytes(int64(st.TractSize)), st.Bytes, humanBytes(st.Bytes), st.Replication, st.Layout,
				st.Created.Format(time.RFC3339), st.Modified.Format(time.RFC3339))
			what := "replicas"
			if strings.HasPrefix(st.Layout, "ec:") {
				what = "shards 0.." + strconv.Itoa(st.Replication-1)
			}
			for i, p := range st.Placement {
				if i == maxStatPlacement {
					fmt.Fprintf(a.stdout, "  ... %d more tracts (--json lists every one)\n", len(st.Placement)-i)
					break
				}
				fmt.Fprintf(a.stdout, "tract %d: TLT row %d, %s on %s\n", p.Tract, p.Row, what, strings.Join(p.Servers, " "))
			}
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// BlobStat is what `arbor blob stat` prints.
type BlobStat struct {
	ID          string    `json:"id"`
	Tracts      uint64    `json:"tracts"`
	TractSize   int       `json:"tract_size"`
	Bytes       int64     `json:"bytes"`
	Replication int       `json:"replication"`
	Created     time.Time `json:"created"`
	Modified    time.Time `json:"modified"`
	// Layout is replicas:K or ec:D+P.
	Layout string `json:"layout"`
	// Placement lists, per tract, the tractservers (node/disk) holding its
	// replicas, or its shards in shard order, under the current TLT.
	Placement []TractPlacement `json:"placement"`
}

// TractPlacement is where one tract lives.
type TractPlacement struct {
	Tract   uint64   `json:"tract"`
	Row     int      `json:"row"`
	Servers []string `json:"servers"`
}

// maxStatPlacement bounds the tracts `blob stat` lists in text.
const maxStatPlacement = 16

// statBlob reads a blob's record and the length of its last tract.
func statBlob(ctx context.Context, c *tract.Client, g tract.GUID) (BlobStat, error) {
	ts, err := c.TractSize(ctx)
	if err != nil {
		return BlobStat{}, err
	}
	b, err := c.OpenBlob(ctx, g)
	if err != nil {
		return BlobStat{}, fmt.Errorf("open blob %s: %w", g, err)
	}
	defer b.Close()
	info := b.Info() // OpenBlob just read the length
	n := info.Tracts
	st := BlobStat{ID: g.String(), Tracts: n, TractSize: ts, Replication: info.Replication, Created: info.Created, Modified: info.Modified,
		Layout: info.Layout.String(), Placement: []TractPlacement{}}
	for i := range n {
		row, servers, err := b.Placement(ctx, i)
		if err != nil {
			return BlobStat{}, err
		}
		p := TractPlacement{Tract: i, Row: row}
		for _, s := range servers {
			p.Servers = append(p.Servers, s.String())
		}
		st.Placement = append(st.Placement, p)
	}
	if n > 0 {
		last, err := b.TractLength(ctx, n-1)
		if err != nil {
			return BlobStat{}, err
		}
		st.Bytes = int64(n-1)*int64(ts) + int64(last)
	}
	return st, nil
}

func newBlobRmCmd(a *app) *cobra.Command {
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Delete a blob (its tracts are reclaimed by the scrubbers)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			g, err := tract.ParseGUID(args[0])
			if err != nil {
				return err
			}
			ctx, c, err := a.dialTract(cmd.Context(), &cf)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.tract.DeleteBlob(ctx, g); err != nil {
				return fmt.Errorf("delete blob %s: %w", g, err)
			}
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}

func newBlobVerifyCmd(a *app) *cobra.Command {
	var f transferFlags
	cmd := &cobra.Command{
		Use:   "verify [ID...]",
		Short: "Check that every tract has its full replica count (or its full stripe) with matching checksums and parity",
		Long: `Read every replica of every tract of every blob (or of the blobs named) and
check that each has all its replicas, in sync with its row's primary, at the
same version and with data that matches its checksum; for an erasure-coded
blob, that each tract has all D+P shards of one write on its row's first D+P
slots, each matching its checksum, and that the parity matches the data.
Exits 0 only if so. Tracts inside blobs that no replica holds, and blobs
that hold none of their tracts, are counted: they are lost, or were never
written (a write that failed after its blob was sized leaves them, so the
two cannot be told apart); for a blob named on the command line every
missing tract is a problem.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := f.mode()
			if err != nil {
				return err
			}
			var blobs []tract.GUID
			for _, s := range args {
				g, err := tract.ParseGUID(s)
				if err != nil {
					return err
				}
				blobs = append(blobs, g)
			}
			ctx, c, err := a.dialTract(cmd.Context(), &f.cf)
			if err != nil {
				return err
			}
			defer c.Close()
			bar := newProgress(a.stderr, mode, "verify", 0, false)
			rep, err := c.tract.Verify(ctx, tract.VerifyOptions{Blobs: blobs, Progress: func(done, total int) {
				stepDone(ctx)
				bar.Set(int64(done), int64(total), "rows")
			}})
			bar.Finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "TLT version %d: %d rows, %d blobs, %d tracts, %d replicas verified",
				rep.TLTVersion, rep.Rows, rep.Blobs, rep.Tracts, rep.Replicas)
			if rep.Stripes > 0 || rep.Shards > 0 {
				fmt.Fprintf(a.stdout, ", %d erasure-coded stripes parity-checked (%d shards)", rep.Stripes, rep.Shards)
			}
			if rep.Garbage > 0 {
				fmt.Fprintf(a.stdout, ", %d replicas of deleted blobs awaiting the scrubber", rep.Garbage)
			}
			fmt.Fprintln(a.stdout)
			if rep.Unheld > 0 {
				fmt.Fprintf(a.stdout, "held by no replica: %d tracts inside blobs, %d blobs holding none of their tracts: lost, or never written (name a blob to check that all its tracts exist)\n",
					rep.Unheld, rep.UnheldBlobs)
			}
			for _, p := range rep.Problems {
				fmt.Fprintln(a.stdout, "problem:", p)
			}
			if !rep.OK() {
				return fmt.Errorf("verify: %d problems", rep.ProblemsTotal)
			}
			if rep.Stripes > 0 {
				fmt.Fprintln(a.stdout, "ok: every tract has its full replica count (or its full stripe, with matching parity) with matching checksums")
			} else {
				fmt.Fprintln(a.stdout, "ok: every tract has its full replica count with matching checksums")
			}
			return nil
		},
	}
	f.register(cmd)
	return cmd
}
