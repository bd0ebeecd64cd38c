package tract

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	crand "crypto/rand"

	"github.com/klauspost/reedsolomon"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"google.golang.org/protobuf/proto"

	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// This file is the erasure-coded layout (DESIGN.md §2.9) and the client's
// side of it: encoding a tract into a stripe, writing its shards in
// parallel, and reading it back, reconstructing on the fly. The package
// doc states the rules (placement, acknowledgement, partial writes).

// Erasure-coding bounds.
const (
	// DefaultECData and DefaultECParity are FSS's 5+2 geometry.
	DefaultECData   = 5
	DefaultECParity = 2
)

// ECLayout is an erasure-coded blob's geometry: each tract is one stripe
// of Data data shards and Parity parity shards (Reed-Solomon).
type ECLayout struct {
	Data, Parity int
}

// Width is the number of shards of a stripe (and TLT slots it uses).
func (e ECLayout) Width() int { return e.Data + e.Parity }

func (e ECLayout) String() string { return fmt.Sprintf("ec:%d+%d", e.Data, e.Parity) }

// ShardSize is the size of each shard of a tract of n bytes: n over the
// data shards, rounded up (the last data shard is padded with zeros).
func (e ECLayout) ShardSize(n int) int {
	if e.Data <= 0 {
		return 0
	}
	return (n + e.Data - 1) / e.Data
}

// check validates the geometry against a TLT of width slots per row.
func (e ECLayout) check(width int) error {
	if e.Data < 1 || e.Parity < 1 {
		return invalidf("layout %s: needs at least 1 data and 1 parity shard", e)
	}
	if e.Width() > maxReplication {
		return invalidf("layout %s: at most %d shards per stripe (maxReplication)", e, maxReplication)
	}
	if width > 0 && e.Width() > width {
		return invalidf("layout %s needs %d tractservers in distinct failure domains per TLT row; this cluster's rows have %d (the tract store's replication option)", e, e.Width(), width)
	}
	return nil
}

func (e ECLayout) toProto() *tpb.ErasureCode {
	return &tpb.ErasureCode{Data: uint32(e.Data), Parity: uint32(e.Parity)}
}

func layoutOf(p *tpb.ErasureCode) ECLayout {
	return ECLayout{Data: int(p.GetData()), Parity: int(p.GetParity())}
}

// Layout is how a blob stores its data tracts, chosen at creation:
// Replicas copies of each tract (replicas:K; 0 is the TLT's width), or,
// when EC.Data is set, one Reed-Solomon stripe per tract (ec:D+P).
type Layout struct {
	Replicas int
	EC       ECLayout
}

// IsEC reports whether the layout is erasure-coded.
func (l Layout) IsEC() bool { return l.EC.Data > 0 }

// Survives is how many lost failure domains a blob of the layout
// survives: P for ec:D+P, K-1 for K replicas.
func (l Layout) Survives() int {
	if l.IsEC() {
		return l.EC.Parity
	}
	return max(l.Replicas-1, 0)
}

func (l Layout) String() string {
	if l.IsEC() {
		return l.EC.String()
	}
	return "replicas:" + strconv.Itoa(l.Replicas)
}

// ParseLayout parses "replicas:K", "ec:D+P" or "ec" (ec:5+2).
func ParseLayout(s string) (Layout, error) {
	kind, arg, _ := strings.Cut(strings.TrimSpace(s), ":")
	switch kind {
	case "replicas":
		k, err := strconv.Atoi(arg)
		if err != nil || k < 1 || k > maxReplication {
			return Layout{}, fmt.Errorf("layout %q: replicas:K with K in [1, %d]", s, maxReplication)
		}
		return Layout{Replicas: k}, nil
	case "ec":
		if arg == "" {
			return Layout{EC: ECLayout{Data: DefaultECData, Parity: DefaultECParity}}, nil
		}
		ds, ps, ok := strings.Cut(arg, "+")
		d, err1 := strconv.Atoi(ds)
		p, err2 := strconv.Atoi(ps)
		if !ok || err1 != nil || err2 != nil {
			return Layout{}, fmt.Errorf("layout %q: ec:D+P, e.g. ec:5+2", s)
		}
		l := Layout{EC: ECLayout{Data: d, Parity: p}}
		if err := l.EC.check(0); err != nil {
			return Layout{}, fromWire(err)
		}
		return l, nil
	}
	return Layout{}, fmt.Errorf("layout %q: want replicas:K or ec:D+P", s)
}

