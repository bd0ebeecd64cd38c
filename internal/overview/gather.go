package overview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/gateway/nfs"
)

// DefaultSectionTimeout bounds each section of a Gather; sections run in
// parallel, so it also bounds the whole call (plus a little).
const DefaultSectionTimeout = 4 * time.Second

// Gatherer gathers overviews of one cluster over connections it keeps
// between calls. It is safe for concurrent use.
type Gatherer struct {
	cluster *client.Cluster
	extents *extent.Client
	// SectionTimeout bounds each section (default DefaultSectionTimeout).
	// Set it before the first Gather.
	SectionTimeout time.Duration
}

// NewGatherer returns a Gatherer of the cluster whose directory members
// listen at dirAddrs. opts are the gRPC dial options for the cluster's
// nodes (client.DialOptions); none means plain text (client.DialOptions("", nil)).
// It does not wait for the network.
func NewGatherer(dirAddrs []string, opts ...grpc.DialOption) (*Gatherer, error) {
	if len(opts) == 0 {
		opts = client.DialOptions("", nil)
	}
	c, err := client.Dial(client.Options{Addrs: dirAddrs, DialOptions: opts, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("overview: %w", err)
	}
	ec, err := extent.NewClient(extent.ClientConfig{Directory: c.Directory(), DialOptions: opts, CallTimeout: ExtentReplicaTimeout})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("overview: extent client: %w", err)
	}
	return &Gatherer{cluster: c, extents: ec, SectionTimeout: DefaultSectionTimeout}, nil
}

// Close closes the Gatherer's connections.
func (g *Gatherer) Close() error {
	return errors.Join(g.extents.Close(), g.cluster.Close())
}

// Gather connects to the cluster at dirAddrs, gathers one Overview and
// closes the connections: for a one-off caller such as `arbor status`.
func Gather(ctx context.Context, dirAddrs []string, opts ...grpc.DialOption) (Overview, error) {
	g, err := NewGatherer(dirAddrs, opts...)
	if err != nil {
		return Overview{Time: time.Now().UTC(), Degraded: []Problem{}}, err
	}
	defer g.Close()
	return g.Gather(ctx)
}

// Gather reads every section of the cluster's state in parallel, each
// bounded by SectionTimeout and ctx. A section that fails carries its
// error; the error returned is non-nil only when the directory could not
// be read at all (nothing else can be trusted without it), and the
// Overview is filled as far as it could be even then.
func (g *Gatherer) Gather(ctx context.Context) (Overview, error) {
	start := time.Now()
	o := Overview{Time: start.UTC().Truncate(time.Millisecond)}
	timeout := g.SectionTimeout
	if timeout <= 0 {
		timeout = DefaultSectionTimeout
	}
	dir := g.cluster.Directory()
	var stats map[uint64]*dpb.MemberStats
	var dirErr error
	var wg sync.WaitGroup
	section := func(fn func(ctx context.Context)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			fn(sctx)
		}()
	}
	section(func(ctx context.Context) {
		o.Directory, o.Nodes, dirErr = gatherDirectory(ctx, dir)
	})
	section(func(ctx context.Context) {
		resp, err := dir.GetMemberStats(ctx, &dpb.GetMemberStatsRequest{})
		if err != nil {
			o.Capacity.Error = fmt.Sprintf("member statistics: %v", err)
			return
		}
		stats = map[uint64]*dpb.MemberStats{}
		for _, s := range resp.GetStats() {
			stats[s.GetNodeId()] = s
		}
	})
	section(func(ctx context.Context) {
		tc, err := g.cluster.Tracts()
		if err == nil {
			o.TLT.TLTView, err = FetchTLT(ctx, dir, tc)
		}
		switch {
		case directory.IsNotFound(err):
			// A new cluster: the directory installs the first TLT once
			// enough storage nodes have registered.
			o.TLT.Error = "no TLT is installed yet: the blob store waits for enough storage nodes to register"
		case err != nil:
			o.TLT.Error = err.Error()
		}
	})
	section(func(ctx context.Context) {
		views, err := FetchExtents(ctx, g.extents)
		if err != nil {
			o.Extents.Error = err.Error()
		}
		o.Extents.Extents = views
	})
	section(func(ctx context.Context) {
		o.Tables = gatherTables(ctx, g.cluster)
	})
	section(func(ctx context.Context) {
		o.FileSystems = gatherFileSystems(ctx, dir)
	})
	section(func(ctx context.Context) {
		o.Gateways, o.GatewaysError = gatherGateways(ctx, dir)
	})
	wg.Wait()
	mergeStats(&o, stats)
	o.normalize()
	o.Recovery = ComputeRecovery(o)
	o.Degraded = ComputeDegraded(o)
	o.TookMs = time.Since(start).Milliseconds()
	if dirErr != nil {
		return o, fmt.Errorf("overview: %w", dirErr)
	}
	return o, nil
}

