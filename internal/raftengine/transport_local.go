package raftengine

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// LocalNetwork connects engines in one process, for tests. It delivers
// asynchronously, like a network, and can cut links, drop, delay and
// duplicate messages.
type LocalNetwork struct {
	mu       sync.Mutex
	handlers map[uint64]Handler
	cut      map[[2]uint64]bool // directed links that deliver nothing
	links    map[[2]uint64]*localLink
	dropRate float64
	dupRate  float64
	delayMax time.Duration
	rng      *rand.Rand
	closed   bool
}

type localLink struct {
	ch chan []Envelope
}

// NewLocalNetwork returns an empty network; seed makes its random faults
// reproducible.
func NewLocalNetwork(seed uint64) *LocalNetwork {
	return &LocalNetwork{
		handlers: map[uint64]Handler{},
		cut:      map[[2]uint64]bool{},
		links:    map[[2]uint64]*localLink{},
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// Transport returns node id's endpoint on the network.
func (n *LocalNetwork) Transport(id uint64) Transport { return &localTransport{net: n, id: id} }

// SetFaults sets the probability of dropping and duplicating a batch, and
// the maximum random delay of a batch.
func (n *LocalNetwork) SetFaults(drop, dup float64, delayMax time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dropRate, n.dupRate, n.delayMax = drop, dup, delayMax
}

// Cut stops delivery from a to b and from b to a.
func (n *LocalNetwork) Cut(a, b uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]uint64{a, b}] = true
	n.cut[[2]uint64{b, a}] = true
}

// Isolate cuts every link of node id.
func (n *LocalNetwork) Isolate(id uint64, peers ...uint64) {
	for _, p := range peers {
		if p != id {
			n.Cut(id, p)
		}
	}
}

// Heal restores every link.
func (n *LocalNetwork) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[[2]uint64]bool{}
}

// Close stops delivery; pending batches are dropped.
func (n *LocalNetwork) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for k, l := range n.links {
		close(l.ch)
		delete(n.links, k)
	}
}

func (n *LocalNetwork) isCut(from, to uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[[2]uint64{from, to}] || n.handlers[to] == nil
}

func (n *LocalNetwork) send(from, to uint64, envs []Envelope) {
	n.mu.Lock()
	// A detached node (crashed, in tests) sends nothing either: otherwise it
	// could acknowledge entries it syncs after its crash image was taken.
	if n.closed || n.cut[[2]uint64{from, to}] || n.handlers[from] == nil {
		n.mu.Unlock()
		return
	}
	if n.dropRate > 0 && n.rng.Float64() < n.dropRate {
		n.mu.Unlock()
		return
	}
	copies := 1
	if n.dupRate > 0 && n.rng.Float64() < n.dupRate {
		copies = 2
	}
	var delay time.Duration
	if n.delayMax > 0 {
		delay = time.Duration(n.rng.Int64N(int64(n.delayMax)))
	}
	key := [2]uint64{from, to}
	l := n.links[key]
	if l == nil {
		l = &localLink{ch: make(chan []Envelope, 4096)}
		n.links[key] = l
		go n.deliver(from, to, l)
	}
	n.mu.Unlock()

	// Copy the messages: the sender may not reuse them, but the receiver
	// must not share them with the sender either, as over a real network.
	cp := make([]Envelope, len(envs))
	for i, e := range envs {
		cp[i] = Envelope{GroupID: e.GroupID, Quiesce: e.Quiesce, Message: proto.CloneOf(e.Message)}
	}
	for range copies {
		if delay > 0 {
			time.AfterFunc(delay, func() { n.enqueue(key, cp) })
		} else {
			n.enqueue(key, cp)
		}
	}
}

func (n *LocalNetwork) enqueue(key [2]uint64, envs []Envelope) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[key]
	if l == nil {
		return
	}
	select {
	case l.ch <- envs:
	default: // full: drop, like a congested network
	}
}

func (n *LocalNetwork) deliver(from, to uint64, l *localLink) {
	for envs := range l.ch {
		n.mu.Lock()
		h := n.handlers[to]
		cut := n.cut[[2]uint64{from, to}]
		n.mu.Unlock()
		if h != nil && !cut {
			h.HandleMessages(from, envs)
		}
	}
}

type localTransport struct {
	net *LocalNetwork
	id  uint64
}

func (t *localTransport) Listen(h Handler) {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.net.handlers[t.id] = h
}

func (t *localTransport) Send(to uint64, envs []Envelope) { t.net.send(t.id, to, envs) }

// errLinkCut is returned for snapshots over a cut link.
var errLinkCut = errors.New("raftengine: local network: link cut")

func (t *localTransport) SendSnapshot(ctx context.Context, to uint64, snap OutgoingSnapshot) (bool, error) {
	if t.net.isCut(t.id, to) {
		return false, errLinkCut
	}
	t.net.mu.Lock()
	h := t.net.handlers[to]
	t.net.mu.Unlock()
	next := func() ([]KV, error) {
		if t.net.isCut(t.id, to) {
			return nil, errLinkCut
		}
		kvs, err := snap.Next()
		if err != nil {
			return nil, err
		}
		out := make([]KV, len(kvs))
		for i, kv := range kvs {
			out[i] = KV{Key: append([]byte(nil), kv.Key...), Value: append([]byte(nil), kv.Value...)}
		}
		return out, nil
	}
	applied, err := h.HandleSnapshot(ctx, snap.Header(), next)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return applied, err
}

// Detach removes node id from the network (its engine stopped); messages to
// it are dropped until a new engine listens under the same id.
func (n *LocalNetwork) Detach(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.handlers, id)
}