// coders caches one Reed-Solomon encoder per geometry (an encoder is safe
// for concurrent use).
type coders struct {
	mu sync.Mutex
	m  map[ECLayout]reedsolomon.Encoder
}

func (c *coders) get(e ECLayout) (reedsolomon.Encoder, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if enc, ok := c.m[e]; ok {
		return enc, nil
	}
	enc, err := reedsolomon.New(e.Data, e.Parity)
	if err != nil {
		return nil, fmt.Errorf("tract: %s: %w", e, err)
	}
	if c.m == nil {
		c.m = map[ECLayout]reedsolomon.Encoder{}
	}
	c.m[e] = enc
	return enc, nil
}

// encodeStripe splits data into the layout's data shards (the last padded
// with zeros) and computes the parity shards.
func encodeStripe(enc reedsolomon.Encoder, e ECLayout, data []byte) ([][]byte, error) {
	size := e.ShardSize(len(data))
	shards := make([][]byte, e.Width())
	buf := make([]byte, size*e.Width())
	copy(buf, data)
	for i := range shards {
		shards[i] = buf[i*size : (i+1)*size : (i+1)*size]
	}
	if size == 0 {
		return shards, nil
	}
	if err := enc.Encode(shards); err != nil {
		return nil, fmt.Errorf("encode %s stripe: %w", e, err)
	}
	return shards, nil
}

// joinStripe rebuilds the missing data shards (nil entries) of shards and
// returns the tract's first n bytes.
func joinStripe(enc reedsolomon.Encoder, e ECLayout, shards [][]byte, n int) ([]byte, error) {
	size := e.ShardSize(n)
	missing := false
	for i := range e.Data {
		if shards[i] == nil {
			missing = true
		}
	}
	if missing && size > 0 {
		for i := range shards {
			if shards[i] != nil && len(shards[i]) != size {
				shards[i] = nil
			}
		}
		if err := enc.ReconstructData(shards); err != nil {
			return nil, fmt.Errorf("reconstruct %s stripe: %w", e, err)
		}
	}
	out := make([]byte, 0, size*e.Data)
	for i := range e.Data {
		if size > 0 {
			out = append(out, shards[i]...)
		}
	}
	return out[:n], nil
}

