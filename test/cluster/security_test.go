package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	"github.com/arbor-storage/arbor/internal/faults/faultspb"
	"github.com/arbor-storage/arbor/internal/raftengine/enginepb"
	"github.com/arbor-storage/arbor/internal/security"
)

// writeCredential issues a credential of id with ca and writes it to
// dir/name.pem.
func writeCredential(t *testing.T, ca *security.CA, dir, name string, req security.Request) string {
	t.Helper()
	is, err := ca.Issue(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(path, ca.Credential(is), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// handledCalls is how many calls of method node has served, by its
// /metrics (arbor_rpc_server_handled_total, every status code).
func handledCalls(t *testing.T, httpAddr, method string) int {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "arbor_rpc_server_handled_total{") && strings.Contains(line, `method="`+method+`"`) {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}

// TestMutualTLSAgainstRealNodes: the security foundation of issue 15 on
// real `arbor server` processes. Plain text, another CA's certificate and
// an expired one are refused in the handshake (the node serves no call of
// theirs); a tenant may read the cluster but is refused an admin RPC
// (the fault switch, node drain) and changes nothing; the administrator
// is served; no identity but a node's may call the raft transport.
func TestMutualTLSAgainstRealNodes(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, DirectoryVoters: 1})
	bin := devclustertest.Binary(t)
	n1, _ := c.Node(1)
	ca, err := security.LoadCA(c.TLSDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tenant := writeCredential(t, ca, dir, "tenant", security.Request{Identity: security.Tenant("t1")})
	expired := writeCredential(t, ca, dir, "expired", security.Request{Identity: security.Admin(),
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	other, err := security.NewCA("other", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	stranger := writeCredential(t, other, dir, "stranger", security.Request{Identity: security.Admin()})
	// The stranger trusts this cluster's CA, so only the node refuses it.
	if f, err := os.OpenFile(stranger, os.O_APPEND|os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	} else {
		_, err = f.Write(ca.CertPEM)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const getFaults = "/arbor.faults.v1.Admin/GetFaults"
	callGetFaults := func(opts []grpc.DialOption) error {
		cc, err := grpc.NewClient(n1.Addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		_, err = faultspb.NewAdminClient(cc).GetFaults(cctx, &faultspb.GetFaultsRequest{})
		return err
	}
	load := func(path string) *security.Credentials {
		cr, err := security.LoadCredentialFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}

	before := handledCalls(t, n1.HTTPAddr, getFaults)
	for _, tc := range []struct {
		name string
		opts []grpc.DialOption
	}{
		{"plain text", []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}},
		{"another CA", client.DialOptions(c.ClusterID(), load(stranger))},
		{"expired", client.DialOptions(c.ClusterID(), load(expired))},
	} {
		if err := callGetFaults(tc.opts); status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (a failed handshake)", tc.name, err)
		}
	}
	if after := handledCalls(t, n1.HTTPAddr, getFaults); after != before {
		t.Errorf("node 1 served %d GetFaults calls of refused connections", after-before)
	}
	if err := callGetFaults(c.DialOptions()); err != nil {
		t.Fatalf("admin GetFaults: %v", err)
	}

	arbor := func(creds string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append(args, "--credentials", creds)...)
		cmd.Env = append(os.Environ(), "ARBOR_CREDENTIALS=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	cluster := []string{"--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID()}
	admin := c.AdminCredentialFile()

	// A tenant reads the cluster...
	if out, err := arbor(tenant, append([]string{"nodes", "--json"}, cluster...)...); err != nil {
		t.Fatalf("tenant: arbor nodes: %v\n%s", err, out)
	}
	// ...but may not change its configuration, and changes nothing.
	out, err := arbor(tenant, "debug", "faults", "set", "fail=0.5", "--addr", n1.Addr)
	if err == nil || !strings.Contains(out, "permission denied: arbor://tenant/t1 may not call /arbor.faults.v1.Admin/SetFaults") {
		t.Errorf("tenant: debug faults set: %v\n%s; want permission denied", err, out)
	}
	out, err = arbor(tenant, append([]string{"nodes", "decommission", "2"}, cluster...)...)
	if err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("tenant: nodes decommission: %v\n%s; want permission denied", err, out)
	}
	st, err := c.Faults(ctx, 1)
	if err != nil || st.GetConfig() != "off" {
		t.Errorf("faults after the tenant's refused change: %v, %v; want off", st.GetConfig(), err)
	}
	out, err = arbor(admin, append([]string{"nodes", "--json"}, cluster...)...)
	if err != nil {
		t.Fatalf("admin: arbor nodes: %v\n%s", err, out)
	}
	var view struct {
		Nodes []struct {
			ID    uint64 `json:"id"`
			State string `json:"state"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &view); err != nil || len(view.Nodes) != 2 {
		t.Fatalf("arbor nodes --json: %v\n%s", err, out)
	}
	for _, n := range view.Nodes {
		if n.State == "decommissioned" {
			t.Errorf("node %d decommissioned after the tenant's refused call", n.ID)
		}
	}

	// The administrator may.
	if out, err := arbor(admin, "debug", "faults", "set", "delay=0.01:1ms-2ms", "--addr", n1.Addr); err != nil {
		t.Fatalf("admin: debug faults set: %v\n%s", err, out)
	}
	if out, err := arbor(admin, "debug", "faults", "heal", "--addr", n1.Addr); err != nil {
		t.Fatalf("admin: debug faults heal: %v\n%s", err, out)
	}

	// Tenants: an administrator records them and makes their credentials;
	// a tenant can do neither.
	dev := []string{"--dir", c.Dir()}
	runDev := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append(args, dev...)...)
		cmd.Env = append(os.Environ(), "ARBOR_CREDENTIALS=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := runDev("tenant", "create", "acme"); err != nil {
		t.Fatalf("tenant create: %v\n%s", err, out)
	}
	if out, err := runDev("tenant", "create", "acme"); err == nil || !strings.Contains(out, "exists") {
		t.Errorf("tenant create twice: %v\n%s", err, out)
	}
	if out, err := arbor(tenant, append([]string{"tenant", "create", "evil"}, cluster...)...); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("a tenant creating a tenant: %v\n%s", err, out)
	}
	out, err = runDev("tenant", "list", "--json")
	if err != nil || !strings.Contains(out, `"name": "acme"`) || strings.Contains(out, "evil") {
		t.Fatalf("tenant list: %v\n%s", err, out)
	}
	acme := filepath.Join(dir, "acme.pem")
	if out, err := runDev("tenant", "credential", "acme", acme); err != nil {
		t.Fatalf("tenant credential: %v\n%s", err, out)
	}
	if cr := load(acme); cr.Identity != security.Tenant("acme") {
		t.Fatalf("tenant credential names %v", cr.Identity)
	}
	if out, err := arbor(acme, append([]string{"nodes"}, cluster...)...); err != nil {
		t.Fatalf("acme's credential: arbor nodes: %v\n%s", err, out)
	}
	if out, err := runDev("tenant", "credential", "nobody", filepath.Join(dir, "nobody.pem")); err == nil || !strings.Contains(out, `no tenant "nobody"`) {
		t.Errorf("credential of an unknown tenant: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "nobody.pem")); !os.IsNotExist(err) {
		t.Errorf("a refused credential was written: %v", err)
	}
	if out, err := arbor(tenant, append([]string{"tenant", "delete", "acme"}, cluster...)...); err == nil || !strings.Contains(out, "permission denied") {
		t.Errorf("a tenant deleting a tenant: %v\n%s", err, out)
	}
	if out, err := runDev("tenant", "delete", "acme"); err != nil {
		t.Fatalf("tenant delete: %v\n%s", err, out)
	}
	if out, err := runDev("tenant", "list"); err != nil || strings.Contains(out, "acme") {
		t.Errorf("tenant list after delete: %v\n%s", err, out)
	}

	// Only nodes talk raft.
	cc, err := grpc.NewClient(n1.Addr, c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := enginepb.NewRaftTransportClient(cc).Send(ctx)
	if err == nil {
		_, err = stream.CloseAndRecv()
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("admin on the raft transport: %v, want PermissionDenied", err)
	}
}
