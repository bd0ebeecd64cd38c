package devcluster_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/tract"
)

// TestReadyMeansServing starts seven nodes (five directory voters) at
// once, and the moment the cluster says it is healthy, four KV clients
// open the store at once (the first ones create the tree) and write, and a
// blob is stored and read back: none may fail because an election or the
// first TLT is still under way (issue 13 item 4). Then no node's log may
// show a panic: no RPC reached a module before it started (item 5, a
// Directory/Register reaching the raft engine before its scheduler
// existed).
func TestReadyMeansServing(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 7, DirectoryVoters: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func() *client.Cluster {
		cl, err := client.Dial(client.Options{Addrs: c.DirectoryAddrs(), ClusterID: c.ClusterID(), Credentials: c.Credentials()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	// Each client has its own 30 s, as a CLI command has (--timeout).
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 4 {
		wg.Go(func() {
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			defer ccancel()
			tr, err := dial().KV(cctx)
			if err != nil {
				errs <- err
				return
			}
			if err := tr.Put(cctx, []byte{'k', byte('0' + i)}, []byte("v")); err != nil {
				errs <- err
			}
		})
	}
	wg.Go(func() {
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		tc, err := dial().Tracts()
		if err != nil {
			errs <- err
			return
		}
		data := make([]byte, 100_000)
		rand.Read(data)
		b, err := tc.CreateBlob(cctx, tract.NewGUID(), 0)
		if err != nil {
			errs <- err
			return
		}
		if _, err := b.Extend(cctx, 1); err != nil {
			errs <- err
			return
		}
		if err := b.WriteTract(cctx, 0, data); err != nil {
			errs <- err
			return
		}
		got, err := b.ReadTract(cctx, 0)
		if err != nil {
			errs <- err
			return
		}
		if !bytes.Equal(got, data) {
			t.Errorf("blob read back differs")
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("first call after ready: %v", err)
	}
	for _, n := range c.Nodes() {
		log, err := os.ReadFile(n.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(log, []byte("panic")); i >= 0 {
			end := min(len(log), i+2000)
			t.Errorf("node %d logged a panic:\n%s", n.ID, strings.TrimSpace(string(log[max(0, i-200):end])))
		}
	}
}
