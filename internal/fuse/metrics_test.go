package fuse_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// btreeMetrics checks that the metadata servers export their B-tree's
// counters on /metrics (arbor_btree_*) and that they moved with the file
// system's work: summed over the nodes, pages were read, leaves split and
// the leaf cache was asked (hits and misses).
func btreeMetrics(t *testing.T, e *env) {
	sum := map[string]float64{}
	for _, n := range e.c.Nodes() {
		for name, v := range scrapeMetrics(t, n.HTTPAddr, "arbor_btree_") {
			sum[name] += v
		}
	}
	t.Logf("the metadata servers' B-tree counters, all nodes: %v", sum)
	for _, name := range []string{"arbor_btree_page_reads_total", "arbor_btree_splits_total", "arbor_btree_leaf_cache_hits_total", "arbor_btree_leaf_cache_misses_total"} {
		v, ok := sum[name]
		if !ok {
			t.Errorf("no node exports %s", name)
		} else if v <= 0 {
			t.Errorf("%s is %v after the file system's work", name, v)
		}
	}
}

// scrapeMetrics returns the samples of node addr's /metrics whose names
// start with prefix.
func scrapeMetrics(t *testing.T, addr, prefix string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%s: sample %q: %v", addr, line, err)
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return out
}
