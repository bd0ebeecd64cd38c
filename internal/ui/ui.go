package ui

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
)

//go:embed static
var staticFiles embed.FS

// Options configure a dashboard.
type Options struct {
	// Overview serves the cluster's state as JSON at /ui/api/overview (in
	// a node, package overview's Handler). Nil answers 503, and the page
	// shows what it still can.
	Overview http.Handler
	// Sampler keeps the throughput and latency history; nil answers 503
	// at /ui/api/metrics.
	Sampler *Sampler
	Logger  *slog.Logger
}

// Dashboard serves the web dashboard. Build it with New, put its routes on
// a mux with Register, stop it with Close.
type Dashboard struct {
	opts   Options
	log    *slog.Logger
	static http.Handler
}

// New returns a dashboard.
func New(opts Options) (*Dashboard, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, fmt.Errorf("ui: embedded assets: %w", err)
	}
	return &Dashboard{
		opts:   opts,
		log:    opts.Logger.With("component", "ui"),
		static: http.StripPrefix("/ui/", http.FileServerFS(sub)),
	}, nil
}

// Register adds the dashboard's routes (see the package doc) to mux.
func (d *Dashboard) Register(mux *http.ServeMux) {
	mux.Handle("GET /ui/api/overview", http.HandlerFunc(d.serveOverview))
	mux.Handle("GET /ui/api/metrics", http.HandlerFunc(d.serveMetrics))
	mux.Handle("GET /ui/", d.static)
	// The bare /ui is where an operator types; the page's relative asset
	// paths need the slash.
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}

// Close stops the sampler, if any.
func (d *Dashboard) Close() {
	if d.opts.Sampler != nil {
		d.opts.Sampler.Close()
	}
}

func (d *Dashboard) serveOverview(w http.ResponseWriter, r *http.Request) {
	// Someone is looking: the charts should have data when they ask.
	if d.opts.Sampler != nil {
		d.opts.Sampler.Touch()
	}
	if d.opts.Overview == nil {
		writeJSONError(w, http.StatusServiceUnavailable, errors.New("this node serves no cluster overview"))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	d.opts.Overview.ServeHTTP(w, r)
}

func (d *Dashboard) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	if d.opts.Sampler == nil {
		writeJSONError(w, http.StatusServiceUnavailable, errors.New("this node samples no metrics"))
		return
	}
	d.opts.Sampler.Touch()
	h := d.opts.Sampler.History()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err := json.NewEncoder(w).Encode(h); err != nil {
		d.log.Debug("writing metrics history", "err", err)
	}
}

func writeJSONError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	// The encoding of a string cannot fail.
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}