func newWriteID() uint64 {
	for {
		var b [8]byte
		_, _ = crand.Read(b[:])
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// checkDomains refuses an erasure-coded layout if some TLT row's first
// e.Width() slots are not in distinct failure domains (the manager shares
// domains in a row only when the cluster has too few of them).
func (c *Client) checkDomains(ctx context.Context, t *Table, e ECLayout) error {
	resp, err := c.cfg.Directory.ListNodes(ctx, &dpb.ListNodesRequest{})
	if err != nil {
		return fmt.Errorf("tract: list nodes to check failure domains: %w", err)
	}
	domain := map[uint64]string{}
	all := map[string]bool{}
	for _, n := range resp.GetNodes() {
		domain[n.GetId()] = n.GetFailureDomain()
		for _, r := range n.GetRoles() {
			if r == "storage" {
				all[n.GetFailureDomain()] = true
			}
		}
	}
	for ri, r := range t.Rows {
		seen := map[string]bool{}
		for _, s := range r.Slots[:min(e.Width(), len(r.Slots))] {
			d, ok := domain[s.Node]
			if !ok {
				continue // a node the directory forgot: not a shared domain
			}
			if seen[d] {
				return invalidf("layout %s needs %d tractservers in distinct failure domains; the cluster has %d failure domains with storage (TLT row %d has two slots in %q)",
					e, e.Width(), len(all), ri, d)
			}
			seen[d] = true
		}
	}
	return nil
}

// CheckLayout reports whether the cluster can hold blobs of layout l: K
// replicas need TLT rows of at least K slots; ec:D+P needs rows of at
// least D+P slots whose first D+P are in distinct failure domains. A
// refusal is INVALID_ARGUMENT and says what the cluster has.
func (c *Client) CheckLayout(ctx context.Context, l Layout) error {
	t, err := c.TLT(ctx)
	if err != nil {
		return err
	}
	if !l.IsEC() {
		if l.Replicas < 0 || l.Replicas > t.Replication {
			return invalidf("layout %s: this cluster's TLT rows have %d slots (the tract store's replication option)", l, t.Replication)
		}
		return nil
	}
	if err := l.EC.check(t.Replication); err != nil {
		return err
	}
	// The domains of one table's rows are checked once (a file system
	// creates a blob per file).
	key := checkedLayout{version: t.Version, e: l.EC}
	if _, ok := c.layoutsOK.Load(key); ok {
		return nil
	}
	if err := c.checkDomains(ctx, t, l.EC); err != nil {
		return err
	}
	c.layoutsOK.Store(key, true)
	return nil
}

// checkedLayout is an erasure-coded layout whose placement was checked
// against one version of the TLT.
type checkedLayout struct {
	version uint64
	e       ECLayout
}

// CreateBlobLayout creates a blob of n tracts with the given layout. An
// erasure-coded layout needs TLT rows of at least D+P slots in distinct
// failure domains; otherwise it is refused with INVALID_ARGUMENT and
// nothing is created.
func (c *Client) CreateBlobLayout(ctx context.Context, g GUID, l Layout, n uint64) (*Blob, error) {
	return c.CreateTenantBlob(ctx, g, l, n, "")
}

// CreateTenantBlob is CreateBlobLayout of a blob that belongs to tenant
// (issue 15): a tenant's credential may name only itself ("" stands for
// itself), an administrator's or a node's any tenant ("": the cluster's
// own blob, which no tenant reaches).
func (c *Client) CreateTenantBlob(ctx context.Context, g GUID, l Layout, n uint64, tenant string) (*Blob, error) {
	if !l.IsEC() {
		return c.createSized(ctx, g, l.Replicas, n, tenant)
	}
	if n > maxExtendTracts {
		return nil, invalidf("create with %d tracts: must be at most %d (maxExtendTracts)", n, maxExtendTracts)
	}
	if err := c.CheckLayout(ctx, l); err != nil {
		return nil, err
	}
	m, err := c.blobOp(ctx, g, &tpb.BlobOpRequest{Op: tpb.BlobOpKind_BLOB_OP_CREATE, Ec: l.EC.toProto(), ExtendTracts: n, RequestId: newRequestID(), Tenant: tenant})
	if err != nil {
		return nil, err
	}
	return &Blob{c: c, guid: g, info: infoOf(g, m)}, nil
}

// shardTargets are the servers shard i of a stripe in row goes to: slot i
// and the pending entries for slot i.
func shardTargets(row Row, i int) []ServerID {
	out := []ServerID{row.Slots[i]}
	for _, p := range row.Pending {
		if p.Slot == i {
			out = append(out, p.Server)
		}
	}
	return out
}

// writeStripe encodes tract i and writes its shards in parallel, under a
// generation one above the highest any of the stripe's servers holds. It
// returns once the write is acknowledged (the package doc's rule): every
// shard durable on all its targets, or, when the servers of some shards
// cannot be reached (dead, not yet replaced) or their disks are full, at
// least Data+1 shards durable and every other one failed only for want of
// its server or of room (missable); those shards are rebuilt when their
// server returns (its catch-up), from the repair queue, or by the
// scrubber.
func (b *Blob) writeStripe(ctx context.Context, info BlobInfo, i uint64, data []byte) error {
	enc, err := b.c.coders.get(info.Layout.EC)
	if err != nil {
		return err
	}
	e := info.Layout.EC
	shards, err := encodeStripe(enc, e, data)
	if err != nil {
		return err
	}
	crcs := make([]uint32, len(shards))
	for j, s := range shards {
		crcs[j] = Checksum(s)
	}
	return b.c.do(ctx, fmt.Sprintf("write stripe %s/%d", b.guid, i), func(ctx context.Context, t *Table) error {
		row := t.Rows[t.Locate(b.guid, int64(i))]
		if len(row.Slots) < e.Width() {
			return invalidf("layout %s: TLT rows have only %d slots", e, len(row.Slots))
		}
		gen, err := b.stripeGeneration(ctx, info, i, row)
		if err != nil {
			return err
		}
		desc := &tpb.Shard{Ec: e.toProto(), TractLength: uint32(len(data)), TractCrc32C: Checksum(data), WriteId: newWriteID(), Generation: gen + 1}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		failed := make([]bool, e.Width()) // shard j missed a target
		missable := make([]bool, e.Width())
		for j := range e.Width() {
			missable[j] = true
			s := proto.Clone(desc).(*tpb.Shard)
			s.Index = uint32(j)
			for _, srv := range shardTargets(row, j) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := b.c.writeShard(ctx, srv, &tpb.WriteShardRequest{
						Disk: srv.Disk, Guid: b.guid[:], Tract: int64(i), RowVersion: row.Version,
						Incarnation: info.Incarnation, Shard: s, Data: shards[j], Crc32C: crcs[j],
					})
					if err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("shard %d on %s: %w", j, srv, err))
						failed[j] = true
						mu.Unlock()
						miss := b.c.missable(ctx, srv, err)
						mu.Lock()
						missable[j] = missable[j] && miss
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		if len(errs) == 0 {
			return nil
		}
		durable, canMiss := 0, true
		for j := range e.Width() {
			if !failed[j] {
				durable++
			} else if !missable[j] {
				canMiss = false
			}
		}
		if canMiss && durable >= e.Data+1 && ctx.Err() == nil {
			b.c.degradedWrites.Add(1)
			b.c.log.Debug("erasure-coded write acknowledged with shards missing: their servers are unreachable or full", "blob", b.guid, "tract", i,
				"durable", durable, "of", e.Width(), "generation", desc.Generation, "err", errors.Join(errs...))
			b.c.requestRepair(ctx, b.guid, info.Incarnation, i, row, failed)
			return nil
		}
		return firstRetryable(errs)
	})
}

// requestRepair asks the first slot that stored its shard of a stripe
// written with shards missing (failed[j]: slot j's shard did not reach
// all its targets) to make the stripe whole (RepairStripe, ec_repair.go),
// so that a missed shard is rewritten once its server answers rather
// than at the scrubber's next parity pass. A refusal is logged only: the
// write is acknowledged, and the scrubber remains the backstop.
func (c *Client) requestRepair(ctx context.Context, g GUID, incarnation, i uint64, row Row, failed []bool) {
	j := slices.Index(failed, false)
	if j < 0 {
		return
	}
	srv := row.Slots[j]
	cl, err := c.peers.client(ctx, srv.Node)
	var resp *tpb.RepairStripeResponse
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
		resp, err = cl.RepairStripe(rctx, &tpb.RepairStripeRequest{Disk: srv.Disk, Guid: g[:], Tract: int64(i), RowVersion: row.Version, Incarnation: incarnation})
		cancel()
	}
	switch {
	case err != nil:
		c.log.Debug("stripe repair not requested: the scrubber will repair it", "blob", g, "tract", i, "server", srv, "err", err)
	case !resp.GetQueued():
		c.log.Debug("stripe repair queue full: the scrubber will repair it", "blob", g, "tract", i, "server", srv)
	default:
		c.repairsRequested.Add(1)
	}
}

// missable reports whether a shard write to srv failed for want of its
// server, or of room on it, rather than because the server refused the
// write: only such a shard may be missing from an acknowledged write. The
// connection refused (the server is down), the server cut off from the
// directory (TLT_BEHIND: it catches up every row it holds once back) and
// a server whose disk is full (OVERLOADED: it refuses every write until
// space is freed, and then takes the shard from the repair queue) qualify
// at once; a timeout only once the directory no longer holds the node
// alive (a partition), since an alive server that is merely slow would
// keep a stale shard until the scrubber's parity pass.
func (c *Client) missable(ctx context.Context, srv ServerID, err error) bool {
	if te, ok := ErrorOf(err); ok {
		return te.Code == tpb.ErrorCode_TLT_BEHIND || te.Code == tpb.ErrorCode_OVERLOADED
	}
	switch status.Code(err) {
	case codes.Unavailable:
		return true
	case codes.DeadlineExceeded:
		return ctx.Err() == nil && !c.nodeAlive(ctx, srv.Node)
	}
	return false
}

// nodeAlive reports whether the directory holds node alive (any answer
// but a definite not-alive counts as alive). The node table is shared by
// the calls of the last second (peers.nodeState).
func (c *Client) nodeAlive(ctx context.Context, node uint64) bool {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	st, ok := c.peers.nodeState(lctx, node)
	return !ok || st == dpb.NodeState_NODE_STATE_ALIVE
}

// stripeGeneration returns the highest generation of tract i's shards
// (of this incarnation) among the row's slots. It needs the answer of
// Data+1 of them: fewer could not acknowledge the write, and any Parity+1
// meet at least one shard of the last acknowledged write (which reached
// Data+1 of the Data+Parity).
func (b *Blob) stripeGeneration(ctx context.Context, info BlobInfo, i uint64, row Row) (uint64, error) {
	e := info.Layout.EC
	st := newStripeState(e)
	out := make([]shardRead, e.Width())
	var wg sync.WaitGroup
	for j := range e.Width() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[j] = b.c.readShard(ctx, b.guid, int64(i), row, j, row.Slots[j], info.Incarnation, true)
		}()
	}
	wg.Wait()
	for _, r := range out {
		st.add(r)
	}
	for _, err := range st.errs {
		if c := CodeOf(err); c == tpb.ErrorCode_STALE_TLT || c == tpb.ErrorCode_WRONG_SERVER {
			return 0, err
		}
	}
	if st.answered < e.Data+1 {
		// Too few to acknowledge a write: do not overwrite any shard.
		return 0, errorf(tpb.ErrorCode_REPLICA_FAILED, "tract %d of %s: %d of %d shard servers answered, a write needs %d: %v",
			i, b.guid, st.answered, e.Width(), e.Data+1, errors.Join(st.errs...))
	}
	return st.maxGen, nil
}