// gatherDirectory asks for the leader's linearizable view; if no leader
// answers (no quorum), it falls back to the possibly stale view of
// whichever member answers, and says so.
func gatherDirectory(ctx context.Context, dir *directory.Client) (Directory, []Node, error) {
	st, err := dir.Status(ctx, &dpb.StatusRequest{})
	stale := false
	if err != nil {
		local, lerr := dir.Status(ctx, &dpb.StatusRequest{Local: true})
		if lerr != nil {
			err = fmt.Errorf("directory status: %w", err)
			return Directory{Error: err.Error()}, nil, err
		}
		st, stale = local, true
	}
	d := Directory{Leader: st.GetLeaderId(), LeaderAddress: st.GetLeaderAddress(), Term: st.GetTerm(),
		Voters: st.GetVoters(), Learners: st.GetLearners(), AnsweredBy: st.GetNodeId(), Stale: stale}
	var nodes []Node
	for _, n := range st.GetNodes() {
		v := Node{ID: n.GetId(), Address: n.GetAddress(), HTTPAddress: n.GetHttpAddress(), Domain: n.GetFailureDomain(),
			State: directory.StateName(n.GetState()), Roles: n.GetRoles(), StateChangedUnixMs: n.GetStateChangedUnixMs()}
		switch {
		case n.GetId() == d.Leader:
			v.Directory = "leader"
		case slices.Contains(d.Voters, n.GetId()):
			v.Directory = "voter"
		case slices.Contains(d.Learners, n.GetId()):
			v.Directory = "learner"
		}
		for _, dk := range n.GetDisks() {
			v.Disks = append(v.Disks, Disk{Path: dk.GetPath(), CapacityBytes: dk.GetCapacityBytes(), UsedBytes: dk.GetUsedBytes()})
			v.CapacityBytes += dk.GetCapacityBytes()
			v.UsedBytes += dk.GetUsedBytes()
		}
		nodes = append(nodes, v)
	}
	return d, nodes, nil
}

func gatherTables(ctx context.Context, c *client.Cluster) TableSection {
	var s TableSection
	ts, err := c.Meta().Tables(ctx, 0)
	if err != nil {
		s.Error = fmt.Sprintf("list tables: %v", err)
		return s
	}
	servers, err := c.Meta().Servers(ctx)
	if err != nil {
		s.Error = fmt.Sprintf("list metadata servers: %v", err)
	}
	s.TableList = NewTableList(ts, servers)
	s.Servers = servers
	return s
}

func gatherFileSystems(ctx context.Context, dir *directory.Client) FileSystemSection {
	var s FileSystemSection
	resp, err := dir.ListFileSystems(ctx, &dpb.ListFileSystemsRequest{})
	if err != nil {
		s.Error = fmt.Sprintf("list file systems: %v", err)
		return s
	}
	for _, f := range resp.GetFileSystems() {
		fs := FileSystem{Number: f.GetNumber(), Name: f.GetName(), Created: rfc3339(f.GetCreatedUnixMs()), Snapshots: []Snapshot{}}
		for _, sn := range f.GetSnapshots() {
			fs.Snapshots = append(fs.Snapshots, Snapshot{Number: sn.GetNumber(), Name: sn.GetName(), Created: rfc3339(sn.GetCreatedUnixMs())})
		}
		s.FileSystems = append(s.FileSystems, fs)
	}
	return s
}

