package devcluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/arbor-storage/arbor/internal/security"
)

// A first start interrupted after the admin's certificate but before its
// credential file must not leave the cluster without that file for good.
func TestInterruptedAdminCredentialIsReissued(t *testing.T) {
	dir := t.TempDir()
	l := &layout{ClusterID: "dev-test", Nodes: []nodeLayout{{ID: 1}}}
	if err := ensureTLS(dir, l, time.Now()); err != nil {
		t.Fatal(err)
	}
	pem := filepath.Join(dir, TLSDirName, AdminName+CredentialExt)
	if err := os.Remove(pem); err != nil {
		t.Fatal(err)
	}
	if err := ensureTLS(dir, l, time.Now()); err != nil {
		t.Fatalf("second start: %v", err)
	}
	data, err := os.ReadFile(pem)
	if err != nil {
		t.Fatalf("admin credential not written again: %v", err)
	}
	if _, err := security.ParseCredentials(data); err != nil {
		t.Fatalf("admin credential: %v", err)
	}
	if _, err := LoadAdminCredentials(dir); err != nil {
		t.Fatalf("admin certificate and key: %v", err)
	}
}