// firstRetryable joins errors, answering a final one if there is one (so
// that the caller stops retrying) and a retryable one otherwise.
func firstRetryable(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	for _, err := range errs {
		if !retryable(err) {
			return err
		}
	}
	for _, err := range errs {
		if CodeOf(err) == tpb.ErrorCode_STALE_TLT {
			return err
		}
	}
	return errorf(tpb.ErrorCode_REPLICA_FAILED, "%v", errors.Join(errs...))
}

func (c *Client) writeShard(ctx context.Context, srv ServerID, req *tpb.WriteShardRequest) error {
	s, err := c.server(ctx, srv)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	_, err = s.WriteShard(actx, req)
	return fromWire(err)
}

// shardRead is one server's answer for a stripe.
type shardRead struct {
	from  ServerID
	slot  int
	found bool
	meta  *tpb.TractMeta
	data  []byte
	err   error
}

func (c *Client) readShard(ctx context.Context, g GUID, tract int64, row Row, slot int, srv ServerID, incarnation uint64, metaOnly bool) shardRead {
	r := shardRead{from: srv, slot: slot}
	s, err := c.server(ctx, srv)
	if err != nil {
		r.err = err
		return r
	}
	resp, err := askShard(ctx, s, c.cfg.AttemptTimeout, srv, g, tract, row.Version, incarnation, metaOnly)
	if err != nil {
		r.err = err
		return r
	}
	r.found, r.meta, r.data = resp.Found, resp.Meta, resp.Data
	return r
}

