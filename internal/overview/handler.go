package overview

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// handlerCacheTTL is how long Handler serves one Overview: many open
// dashboards then cost the cluster one gathering a second, not one each.
const handlerCacheTTL = time.Second

// Handler serves g's Overview as JSON (the shape in the package doc). It
// answers 200 with the overview, or 503 with it when the directory could
// not be read; concurrent and repeated requests within a second share one
// gathering.
func Handler(g *Gatherer) http.Handler {
	return &handler{g: g}
}

type handler struct {
	g *Gatherer
	// mu is held across a gathering so concurrent requests wait for it
	// rather than start their own.
	mu     sync.Mutex
	at     time.Time
	body   []byte
	status int
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, status := h.get(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (h *handler) get(ctx context.Context) ([]byte, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.body != nil && time.Since(h.at) < handlerCacheTTL {
		return h.body, h.status
	}
	// The result is shared with other requests: one that goes away must
	// not cut the gathering short for them. Gather bounds itself.
	o, err := h.g.Gather(context.WithoutCancel(ctx))
	status := http.StatusOK
	if err != nil {
		status = http.StatusServiceUnavailable
	}
	body, merr := json.Marshal(o)
	if merr != nil {
		return []byte(`{"error":"encode the overview"}`), http.StatusInternalServerError
	}
	h.body, h.status, h.at = append(body, '\n'), status, time.Now()
	return h.body, h.status
}
