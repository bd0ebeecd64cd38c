package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/security"
)

func newDebugCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "debug",
		Short: "Tools for developers and tests",
	}
	cmd.AddCommand(newDebugFaultsCmd(a), newDebugNemesisCmd(a))
	return cmd
}

// faultTargets are the nodes a debug faults command acts on.
type faultTargets struct {
	addrs     string
	dir       string
	clusterID string
	asJSON    bool
	creds     credentialFlags
	timeout   time.Duration
}

func newDebugFaultsCmd(a *app) *cobra.Command {
	ft := &faultTargets{timeout: defaultTimeout}
	cmd := &cobra.Command{
		Use:   "faults",
		Short: "Read or change nodes' fault injection and partitions at run time",
		Long: `Read or change the fault-injection switch of running nodes through their
Admin service. Target nodes with --addr (gRPC addresses) or --dir (every node
of an arbor dev cluster).

  arbor debug faults get --dir /tmp/arbor
  arbor debug faults set fail=0.01,delay=0.05:1ms-20ms --dir /tmp/arbor
  arbor debug faults block 2,3 --addr 127.0.0.1:40001   (node at that address refuses nodes 2 and 3)
  arbor debug faults unblock 2 --addr 127.0.0.1:40001
  arbor debug faults heal --dir /tmp/arbor              (no faults, no partitions)`,
	}
	fl := cmd.PersistentFlags()
	fl.StringVar(&ft.addrs, "addr", "", "gRPC addresses of the nodes, host:port,...")
	fl.StringVar(&ft.dir, "dir", "", "an arbor dev directory: act on all its nodes")
	fl.StringVar(&ft.clusterID, "cluster-id", "", "cluster id to present (default: from --dir)")
	ft.creds.register(fl)
	fl.BoolVar(&ft.asJSON, "json", false, "print JSON")
	fl.DurationVar(&ft.timeout, "timeout", ft.timeout, timeoutUsage)

	run := func(req func(args []string) (*faultspb.SetFaultsRequest, error)) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			var r *faultspb.SetFaultsRequest
			if req != nil {
				var err error
				if r, err = req(args); err != nil {
					return err
				}
			}
			return ft.apply(cmd.Context(), a, r)
		}
	}
	cmd.AddCommand(
		&cobra.Command{Use: "get", Short: "Show configuration, blocked peers and counts", Args: cobra.NoArgs, RunE: run(nil)},
		&cobra.Command{Use: "set SPEC", Short: "Set the fault configuration (\"off\" for none)", Args: cobra.ExactArgs(1),
			RunE: run(func(args []string) (*faultspb.SetFaultsRequest, error) {
				return &faultspb.SetFaultsRequest{Config: proto.String(args[0])}, nil
			})},
		&cobra.Command{Use: "block IDS", Short: "Make the nodes refuse calls from these node ids", Args: cobra.ExactArgs(1),
			RunE: run(func(args []string) (*faultspb.SetFaultsRequest, error) {
				ids, err := parseNodeIDs(args[0])
				return &faultspb.SetFaultsRequest{Block: ids}, err
			})},
		&cobra.Command{Use: "unblock IDS", Short: "Accept calls from these node ids again", Args: cobra.ExactArgs(1),
			RunE: run(func(args []string) (*faultspb.SetFaultsRequest, error) {
				ids, err := parseNodeIDs(args[0])
				return &faultspb.SetFaultsRequest{Unblock: ids}, err
			})},
		&cobra.Command{Use: "heal", Short: "Remove all faults and partitions", Args: cobra.NoArgs,
			RunE: run(func([]string) (*faultspb.SetFaultsRequest, error) {
				return &faultspb.SetFaultsRequest{Config: proto.String("off"), Blocked: &faultspb.NodeSet{}}, nil
			})},
	)
	return cmd
}

func parseNodeIDs(s string) ([]uint64, error) {
	var ids []uint64
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, err := strconv.ParseUint(part, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("%q is not a positive node id", part)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, errors.New("no node ids")
	}
	return ids, nil
}