// stripeWrite identifies one write of a stripe: the blob's incarnation,
// the write's generation and its id.
type stripeWrite struct {
	incarnation, generation, writeID uint64
}

func writeOf(m *tpb.TractMeta) stripeWrite {
	return stripeWrite{incarnation: m.Incarnation, generation: m.GetShard().GetGeneration(), writeID: m.GetShard().GetWriteId()}
}

// newer orders writes by generation (then id, then incarnation, only to
// be deterministic).
func (w stripeWrite) newer(o stripeWrite) bool {
	if w.generation != o.generation {
		return w.generation > o.generation
	}
	if w.writeID != o.writeID {
		return w.writeID > o.writeID
	}
	return w.incarnation > o.incarnation
}

// chooseWrite is the one rule by which reads, rebuilds, verify and the
// scrubber pick a stripe's write among the shards found (grouped by
// write, each by shard index): the newest generation of which at least
// data shards are there. An acknowledged write reached at least Data+1
// shards and every later write has a higher generation, so a shard that
// missed writes (its server was down) never outvotes them, and no older
// write can gather Data shards while Data+1 of a newer one survive (for
// D >= P). If no write has data shards, it returns the one with most
// (ties: the newest), which cannot be decoded.
func chooseWrite[T any](groups map[stripeWrite]map[int]T, data int) (stripeWrite, map[int]T) {
	var best stripeWrite
	var bestM map[int]T
	for w, m := range groups {
		switch {
		case bestM == nil:
		case len(m) >= data && len(bestM) >= data:
			if !w.newer(best) {
				continue
			}
		case len(m) >= data:
		case len(bestM) >= data:
			continue
		case len(m) < len(bestM) || len(m) == len(bestM) && !w.newer(best):
			continue
		}
		best, bestM = w, m
	}
	return best, bestM
}

