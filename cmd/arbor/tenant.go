package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/security"
)

// Tenants are recorded in the directory's configuration store, one key
// each: tenantKeyPrefix + NAME, whose value is a tenantRecord in JSON.
// A tenant writes and deletes only the configuration keys under its own
// directory.TenantConfigPrefix, so only administrators create and delete
// tenants.
const tenantKeyPrefix = "tenant/"

// tenantRecord is what the directory keeps of a tenant.
type tenantRecord struct {
	Name          string `json:"name"`
	CreatedUnixMS int64  `json:"created_unix_ms"`
}

func newTenantCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Create, list and delete tenants, and make their credentials (administrators only)",
		Long: `Tenants are the users of a shared cluster (issue 15). A tenant's clients
present a credential whose certificate names arbor://tenant/NAME. A
tenant's credential is refused every admin RPC (cluster configuration)
and the raft and replication traffic of nodes, and reaches only its own
file systems (arbor fs create --tenant), blobs and KV key space; anything
else is refused with a permission error.

The tenants are recorded in the directory (configuration keys
"` + tenantKeyPrefix + `NAME"). ` + "`arbor tenant credential`" + ` signs a credential with the
cluster CA's key, so it needs the CA directory: --ca DIR, or DIR/tls of
arbor dev with --dir.`,
	}
	cmd.AddCommand(newTenantCreateCmd(a), newTenantListCmd(a), newTenantDeleteCmd(a), newTenantCredentialCmd(a))
	return cmd
}

// withDirectory connects to the cluster's directory and runs f.
func withDirectory(cmd *cobra.Command, a *app, cf *clusterFlags, f func(ctx context.Context, target clusterTarget, d *directory.Client) error) error {
	target, ctx, cancel, err := cf.connect(cmd.Context(), a.getenv)
	if err != nil {
		return err
	}
	defer cancel()
	d, err := directory.Dial(target.Addrs, target.DialOptions()...)
	if err != nil {
		return fmt.Errorf("connect to the directory: %w", err)
	}
	defer d.Close()
	return f(ctx, target, d)
}

func tenantArg(args []string) (string, error) {
	if err := security.CheckName(args[0]); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	return args[0], nil
}

func newTenantCreateCmd(a *app) *cobra.Command {
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Record a new tenant",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := tenantArg(args)
			if err != nil {
				return err
			}
			return withDirectory(cmd, a, &cf, func(ctx context.Context, _ clusterTarget, d *directory.Client) error {
				value, err := json.Marshal(tenantRecord{Name: name, CreatedUnixMS: time.Now().UnixMilli()})
				if err != nil {
					return err
				}
				_, err = d.PutConfig(ctx, &pb.PutConfigRequest{Key: tenantKeyPrefix + name, Value: value, ExpectedVersion: proto.Uint64(0)})
				if errors.Is(err, directory.ErrConflict) {
					return fmt.Errorf("tenant %q exists", name)
				}
				if err != nil {
					return fmt.Errorf("create tenant %q: %w", name, err)
				}
				fmt.Fprintf(a.stdout, "tenant %q created\n", name)
				return nil
			})
		},
	}
	cf.register(cmd)
	return cmd
}

// listTenants reads every tenant record, in name order.
func listTenants(ctx context.Context, d *directory.Client) ([]tenantRecord, error) {
	var out []tenantRecord
	after := ""
	for {
		resp, err := d.ListConfig(ctx, &pb.ListConfigRequest{Prefix: tenantKeyPrefix, StartAfter: after})
		if err != nil {
			return nil, fmt.Errorf("list tenants: %w", err)
		}
		for _, e := range resp.GetEntries() {
			var r tenantRecord
			if err := json.Unmarshal(e.GetValue(), &r); err != nil || r.Name != strings.TrimPrefix(e.GetKey(), tenantKeyPrefix) {
				return nil, fmt.Errorf("tenant record %q is damaged: %q", e.GetKey(), e.GetValue())
			}
			out = append(out, r)
			after = e.GetKey()
		}
		if len(resp.GetEntries()) == 0 || !resp.GetMore() {
			return out, nil
		}
	}
}

func newTenantListCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the tenants",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDirectory(cmd, a, &cf, func(ctx context.Context, _ clusterTarget, d *directory.Client) error {
				ts, err := listTenants(ctx, d)
				if err != nil {
					return err
				}
				if asJSON {
					if ts == nil {
						ts = []tenantRecord{}
					}
					return writeJSON(a.stdout, ts)
				}
				for _, t := range ts {
					fmt.Fprintf(a.stdout, "%s\tcreated %s\n", t.Name, time.UnixMilli(t.CreatedUnixMS).UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: [{name, created_unix_ms}]")
	return cmd
}

func newTenantDeleteCmd(a *app) *cobra.Command {
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a tenant's record (its credentials stay valid until they expire)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := tenantArg(args)
			if err != nil {
				return err
			}
			return withDirectory(cmd, a, &cf, func(ctx context.Context, _ clusterTarget, d *directory.Client) error {
				e, err := d.GetConfig(ctx, &pb.GetConfigRequest{Key: tenantKeyPrefix + name})
				if errors.Is(err, directory.ErrNotFound) {
					return fmt.Errorf("no tenant %q", name)
				}
				if err != nil {
					return fmt.Errorf("delete tenant %q: %w", name, err)
				}
				_, err = d.DeleteConfig(ctx, &pb.DeleteConfigRequest{Key: e.GetKey(), ExpectedVersion: proto.Uint64(e.GetVersion())})
				if err != nil {
					return fmt.Errorf("delete tenant %q: %w", name, err)
				}
				fmt.Fprintf(a.stdout, "tenant %q deleted\n", name)
				return nil
			})
		},
	}
	cf.register(cmd)
	return cmd
}

func newTenantCredentialCmd(a *app) *cobra.Command {
	var cf clusterFlags
	var caDir, holder string
	var validFor time.Duration
	cmd := &cobra.Command{
		Use:   "credential NAME OUT",
		Short: "Write a credential file of tenant NAME to OUT, signed by the cluster CA",
		Example: `  arbor tenant credential acme acme.pem --dir /tmp/arbor
  arbor tenant credential acme acme.pem --cluster 10.0.0.1:7080 --credentials admin.pem --ca /etc/arbor/ca`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := tenantArg(args)
			if err != nil {
				return err
			}
			out := args[1]
			if caDir == "" {
				if cf.dir == "" {
					return errors.New("--ca is required (the cluster CA's directory, with ca.key), or --dir of arbor dev")
				}
				caDir = filepath.Join(cf.dir, devcluster.TLSDirName)
			}
			if holder == "" {
				holder = name
			}
			if err := security.CheckName(holder); err != nil {
				return fmt.Errorf("--holder: %w", err)
			}
			now := time.Now()
			notAfter, err := certValidity(validFor, now)
			if err != nil {
				return err
			}
			ca, err := security.LoadCA(caDir)
			if err != nil {
				return err
			}
			return withDirectory(cmd, a, &cf, func(ctx context.Context, _ clusterTarget, d *directory.Client) error {
				if _, err := d.GetConfig(ctx, &pb.GetConfigRequest{Key: tenantKeyPrefix + name}); errors.Is(err, directory.ErrNotFound) {
					return fmt.Errorf("no tenant %q (arbor tenant create %s)", name, name)
				} else if err != nil {
					return fmt.Errorf("tenant %q: %w", name, err)
				}
				is, err := ca.Issue(security.Request{Identity: security.Tenant(name), CommonName: holder, NotAfter: notAfter}, now)
				if err != nil {
					return err
				}
				if err := security.WriteNewFile(out, ca.Credential(is), 0o600); err != nil {
					return fmt.Errorf("write the credential: %w", err)
				}
				fmt.Fprintf(a.stdout, "credential of %s written to %s; valid until %s\n", security.Tenant(name), out, is.Cert.NotAfter.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&caDir, "ca", "", "the cluster CA's directory (ca.crt, ca.key; default DIR/tls with --dir)")
	cmd.Flags().StringVar(&holder, "holder", "", "the holder's name in the certificate (default the tenant's)")
	cmd.Flags().DurationVar(&validFor, "valid-for", 0, "validity (default one year)")
	return cmd
}

// checkTenantExists refuses a tenant that has no record in the directory
// (nothing to check for "": no tenant named).
func checkTenantExists(ctx context.Context, c *client.Cluster, tenant string) error {
	if tenant == "" {
		return nil
	}
	_, err := c.Directory().GetConfig(ctx, &pb.GetConfigRequest{Key: tenantKeyPrefix + tenant})
	if errors.Is(err, directory.ErrPermissionDenied) {
		// A tenant's credential, which reads no tenant record: the
		// metadata server takes only its own name.
		return nil
	}
	if errors.Is(err, directory.ErrNotFound) {
		return fmt.Errorf("no tenant %q (arbor tenant create %s)", tenant, tenant)
	}
	if err != nil {
		return fmt.Errorf("tenant %q: %w", tenant, err)
	}
	return nil
}
