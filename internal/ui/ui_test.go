package ui

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func serveDashboard(t *testing.T, opts Options) *httptest.Server {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestDashboardRoutes(t *testing.T) {
	const overviewJSON = `{"directory":{"leader":1},"nodes":[],"degraded":[]}`
	a := newNode(t)
	s := newTestSampler(t, SamplerOptions{
		Targets: func(context.Context) ([]string, error) { return []string{a.addr()}, nil },
		Step:    50 * time.Millisecond,
	})
	srv := serveDashboard(t, Options{
		Overview: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, overviewJSON)
		}),
		Sampler: s,
	})
	c := srv.Client()

	resp, body := get(t, c, srv.URL+"/ui/")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "<title>arbor dashboard</title>") {
		t.Fatalf("GET /ui/: %s %.200q", resp.Status, body)
	}
	for path, ctype := range map[string]string{"/ui/app.js": "javascript", "/ui/style.css": "text/css"} {
		resp, body := get(t, c, srv.URL+path)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Type"), ctype) || len(body) < 100 {
			t.Errorf("GET %s: %s, type %q, %d bytes", path, resp.Status, resp.Header.Get("Content-Type"), len(body))
		}
	}
	// Every asset the page names is embedded: nothing comes from elsewhere.
	for _, ref := range []string{`href="style.css"`, `src="app.js"`} {
		if !strings.Contains(body, ref) {
			t.Errorf("page does not reference %s", ref)
		}
	}
	if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Error("page references an external URL")
	}

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if resp, _ := get(t, noRedirect, srv.URL+"/ui"); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %s to %q, want a redirect to /ui/", resp.Status, resp.Header.Get("Location"))
	}

	resp, body = get(t, c, srv.URL+"/ui/api/overview")
	if resp.StatusCode != http.StatusOK || body != overviewJSON || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET /ui/api/overview: %s %q cache %q", resp.Status, body, resp.Header.Get("Cache-Control"))
	}
	// Looking at the page started the sampler; points follow.
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.serve("/x.X/Get", "OK", 1, time.Millisecond)
		resp, body = get(t, c, srv.URL+"/ui/api/metrics")
		var h History
		if err := json.Unmarshal([]byte(body), &h); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /ui/api/metrics: %s %q: %v", resp.Status, body, err)
		}
		if !h.Sampling || h.StepMs != 50 {
			t.Fatalf("history %+v: want sampling at 50 ms steps", h)
		}
		if len(h.Points) > 0 && h.Points[len(h.Points)-1].Ops > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no traffic in the history after 5 s: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDashboardWithoutData(t *testing.T) {
	srv := serveDashboard(t, Options{})
	for _, path := range []string{"/ui/api/overview", "/ui/api/metrics"} {
		resp, body := get(t, srv.Client(), srv.URL+path)
		var e struct{ Error string }
		if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != http.StatusServiceUnavailable || e.Error == "" {
			t.Errorf("GET %s: %s %q, want 503 with an error message", path, resp.Status, body)
		}
	}
}