// stripeState sorts the shards read of a stripe: usable shards by write,
// the highest generation seen, and how many servers answered at all.
type stripeState struct {
	e        ECLayout
	byWrite  map[stripeWrite]map[int]shardRead
	maxGen   uint64
	answered int
	errs     []error
}

func newStripeState(e ECLayout) *stripeState {
	return &stripeState{e: e, byWrite: map[stripeWrite]map[int]shardRead{}}
}

func (st *stripeState) add(r shardRead) {
	if r.err != nil {
		st.errs = append(st.errs, fmt.Errorf("%s: %w", r.from, r.err))
		return
	}
	st.answered++
	if !r.found {
		return
	}
	sh := r.meta.Shard
	st.maxGen = max(st.maxGen, sh.Generation)
	if layoutOf(sh.Ec) != st.e || int(sh.Index) >= st.e.Width() {
		return
	}
	w := st.byWrite[writeOf(r.meta)]
	if w == nil {
		w = map[int]shardRead{}
		st.byWrite[writeOf(r.meta)] = w
	}
	w[int(sh.Index)] = r
}

// best returns the stripe's write (chooseWrite) and its shards.
func (st *stripeState) best() (stripeWrite, map[int]shardRead) {
	return chooseWrite(st.byWrite, st.e.Data)
}

// decode returns the tract's data from at least Data shards of one write
// (with metaOnly, only the tract's record, from any one shard).
func (st *stripeState) decode(enc reedsolomon.Encoder, m map[int]shardRead, metaOnly bool) ([]byte, *tpb.TractMeta, error) {
	shards := make([][]byte, st.e.Width())
	var sh *tpb.Shard
	var meta *tpb.TractMeta
	for i, r := range m {
		shards[i] = r.data
		sh, meta = r.meta.Shard, r.meta
	}
	var data []byte
	if !metaOnly {
		var err error
		if data, err = joinStripe(enc, st.e, shards, int(sh.TractLength)); err != nil {
			return nil, nil, err
		}
		if Checksum(data) != sh.TractCrc32C {
			return nil, nil, errorf(tpb.ErrorCode_CORRUPT, "decoded stripe does not match the tract's checksum")
		}
	}
	out := &tpb.TractMeta{Row: meta.Row, Stamp: meta.Stamp, Length: sh.TractLength, Crc32C: sh.TractCrc32C,
		Replication: uint32(st.e.Width()), Incarnation: meta.Incarnation, WrittenUnixMs: meta.WrittenUnixMs, Shard: sh}
	return data, out, nil
}