// resolve returns the addresses to act on, the cluster id to present and,
// with --dir, what the dev cluster's files say.
func (ft *faultTargets) resolve() ([]string, string, devcluster.Info, error) {
	switch {
	case ft.addrs != "" && ft.dir != "":
		return nil, "", devcluster.Info{}, errors.New("give either --addr or --dir, not both")
	case ft.addrs != "":
		addrs, err := devcluster.ParseAddrs(ft.addrs)
		if err != nil {
			return nil, "", devcluster.Info{}, fmt.Errorf("--addr: %w", err)
		}
		return addrs, ft.clusterID, devcluster.Info{}, nil
	case ft.dir != "":
		info, err := devcluster.ReadInfo(filepath.Clean(ft.dir))
		if err != nil {
			return nil, "", devcluster.Info{}, fmt.Errorf("--dir: %w", err)
		}
		if len(info.Nodes) == 0 {
			return nil, "", devcluster.Info{}, fmt.Errorf("--dir %s: no dev.json listing the nodes", ft.dir)
		}
		var addrs []string
		for _, n := range info.Nodes {
			addrs = append(addrs, n.Addr)
		}
		id := ft.clusterID
		if id == "" {
			id = info.ClusterID
		}
		return addrs, id, info, nil
	}
	return nil, "", devcluster.Info{}, errors.New("no nodes given: use --addr host:port,... or --dir DIR")
}

// apply sends req (nil: a read) to every target node and prints the
// resulting states. It tries every node and reports every failure.
func (ft *faultTargets) apply(ctx context.Context, a *app, req *faultspb.SetFaultsRequest) error {
	addrs, clusterID, info, err := ft.resolve()
	if err != nil {
		return err
	}
	creds, err := ft.creds.load(a.getenv, ft.dir, info)
	if err != nil {
		return err
	}
	ctx, cancel := withStallTimeout(ctx, ft.timeout) // --timeout 0: never (policy.go)
	defer cancel()
	var states []*faultspb.FaultsState
	var errs []error
	for _, addr := range addrs {
		st, err := callAdmin(ctx, addr, clusterID, creds, req)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			continue
		}
		states = append(states, st)
	}
	if ft.asJSON {
		out := make([]json.RawMessage, len(states))
		for i, st := range states {
			if out[i], err = (protojson.MarshalOptions{EmitUnpopulated: true, UseProtoNames: true}).Marshal(st); err != nil {
				return err
			}
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
	} else {
		for i, st := range states {
			writeFaultsState(a, st)
			if i < len(states)-1 {
				fmt.Fprintln(a.stdout)
			}
		}
	}
	return errors.Join(errs...)
}

func callAdmin(ctx context.Context, addr, clusterID string, creds *security.Credentials, req *faultspb.SetFaultsRequest) (*faultspb.FaultsState, error) {
	cc, err := grpc.NewClient(addr, client.DialOptions(clusterID, creds)...)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	admin := faultspb.NewAdminClient(cc)
	if req == nil {
		return admin.GetFaults(ctx, &faultspb.GetFaultsRequest{})
	}
	return admin.SetFaults(ctx, req)
}

func writeFaultsState(a *app, st *faultspb.FaultsState) {
	blocked := "none"
	if len(st.GetBlocked()) > 0 {
		ids := make([]string, len(st.GetBlocked()))
		for i, id := range st.GetBlocked() {
			ids[i] = strconv.FormatUint(id, 10)
		}
		blocked = strings.Join(ids, ", ")
	}
	c := st.GetCounts()
	fmt.Fprintf(a.stdout, "node %d\n  faults:   %s\n  blocked:  %s\n  injected: %d requests lost, %d replies lost, %d calls delayed, %d calls duplicated,\n"+
		"            %d messages dropped, %d delayed, %d duplicated, %d partition rejections\n",
		st.GetNodeId(), st.GetConfig(), blocked,
		c.GetRequestsLost(), c.GetRepliesLost(), c.GetCallsDelayed(), c.GetCallsDuplicated(),
		c.GetMessagesDropped(), c.GetMessagesDelayed(), c.GetMessagesDuplicated(), c.GetPartitionRejections())
}
