package faults

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-storage/arbor/internal/faults/faultspb"
)

// maxBlockedPeers bounds the set of blocked peers of one injector.
const maxBlockedPeers = 4096

// adminMethodPrefix names the Admin service's methods, which are never
// faulted or partitioned (invariant 3).
var adminMethodPrefix = "/" + faultspb.Admin_ServiceDesc.ServiceName + "/"

// Options configures an Injector.
type Options struct {
	// NodeID is the local node's id; outgoing calls carry it so that peers
	// can partition this node. Zero for processes that are not nodes: their
	// calls carry no id and are never partitioned.
	NodeID uint64
	// Config is the initial fault configuration.
	Config Config
	// Logger receives configuration changes; nil discards them.
	Logger *slog.Logger
}

// Injector decides which calls and messages to fault and holds the set of
// blocked peers. It is safe for concurrent use.
type Injector struct {
	nodeID uint64
	logger *slog.Logger
	counts counters

	mu      sync.Mutex
	cfg     Config         // effective: Seed is never zero
	methods *regexp.Regexp // nil: every method
	rng     *rand.Rand
	blocked map[uint64]bool
}

// New returns an injector with opts.Config (validated) and no blocked peers.
func New(opts Options) (*Injector, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	in := &Injector{nodeID: opts.NodeID, logger: logger, blocked: map[uint64]bool{}}
	if err := in.SetConfig(opts.Config); err != nil {
		return nil, err
	}
	return in, nil
}

// NodeID returns the id of the node the injector belongs to.
func (in *Injector) NodeID() uint64 { return in.nodeID }

// Update is a change to an injector, applied in field order: Config,
// Blocked (when ReplaceBlocked), Block, Unblock.
type Update struct {
	// Config, when non-nil, replaces the configuration and reseeds the
	// decisions (a zero seed is replaced by a random one).
	Config *Config
	// ReplaceBlocked replaces the blocked set with Blocked.
	ReplaceBlocked bool
	Blocked        []uint64
	// Block adds peers to the blocked set; Unblock removes them.
	Block, Unblock []uint64
}

// Apply validates u and, only if all of it is valid, applies all of it at
// once: a bad update changes nothing.
func (in *Injector) Apply(u Update) error {
	var methods *regexp.Regexp
	var cfg Config
	if u.Config != nil {
		cfg = *u.Config
		if err := cfg.Validate(); err != nil {
			return err
		}
		if cfg.Methods != "" {
			methods = regexp.MustCompile(cfg.Methods) // Validate compiled it
		}
		for cfg.Seed == 0 {
			cfg.Seed = rand.Uint64()
		}
	}
	for _, ids := range [][]uint64{u.Blocked, u.Block, u.Unblock} {
		if slices.Contains(ids, 0) {
			return fmt.Errorf("faults: node id 0 is not a node")
		}
	}

	in.mu.Lock()
	blocked := in.blocked
	if u.ReplaceBlocked || len(u.Block) > 0 || len(u.Unblock) > 0 {
		blocked = map[uint64]bool{}
		if !u.ReplaceBlocked {
			maps.Copy(blocked, in.blocked)
		}
		for _, ids := range [][]uint64{u.Blocked, u.Block} {
			for _, id := range ids {
				blocked[id] = true
			}
		}
		for _, id := range u.Unblock {
			delete(blocked, id)
		}
		if len(blocked) > maxBlockedPeers {
			in.mu.Unlock()
			return fmt.Errorf("faults: %d blocked peers, more than the limit of %d", len(blocked), maxBlockedPeers)
		}
	}
	in.blocked = blocked
	if u.Config != nil {
		in.cfg = cfg
		in.methods = methods
		in.rng = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	}
	in.mu.Unlock()

	if u.Config != nil {
		if cfg.Enabled() {
			in.logger.Warn("fault injection on", "faults", cfg.String())
		} else {
			in.logger.Info("fault injection off")
		}
	}
	return nil
}

// SetConfig replaces the configuration and reseeds the decisions. An invalid
// c is rejected and changes nothing.
func (in *Injector) SetConfig(c Config) error { return in.Apply(Update{Config: &c}) }