// gatewayProbeTimeout bounds the NFS NULL call that tells whether a
// gateway is up.
const gatewayProbeTimeout = 2 * time.Second

// gatherGateways lists the gateways the directory knows and probes each.
func gatherGateways(ctx context.Context, dir *directory.Client) ([]Gateway, string) {
	regs, err := nfs.Registered(ctx, dir)
	if err != nil {
		return nil, err.Error()
	}
	out := make([]Gateway, len(regs))
	var wg sync.WaitGroup
	for i, r := range regs {
		out[i] = Gateway{Address: r.Addr, Node: r.Node, State: GatewayUp}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, gatewayProbeTimeout)
			defer cancel()
			if err := nfs.Probe(pctx, r.Addr); err != nil {
				out[i].State, out[i].Error = GatewayDown, err.Error()
			}
		}()
	}
	wg.Wait()
	return out, ""
}

func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }

// mergeStats adds the nodes' reported figures and sums the capacity.
func mergeStats(o *Overview, stats map[uint64]*dpb.MemberStats) {
	for i := range o.Nodes {
		n := &o.Nodes[i]
		if s := stats[n.ID]; s != nil {
			n.FreeBytes, n.Load = s.GetFreeBytes(), s.GetLoad()
			if n.CapacityBytes == 0 {
				n.CapacityBytes = s.GetCapacityBytes()
			}
		}
		if n.State == StateDecommissioned {
			continue
		}
		o.Capacity.CapacityBytes += n.CapacityBytes
		o.Capacity.UsedBytes += n.UsedBytes
		o.Capacity.FreeBytes += n.FreeBytes
	}
}

// normalize sorts lists by id and makes nil lists empty, so the JSON has
// [] rather than null.
func (o *Overview) normalize() {
	orEmpty := func(s []uint64) []uint64 {
		if s == nil {
			return []uint64{}
		}
		slices.Sort(s)
		return s
	}
	o.Directory.Voters, o.Directory.Learners = orEmpty(o.Directory.Voters), orEmpty(o.Directory.Learners)
	if o.Nodes == nil {
		o.Nodes = []Node{}
	}
	slices.SortFunc(o.Nodes, func(a, b Node) int { return cmp.Compare(a.ID, b.ID) })
	for i := range o.Nodes {
		if o.Nodes[i].Roles == nil {
			o.Nodes[i].Roles = []string{}
		}
		if o.Nodes[i].Disks == nil {
			o.Nodes[i].Disks = []Disk{}
		}
	}
	if o.TLT.Servers == nil {
		o.TLT.Servers = []ServerView{}
	}
	if o.TLT.Rows == nil {
		o.TLT.Rows = []RowView{}
	}
	if o.Extents.Extents == nil {
		o.Extents.Extents = []ExtentView{}
	}
	slices.SortFunc(o.Extents.Extents, func(a, b ExtentView) int { return cmp.Compare(a.ID, b.ID) })
	for i := range o.Extents.Extents {
		o.Extents.Extents[i].Replicas = orEmpty(o.Extents.Extents[i].Replicas)
	}
	if o.Tables.Tables == nil {
		o.Tables.Tables = NewTableList(nil, nil).Tables
	}
	o.Tables.Servers = orEmpty(o.Tables.Servers)
	if o.FileSystems.FileSystems == nil {
		o.FileSystems.FileSystems = []FileSystem{}
	}
	if o.Degraded == nil {
		o.Degraded = []Problem{}
	}
	if o.Gateways == nil {
		o.Gateways = []Gateway{}
	}
}
