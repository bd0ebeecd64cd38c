package overview

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// closedAddr returns a local address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestHandlerUnreachableCluster serves the overview of a cluster whose
// directory does not answer: 503, a JSON body that says why with every
// list empty rather than null, quickly, and cached for repeated requests.
func TestHandlerUnreachableCluster(t *testing.T) {
	g, err := NewGatherer([]string{closedAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.SectionTimeout = time.Second
	srv := httptest.NewServer(Handler(g))
	defer srv.Close()

	get := func() (int, map[string]any, Overview) {
		t.Helper()
		start := time.Now()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("request took %v", took)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
		var raw map[string]any
		var o Overview
		dec := json.NewDecoder(resp.Body)
		if err := dec.Decode(&raw); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(raw)
		if err := json.Unmarshal(b, &o); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, raw, o
	}
	code, raw, o := get()
	if code != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", code)
	}
	if o.Directory.Error == "" || len(o.Degraded) == 0 || o.Degraded[0].Subject != "directory" {
		t.Errorf("directory error %q, degraded %+v", o.Directory.Error, o.Degraded)
	}
	for _, k := range []string{"nodes", "degraded"} {
		if _, ok := raw[k].([]any); !ok {
			t.Errorf("%s is %v, want a list", k, raw[k])
		}
	}
	for _, k := range []string{"tlt", "extents", "tables", "file_systems"} {
		if _, ok := raw[k].(map[string]any); !ok {
			t.Errorf("%s is %v, want an object", k, raw[k])
		}
	}
	_, _, again := get()
	if !again.Time.Equal(o.Time) {
		t.Errorf("second request within the cache time gathered again (%v, then %v)", o.Time, again.Time)
	}
	time.Sleep(handlerCacheTTL + 100*time.Millisecond)
	if _, _, later := get(); later.Time.Equal(o.Time) {
		t.Errorf("request after the cache time served the old overview of %v", o.Time)
	}

	resp, err := http.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}
