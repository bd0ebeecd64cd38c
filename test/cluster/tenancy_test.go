package cluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/devcluster/devclustertest"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	epb "github.com/arbor-storage/arbor/internal/extent/extentpb"
	"github.com/arbor-storage/arbor/internal/fs"
	"github.com/arbor-storage/arbor/internal/kv"
	mpb "github.com/arbor-storage/arbor/internal/meta/metapb"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// TestTenantsCannotReachEachOthersData is issue 15's tenancy on real
// nodes with mutual TLS: tenant acme makes a file system (with a file), a
// blob and keys; tenant bob's credential is refused on every API of them,
// through the CLI (mount, snapshot, fsck, fs delete, table list, blob
// get/stat/rm/put, kv get/put/scan of acme's space) and through the raw
// RPCs a hand-made client could send (the directory's config and file
// systems, Meta requests by number, extent pages of acme's KV tree and of
// the file systems' metadata, tract reads of acme's blob); afterwards
// acme's data is unchanged and acme's own operations work.
func TestTenantsCannotReachEachOthersData(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, DirectoryVoters: 1})
	bin := devclustertest.Binary(t)
	n1, _ := c.Node(1)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	run := func(creds string, args ...string) (string, error) {
		args = append(args, "--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", creds, "--timeout", "20s")
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "ARBOR_CREDENTIALS=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	admin := c.AdminCredentialFile()
	must := func(creds string, args ...string) string {
		t.Helper()
		out, err := run(creds, args...)
		if err != nil {
			t.Fatalf("arbor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	refused := func(creds string, args ...string) {
		t.Helper()
		out, err := run(creds, args...)
		if err == nil || !strings.Contains(out, "permission denied") {
			t.Errorf("bob: arbor %s: %v\n%s\nwant a permission error", strings.Join(args, " "), err, out)
		}
	}
	for _, name := range []string{"acme", "bob"} {
		must(admin, "tenant", "create", name)
		out, err := exec.CommandContext(ctx, bin, "tenant", "credential", name, filepath.Join(dir, name+".pem"), "--dir", c.Dir()).CombinedOutput()
		if err != nil {
			t.Fatalf("tenant credential %s: %v\n%s", name, err, out)
		}
	}
	acme, bob := filepath.Join(dir, "acme.pem"), filepath.Join(dir, "bob.pem")
	load := func(path string) *security.Credentials {
		cr, err := security.LoadCredentialFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return cr
	}

	// acme's data: a file system with a file, a blob, keys.
	must(acme, "fs", "create", "afs")
	acl, err := client.Dial(client.Options{Addrs: c.DirectoryAddrs(), ClusterID: c.ClusterID(), Credentials: load(acme)})
	if err != nil {
		t.Fatal(err)
	}
	defer acl.Close()
	rec, err := acl.FileSystem(ctx, "afs")
	if err != nil || rec.GetTenant() != "acme" {
		t.Fatalf("afs: %v, %v; want tenant acme", rec, err)
	}
	content := make([]byte, 200<<10) // past fs.MaxInlineBytes: the file has a blob
	_, _ = rand.Read(content)
	writeFile(ctx, t, acl, rec, content)
	blobFile := filepath.Join(dir, "blob.bin")
	if err := os.WriteFile(blobFile, content, 0o600); err != nil {
		t.Fatal(err)
	}
	blobID := strings.TrimSpace(must(acme, "blob", "put", blobFile))
	must(acme, "kv", "put", "k", "acme-value")

	// bob through the CLI.
	mountDir := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mountDir, 0o755); err != nil {
		t.Fatal(err)
	}
	refused(bob, "mount", "afs", mountDir)
	refused(bob, "snapshot", "create", "afs", "s")
	refused(bob, "snapshot", "list", "afs")
	refused(bob, "fsck", "afs")
	refused(bob, "fs", "delete", "afs")
	refused(bob, "fs", "create", "bfs", "--tenant", "acme")
	if out, err := run(bob, "table", "split", "1"); err == nil {
		t.Errorf("bob: table split 1 of acme's file system succeeded:\n%s", out)
	}
	refused(bob, "blob", "get", blobID, filepath.Join(dir, "stolen"))
	refused(bob, "blob", "stat", blobID)
	refused(bob, "blob", "rm", blobID)
	refused(bob, "blob", "put", blobFile, "--id", blobID)
	if out := must(bob, "fs", "list", "--json"); strings.Contains(out, "afs") {
		t.Errorf("bob's fs list shows acme's file system:\n%s", out)
	}
	if out := must(bob, "table", "list"); strings.Contains(out, "[0x0, end)") {
		t.Errorf("bob's table list shows acme's table:\n%s", out)
	}
	if out, err := run(bob, "kv", "get", "k", "--tenant", "acme"); err == nil || !strings.Contains(out, "opens only its own key space") {
		t.Errorf("bob: kv get --tenant acme: %v\n%s", err, out)
	}
	if out, err := run(bob, "kv", "get", "k"); err == nil || strings.Contains(out, "acme-value") {
		t.Errorf("bob: kv get k in its own space: %v\n%s, want not found", err, out)
	}
	must(bob, "kv", "put", "k", "bob-value")
	if out := must(bob, "kv", "scan", "", "~"); strings.Contains(out, "acme") || !strings.Contains(out, "bob-value") {
		t.Errorf("bob's kv scan:\n%s", out)
	}

	// bob through raw RPCs.
	bcc, err := grpc.NewClient(n1.Addr, client.DialOptions(c.ClusterID(), load(bob))...)
	if err != nil {
		t.Fatal(err)
	}
	defer bcc.Close()
	denied := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("bob: %s: %v, want PermissionDenied", what, err)
		}
	}
	d := dpb.NewDirectoryClient(bcc)
	acmeRoot := kv.TenantSpace("acme").RootKey
	_, err = d.GetConfig(ctx, &dpb.GetConfigRequest{Key: acmeRoot})
	denied("GetConfig of acme's KV root", err)
	_, err = d.PutConfig(ctx, &dpb.PutConfigRequest{Key: acmeRoot, Value: []byte("x")})
	denied("PutConfig of acme's KV root", err)
	_, err = d.GetConfig(ctx, &dpb.GetConfigRequest{Key: kv.RootConfigKey})
	denied("GetConfig of the file systems' tree root", err)
	_, err = d.ListConfig(ctx, &dpb.ListConfigRequest{Prefix: ""})
	denied("ListConfig of everything", err)
	_, err = d.GetFileSystem(ctx, &dpb.GetFileSystemRequest{Number: rec.GetNumber()})
	denied("GetFileSystem of afs", err)
	_, err = d.CreateSnapshot(ctx, &dpb.CreateSnapshotRequest{FileSystem: rec.GetNumber(), Name: "s"})
	denied("the directory's CreateSnapshot of afs", err)
	m := mpb.NewMetaClient(bcc)
	hdr := &mpb.Header{Fs: rec.GetNumber(), Session: 7}
	_, err = m.Lookup(ctx, &mpb.LookupRequest{Header: hdr, Dir: &mpb.Handle{D: fs.RootHandle.D, C: fs.RootHandle.C}, Name: "file"})
	denied("Meta Lookup in afs", err)
	_, err = m.Check(ctx, &mpb.CheckRequest{Fs: rec.GetNumber()})
	denied("Meta Check of afs", err)
	_, err = m.CreateSnapshot(ctx, &mpb.CreateSnapshotRequest{Fs: rec.GetNumber(), Name: "s"})
	denied("Meta CreateSnapshot of afs", err)
	_, err = m.DeleteFileSystem(ctx, &mpb.DeleteFileSystemRequest{Name: "afs"})
	denied("Meta DeleteFileSystem of afs", err)
	_, err = m.SplitTable(ctx, &mpb.SplitTableRequest{Table: 1})
	denied("Meta SplitTable", err)

	// Extent pages: acme's KV root and the file systems' tree root, as
	// the administrator reads their pointers.
	acc, err := grpc.NewClient(n1.Addr, c.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer acc.Close()
	rootOf := func(key string) btree.PageRef {
		e, err := dpb.NewDirectoryClient(acc).GetConfig(ctx, &dpb.GetConfigRequest{Key: key})
		if err != nil {
			t.Fatalf("admin: config %s: %v", key, err)
		}
		r, err := btree.DecodePageRef(e.GetValue())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ex := epb.NewExtentClient(bcc)
	for _, key := range []string{acmeRoot, kv.RootConfigKey} {
		r := rootOf(key)
		p := &epb.Pointer{ExtentId: r.Extent, Page: r.Page, Generation: r.Generation, Tenant: r.Tenant}
		_, err := ex.Read(ctx, &epb.ReadRequest{Page: p})
		denied("extent Read of "+key, err)
		_, err = ex.Commit(ctx, &epb.CommitRequest{ExtentId: r.Extent, Elements: []*epb.Element{{Op: &epb.Element_Write{Write: &epb.WriteOp{Page: p, Data: []byte("x")}}}}})
		denied("extent Commit over "+key, err)
		// The same page named as bob's own: the block's owner differs.
		p.Tenant = security.ExtentTenant("bob")
		if resp, err := ex.Read(ctx, &epb.ReadRequest{Page: p}); err == nil {
			t.Errorf("bob read the page of %s under his own tag: %d bytes", key, len(resp.GetData()))
		}
	}

	// Tract reads of acme's blob, at every tractserver.
	g, err := tract.ParseGUID(blobID)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := dpb.NewDirectoryClient(acc).GetTLT(ctx, &dpb.GetTLTRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		n, _ := c.Node(id)
		cc, err := grpc.NewClient(n.Addr, client.DialOptions(c.ClusterID(), load(bob))...)
		if err != nil {
			t.Fatal(err)
		}
		tc := tpb.NewTractServerClient(cc)
		_, err = tc.ReadTract(ctx, &tpb.ReadTractRequest{Guid: g[:], Tract: 0, RowVersion: tl.GetVersion()})
		denied("ReadTract of acme's blob", err)
		_, err = tc.WriteTract(ctx, &tpb.WriteTractRequest{Guid: g[:], Tract: 0, RowVersion: tl.GetVersion(), Data: []byte("x")})
		denied("WriteTract into acme's blob", err)
		cc.Close()
	}
	// Blob operations at the primary of the blob's metadata row.
	metaRow := tl.GetRows()[tract.Locate(g, tract.MetadataTract, len(tl.GetRows()))]
	primary := metaRow.GetSlots()[0]
	pn, _ := c.Node(primary.GetNodeId())
	pcc, err := grpc.NewClient(pn.Addr, client.DialOptions(c.ClusterID(), load(bob))...)
	if err != nil {
		t.Fatal(err)
	}
	defer pcc.Close()
	for _, op := range []tpb.BlobOpKind{tpb.BlobOpKind_BLOB_OP_GET, tpb.BlobOpKind_BLOB_OP_EXTEND, tpb.BlobOpKind_BLOB_OP_DELETE, tpb.BlobOpKind_BLOB_OP_CREATE} {
		_, err := tpb.NewTractServerClient(pcc).BlobOp(ctx, &tpb.BlobOpRequest{Disk: primary.GetDiskIndex(), Guid: g[:], RowVersion: metaRow.GetVersion(),
			Op: op, ExtendTracts: 1, Replication: 1})
		denied("BlobOp "+op.String()+" of acme's blob", err)
	}
	bcl, err := client.Dial(client.Options{Addrs: c.DirectoryAddrs(), ClusterID: c.ClusterID(), Credentials: load(bob)})
	if err != nil {
		t.Fatal(err)
	}
	defer bcl.Close()
	if _, err := bcl.Meta().Check(ctx, rec.GetNumber(), false); !errors.Is(err, syscall.EACCES) {
		t.Errorf("bob: meta client Check of afs: %v, want EACCES", err)
	}

	// acme's data is as acme left it, and acme is served.
	readFile(ctx, t, acl, rec, content)
	got := filepath.Join(dir, "got.bin")
	must(acme, "blob", "get", blobID, got)
	if b, err := os.ReadFile(got); err != nil || !bytes.Equal(b, content) {
		t.Errorf("acme's blob after bob's attempts: %v", err)
	}
	if out := must(acme, "kv", "get", "k"); strings.TrimSpace(out) != "acme-value" {
		t.Errorf("acme's key after bob's attempts: %q", out)
	}
	if out := must(acme, "snapshot", "list", "afs"); strings.Contains(out, "s\t") || strings.Contains(out, " s ") {
		t.Errorf("afs has bob's snapshot:\n%s", out)
	}
	must(acme, "snapshot", "create", "afs", "mine")
	if out := must(acme, "fsck", "afs"); !strings.Contains(out, "clean") {
		t.Errorf("acme's fsck of afs:\n%s", out)
	}
	must(acme, "blob", "stat", blobID)
	if out := must(admin, "fs", "list", "--json"); !strings.Contains(out, `"name": "afs"`) || !strings.Contains(out, `"tenant": "acme"`) {
		t.Errorf("admin's fs list:\n%s", out)
	}
	if out, err := run(admin, "fs", "create", "nfs", "--tenant", "nobody"); err == nil || !strings.Contains(out, `no tenant "nobody"`) {
		t.Errorf("admin: fs create for an unknown tenant: %v\n%s", err, out)
	}
	must(admin, "fs", "create", "bfs", "--tenant", "bob")
	if out := must(bob, "fs", "list"); !strings.Contains(out, "bfs") || strings.Contains(out, "afs") {
		t.Errorf("bob's fs list after the administrator made bfs for bob:\n%s", out)
	}
}

// writeFile writes data to file "file" in the root of rec through cl.
func writeFile(ctx context.Context, t *testing.T, cl *client.Cluster, rec *dpb.FileSystem, data []byte) {
	t.Helper()
	f, err := cl.OpenFS(ctx, rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx)
	a, err := f.Create(ctx, fs.RootHandle, "file", 0o644, fs.Cred{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(ctx, a.Handle, 0, data); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
}

// readFile checks that file "file" in the root of rec holds want.
func readFile(ctx context.Context, t *testing.T, cl *client.Cluster, rec *dpb.FileSystem, want []byte) {
	t.Helper()
	f, err := cl.OpenFS(ctx, rec, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close(ctx)
	a, err := f.Lookup(ctx, fs.RootHandle, "file")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Open(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx, a.Handle)
	got := make([]byte, len(want)+1)
	n, err := f.Read(ctx, a.Handle, 0, got)
	if err != nil || !bytes.Equal(got[:n], want) {
		t.Errorf("acme's file: %d bytes, %v; want its %d bytes", n, err, len(want))
	}
}

// TestTenantNameReuseInheritsNothing: a tenant's identity is its name, so
// a tenant deleted and created again by the same name must find nothing of
// the earlier one (issue 15 review). tenant delete is refused while the
// tenant owns a file system, a blob or KV keys; the name is not given
// again while the deleted tenant's credentials are valid (their holders
// would be the new tenant), nor while anything they created since
// remains; once nothing does, the name is free.
func TestTenantNameReuseInheritsNothing(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, DirectoryVoters: 1})
	bin := devclustertest.Binary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(creds string, args ...string) (string, error) {
		args = append(args, "--cluster", strings.Join(c.DirectoryAddrs(), ","), "--cluster-id", c.ClusterID(), "--credentials", creds, "--timeout", "20s")
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "ARBOR_CREDENTIALS=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	admin := c.AdminCredentialFile()
	must := func(creds string, args ...string) string {
		t.Helper()
		out, err := run(creds, args...)
		if err != nil {
			t.Fatalf("arbor %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	refusedWith := func(want string, creds string, args ...string) {
		t.Helper()
		out, err := run(creds, args...)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("arbor %s: %v\n%s\nwant a refusal saying %q", strings.Join(args, " "), err, out, want)
		}
	}

	must(admin, "tenant", "create", "acme")
	acme := filepath.Join(dir, "acme.pem")
	const validFor = 15 * time.Second
	issued := time.Now()
	if out, err := exec.CommandContext(ctx, bin, "tenant", "credential", "acme", acme, "--dir", c.Dir(), "--valid-for", validFor.String()).CombinedOutput(); err != nil {
		t.Fatalf("tenant credential: %v\n%s", err, out)
	}
	must(acme, "fs", "create", "afs")
	blobFile := filepath.Join(dir, "blob.bin")
	if err := os.WriteFile(blobFile, []byte("acme's blob"), 0o600); err != nil {
		t.Fatal(err)
	}
	blobID := strings.TrimSpace(must(acme, "blob", "put", blobFile))
	must(acme, "kv", "put", "k", "acme-value")

	out, err := run(admin, "tenant", "delete", "acme")
	if err == nil || !strings.Contains(out, "afs") || !strings.Contains(out, blobID) || !strings.Contains(out, "KV space") {
		t.Fatalf("tenant delete while acme owns afs, blob %s and a key: %v\n%s", blobID, err, out)
	}
	must(admin, "fs", "delete", "afs")
	must(admin, "blob", "rm", blobID)
	must(admin, "kv", "del", "k", "--tenant", "acme")
	must(admin, "tenant", "delete", "acme")
	if out := must(admin, "tenant", "list"); strings.Contains(out, "acme") {
		t.Fatalf("tenant list after delete:\n%s", out)
	}

	// The deleted tenant's credential is valid still, and the servers
	// take it: what it creates now would be the next acme's.
	later := strings.TrimSpace(must(acme, "blob", "put", blobFile))
	refusedWith("credentials issued to it are valid until", admin, "tenant", "create", "acme")
	if wait := time.Until(issued.Add(validFor + 2*time.Second)); wait > 0 {
		time.Sleep(wait)
	}
	refusedWith(later, admin, "tenant", "create", "acme")
	must(admin, "blob", "rm", later)
	must(admin, "tenant", "create", "acme")
	if out := must(admin, "fs", "list", "--json"); strings.Contains(out, "afs") {
		t.Errorf("the new acme's cluster lists the old acme's file system:\n%s", out)
	}
}