// readStripe reads tract i of an erasure-coded blob: the Data data shards
// from slots 0..D-1 in parallel; if any is missing, corrupt, of another
// write or from a server that cannot answer, it reads the parity shards
// too and reconstructs (a degraded read). A tract no server holds a shard
// of reads as a hole.
func (b *Blob) readStripe(ctx context.Context, info BlobInfo, i uint64, metaOnly bool) ([]byte, *tpb.TractMeta, error) {
	e := info.Layout.EC
	enc, err := b.c.coders.get(e)
	if err != nil {
		return nil, nil, err
	}
	var data []byte
	var meta *tpb.TractMeta
	err = b.c.do(ctx, fmt.Sprintf("read stripe %s/%d", b.guid, i), func(ctx context.Context, t *Table) error {
		row := t.Rows[t.Locate(b.guid, int64(i))]
		if len(row.Slots) < e.Width() {
			return invalidf("layout %s: TLT rows have only %d slots", e, len(row.Slots))
		}
		st := newStripeState(e)
		readSlots := func(slots []int) {
			out := make([]shardRead, len(slots))
			var wg sync.WaitGroup
			for j, slot := range slots {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out[j] = b.c.readShard(ctx, b.guid, int64(i), row, slot, row.Slots[slot], info.Incarnation, metaOnly)
				}()
			}
			wg.Wait()
			for _, r := range out {
				st.add(r)
			}
		}
		first := make([]int, e.Data)
		for j := range first {
			first[j] = j
		}
		readSlots(first)
		if _, m := st.best(); metaOnly && len(m) > 0 || len(m) == e.Data && fastPath(m, e) {
			data, meta, err = st.decode(enc, m, metaOnly)
			if err == nil {
				return nil
			}
			st.errs = append(st.errs, err)
		}
		for _, r := range st.errs {
			if CodeOf(r) == tpb.ErrorCode_STALE_TLT {
				return r
			}
		}
		rest := make([]int, 0, e.Parity)
		for j := e.Data; j < e.Width(); j++ {
			rest = append(rest, j)
		}
		readSlots(rest)
		if _, m := st.best(); len(m) >= e.Data || metaOnly && len(m) > 0 {
			data, meta, err = st.decode(enc, m, metaOnly)
			if err == nil {
				if !metaOnly {
					b.c.degradedReads.Add(1)
				}
				return nil
			}
			st.errs = append(st.errs, err)
		}
		if len(st.byWrite) == 0 && st.answered >= e.Data {
			// Every acknowledged stripe write reached all D+P shards, so
			// D servers that answer without one prove a hole.
			data, meta = nil, nil // a hole: no shard anywhere
			return nil
		}
		return errorf(tpb.ErrorCode_NOT_READABLE, "tract %d of %s: fewer than %d shards of one write readable (%d servers answered): %v",
			i, b.guid, e.Data, st.answered, errors.Join(st.errs...))
	})
	if metaOnly {
		data = nil
	}
	return data, meta, err
}

// fastPath reports whether m holds exactly data shards 0..D-1.
func fastPath(m map[int]shardRead, e ECLayout) bool {
	for j := range e.Data {
		if _, ok := m[j]; !ok {
			return false
		}
	}
	return true
}

// stripeCheck is an erasure-coded tract whose records are right, to have
// its parity checked.
type stripeCheck struct {
	k   tractKey
	row Row
	b   *tpb.BlobMeta
}

