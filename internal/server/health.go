package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// healthCheckTimeout bounds one run of all health checks (one /healthz).
const healthCheckTimeout = 2 * time.Second

// maxHealthChecks bounds the number of registered checks.
const maxHealthChecks = 64

// Node life-cycle phases as /healthz reports them.
const (
	phaseStarting = "starting"
	phaseServing  = "serving"
	phaseStopping = "stopping"
)

// HealthCheck reports a problem that makes the node unhealthy, or nil.
// It must return promptly once ctx ends.
type HealthCheck func(ctx context.Context) error

// Health holds the node's phase and health checks and serves /healthz.
type Health struct {
	nodeID    uint64
	clusterID string

	mu     sync.Mutex
	phase  string
	checks map[string]HealthCheck
}

func newHealth(nodeID uint64, clusterID string) *Health {
	return &Health{nodeID: nodeID, clusterID: clusterID, phase: phaseStarting, checks: map[string]HealthCheck{}}
}

// AddCheck registers a named check; /healthz fails while it fails. Modules
// call it from Init.
func (h *Health) AddCheck(name string, check HealthCheck) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.checks[name]; ok {
		return fmt.Errorf("health check %q registered twice", name)
	}
	if len(h.checks) >= maxHealthChecks {
		return fmt.Errorf("health check %q: more than %d checks", name, maxHealthChecks)
	}
	h.checks[name] = check
	return nil
}

func (h *Health) setPhase(p string) {
	h.mu.Lock()
	h.phase = p
	h.mu.Unlock()
}

// HealthReport is the JSON body of /healthz.
type HealthReport struct {
	// Healthy is true when the node is serving and every check passes.
	Healthy   bool   `json:"healthy"`
	Phase     string `json:"phase"`
	NodeID    uint64 `json:"node_id"`
	ClusterID string `json:"cluster_id"`
	// Checks maps each check to "ok" or its error.
	Checks map[string]string `json:"checks"`
}

// Report runs every check and returns the node's health.
func (h *Health) Report(ctx context.Context) HealthReport {
	h.mu.Lock()
	phase := h.phase
	names := make([]string, 0, len(h.checks))
	for name := range h.checks {
		names = append(names, name)
	}
	slices.Sort(names)
	checks := make([]HealthCheck, len(names))
	for i, name := range names {
		checks[i] = h.checks[name]
	}
	h.mu.Unlock()

	r := HealthReport{Healthy: phase == phaseServing, Phase: phase, NodeID: h.nodeID, ClusterID: h.clusterID, Checks: map[string]string{}}
	ctx, cancel := context.WithTimeout(ctx, healthCheckTimeout)
	defer cancel()
	for i, name := range names {
		if err := checks[i](ctx); err != nil {
			r.Checks[name] = err.Error()
			r.Healthy = false
		} else {
			r.Checks[name] = "ok"
		}
	}
	return r
}

// ServeHTTP answers 200 with the report when healthy, 503 otherwise.
func (h *Health) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r := h.Report(req.Context())
	w.Header().Set("Content-Type", "application/json")
	if !r.Healthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(r)
}
