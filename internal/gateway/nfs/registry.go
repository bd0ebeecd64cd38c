package nfs

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/gateway/sunrpc"
)

// Gateways announce themselves in the directory's configuration, under
// RegistryPrefix + their address, so `arbor status` finds them. The entry
// is only a pointer (a gateway holds no state clients depend on): one
// killed leaves its entry, which Probe then finds not answering.
const RegistryPrefix = "gateway/nfs/"

// Registration is a gateway's entry.
type Registration struct {
	// Addr is where it serves NFS and MOUNT (host:port).
	Addr string `json:"addr"`
	// Node is the node running it (0: a standalone arbor gateway nfs).
	Node          uint64 `json:"node,omitempty"`
	StartedUnixMs int64  `json:"started_unix_ms"`
}

// Registry is the part of the directory's client gateways use.
type Registry interface {
	PutConfig(ctx context.Context, req *dpb.PutConfigRequest) (*dpb.ConfigEntry, error)
	DeleteConfig(ctx context.Context, req *dpb.DeleteConfigRequest) (*dpb.DeleteConfigResponse, error)
	ListConfig(ctx context.Context, req *dpb.ListConfigRequest) (*dpb.ListConfigResponse, error)
}

// Register writes r's entry.
func Register(ctx context.Context, dir Registry, r Registration) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := dir.PutConfig(ctx, &dpb.PutConfigRequest{Key: RegistryPrefix + r.Addr, Value: v}); err != nil {
		return fmt.Errorf("register gateway %s: %w", r.Addr, err)
	}
	return nil
}

// Deregister removes the entry of the gateway at addr.
func Deregister(ctx context.Context, dir Registry, addr string) error {
	if _, err := dir.DeleteConfig(ctx, &dpb.DeleteConfigRequest{Key: RegistryPrefix + addr}); err != nil {
		return fmt.Errorf("deregister gateway %s: %w", addr, err)
	}
	return nil
}

// Registered lists the gateways' entries, by address.
func Registered(ctx context.Context, dir Registry) ([]Registration, error) {
	var out []Registration
	after := ""
	for {
		resp, err := dir.ListConfig(ctx, &dpb.ListConfigRequest{Prefix: RegistryPrefix, StartAfter: after})
		if err != nil {
			return nil, fmt.Errorf("list gateways: %w", err)
		}
		for _, e := range resp.GetEntries() {
			var r Registration
			if err := json.Unmarshal(e.GetValue(), &r); err != nil || r.Addr == "" {
				r = Registration{Addr: strings.TrimPrefix(e.GetKey(), RegistryPrefix)}
			}
			out = append(out, r)
			after = e.GetKey()
		}
		if !resp.GetMore() || len(resp.GetEntries()) == 0 {
			return out, nil
		}
	}
}

// Probe reports whether an NFS server answers NFSv3 NULL at addr within
// ctx.
func Probe(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if err := sunrpc.WriteRecord(conn, sunrpc.EncodeCall(sunrpc.Call{Xid: 1, Prog: ProgNFS, Vers: Version3, Proc: ProcNull})); err != nil {
		return err
	}
	rec, err := sunrpc.ReadRecord(conn, 1<<10)
	if err != nil {
		return err
	}
	rep, err := sunrpc.ParseReply(rec)
	if err != nil {
		return err
	}
	if rep.Denied || rep.Stat != sunrpc.Success {
		return fmt.Errorf("NFS NULL at %s: refused (status %d)", addr, rep.Stat)
	}
	return nil
}