// checkStripeRecords checks the listed shard records of tract k of an
// erasure-coded blob: slot i holds shard i, all of one write of the
// blob's incarnation, each verified against its checksum. It reports
// whether the stripe is worth reading for a parity check.
func checkStripeRecords(rep *VerifyReport, k tractKey, b *tpb.BlobMeta, lists []memberList) bool {
	e := layoutOf(b.Ec)
	var holders []shardHolder
	for j := 0; j < e.Width() && j < len(lists); j++ {
		if en := lists[j].entries[k]; en != nil && en.Meta.GetShard() != nil && en.Meta.Incarnation == b.Incarnation {
			holders = append(holders, shardHolder{server: lists[j].server, meta: en.Meta})
		}
	}
	if len(holders) == 0 {
		rep.Garbage++ // shards of an earlier incarnation only
		return false
	}
	rep.Tracts++
	g, _ := bestGroup(holders, e)
	ok := true
	for j := 0; j < e.Width(); j++ {
		if j >= len(lists) {
			rep.problem("tract %s: %s needs %d slots, the row has %d", k, e, e.Width(), len(lists))
			return false
		}
		l := lists[j]
		if l.err != nil {
			ok = false
			continue // reported for the row
		}
		en := l.entries[k]
		sh := en.GetMeta().GetShard()
		switch {
		case en == nil || sh == nil || en.Meta.Incarnation != b.Incarnation:
			rep.problem("tract %s: shard %d on %s is missing", k, j, l.server)
			ok = false
		case int(sh.Index) != j:
			rep.problem("tract %s: slot %d on %s holds shard %d", k, j, l.server, sh.Index)
			ok = false
		case sh.WriteId != g.writeID:
			rep.problem("tract %s: shard %d on %s is of write %016x, the stripe's is %016x", k, j, l.server, sh.WriteId, g.writeID)
			ok = false
		case !en.Verified:
			rep.problem("tract %s: shard %d on %s fails its checksum", k, j, l.server)
			ok = false
		default:
			rep.Shards++
		}
	}
	return ok
}

// verifyStripes reads every shard of each stripe and checks that the
// parity matches the data and that the decoded tract matches the checksum
// the client wrote.
func (c *Client) verifyStripes(ctx context.Context, rep *VerifyReport, stripes []stripeCheck, parallelism int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallelism)
	for _, s := range stripes {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			problem := c.verifyStripe(ctx, s)
			mu.Lock()
			defer mu.Unlock()
			if problem != "" {
				rep.problem("tract %s: %s", s.k, problem)
			} else {
				rep.Stripes++
			}
		}()
	}
	wg.Wait()
}

func (c *Client) verifyStripe(ctx context.Context, s stripeCheck) string {
	e := layoutOf(s.b.Ec)
	enc, err := c.coders.get(e)
	if err != nil {
		return err.Error()
	}
	shards := make([][]byte, e.Width())
	var sh *tpb.Shard
	for j := range e.Width() {
		r := c.readShard(ctx, s.k.guid, s.k.tract, s.row, j, s.row.Slots[j], s.b.Incarnation, false)
		switch {
		case r.err != nil:
			return fmt.Sprintf("read shard %d from %s: %v", j, r.from, r.err)
		case !r.found || int(r.meta.Shard.Index) != j:
			return fmt.Sprintf("shard %d on %s is gone", j, r.from)
		case sh != nil && r.meta.Shard.WriteId != sh.WriteId:
			return fmt.Sprintf("shard %d on %s was rewritten during the check", j, r.from)
		}
		shards[j], sh = r.data, r.meta.Shard
	}
	if e.ShardSize(int(sh.TractLength)) > 0 {
		ok, err := enc.Verify(shards)
		if err != nil {
			return fmt.Sprintf("parity check: %v", err)
		}
		if !ok {
			return "parity does not match the data"
		}
	}
	data, err := joinStripe(enc, e, shards, int(sh.TractLength))
	if err != nil {
		return err.Error()
	}
	if Checksum(data) != sh.TractCrc32C {
		return "the data shards do not match the tract's checksum"
	}
	return ""
}

// Placement returns the TLT row of tract i and the servers that hold it
// under the client's TLT: its replicas (primary first), or its shards in
// shard order.
func (b *Blob) Placement(ctx context.Context, i uint64) (int, []ServerID, error) {
	info, err := b.check()
	if err != nil {
		return 0, nil, err
	}
	t, err := b.c.TLT(ctx)
	if err != nil {
		return 0, nil, err
	}
	ri := t.Locate(b.guid, int64(i))
	row := t.Rows[ri]
	return ri, append([]ServerID(nil), row.Slots[:min(info.Replication, len(row.Slots))]...), nil
}