// Config returns the effective configuration; its Seed is the one in use.
func (in *Injector) Config() Config {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cfg
}

// SetBlocked replaces the set of blocked peers.
func (in *Injector) SetBlocked(ids []uint64) error {
	return in.Apply(Update{ReplaceBlocked: true, Blocked: ids})
}

// Block adds peers to the blocked set.
func (in *Injector) Block(ids ...uint64) error { return in.Apply(Update{Block: ids}) }

// Unblock removes peers from the blocked set.
func (in *Injector) Unblock(ids ...uint64) error { return in.Apply(Update{Unblock: ids}) }

// Blocked returns the blocked peers in ascending order.
func (in *Injector) Blocked() []uint64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	ids := make([]uint64, 0, len(in.blocked))
	for id := range in.blocked {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// IsBlocked reports whether calls from peer are rejected. Peer 0 (a caller
// that is not a node) is never blocked.
func (in *Injector) IsBlocked(peer uint64) bool {
	if peer == 0 {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.blocked[peer]
}

// decision is what to do to one call or message.
type decision struct {
	// fail: the call or message is lost. replyLost selects, for unary calls,
	// whether the reply rather than the request is lost.
	fail, replyLost bool
	// delay before sending; zero for none.
	delay time.Duration
	// dup: send twice.
	dup bool
}

// exempt reports whether method is never faulted nor partitioned.
func exempt(method string) bool {
	return len(method) >= len(adminMethodPrefix) && method[:len(adminMethodPrefix)] == adminMethodPrefix
}

// decide draws the decision for one call or message of method. ok is false
// when method is not subject to faults; no value is drawn then.
func (in *Injector) decide(method string) (d decision, ok bool) {
	if exempt(method) {
		return decision{}, false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	c := in.cfg
	if !c.Enabled() || (in.methods != nil && !in.methods.MatchString(method)) {
		return decision{}, false
	}
	// Always five draws, whatever the outcome (invariant 1).
	failDraw, kindDraw, delayDraw, spanDraw, dupDraw :=
		in.rng.Float64(), in.rng.Float64(), in.rng.Float64(), in.rng.Float64(), in.rng.Float64()
	d.fail = failDraw < c.FailRate
	d.replyLost = d.fail && kindDraw < 0.5
	if delayDraw < c.DelayRate {
		d.delay = c.DelayMin + time.Duration(spanDraw*float64(c.DelayMax-c.DelayMin))
		if d.delay <= 0 {
			d.delay = 0
		}
	}
	d.dup = !d.fail && dupDraw < c.DupRate
	return d, true
}

// Counts is a snapshot of the faults an injector has injected.
type Counts struct {
	// RequestsLost counts unary calls failed before they were sent and
	// streams failed at open; RepliesLost unary calls executed whose reply
	// was replaced by an error.
	RequestsLost, RepliesLost uint64
	// CallsDelayed counts delayed unary calls and stream opens;
	// CallsDuplicated counts unary calls sent twice.
	CallsDelayed, CallsDuplicated uint64
	// MessagesDropped, MessagesDelayed and MessagesDuplicated count stream
	// messages.
	MessagesDropped, MessagesDelayed, MessagesDuplicated uint64
	// PartitionRejections counts calls and stream messages rejected because
	// they came from, or went to, a blocked peer.
	PartitionRejections uint64
}

type counters struct {
	requestsLost, repliesLost, callsDelayed, callsDuplicated       atomic.Uint64
	messagesDropped, messagesDelayed, messagesDuplicated, rejected atomic.Uint64
}

// Counts returns the faults injected so far.
func (in *Injector) Counts() Counts {
	c := &in.counts
	return Counts{
		RequestsLost:        c.requestsLost.Load(),
		RepliesLost:         c.repliesLost.Load(),
		CallsDelayed:        c.callsDelayed.Load(),
		CallsDuplicated:     c.callsDuplicated.Load(),
		MessagesDropped:     c.messagesDropped.Load(),
		MessagesDelayed:     c.messagesDelayed.Load(),
		MessagesDuplicated:  c.messagesDuplicated.Load(),
		PartitionRejections: c.rejected.Load(),
	}
}
