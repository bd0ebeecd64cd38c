package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/arbor-storage/arbor/internal/client"
	"github.com/arbor-storage/arbor/internal/devcluster"
	"github.com/arbor-storage/arbor/internal/directory"
	pb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/kv"
	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/tract"
)

// Tenants are recorded in the directory's configuration store, one key
// each: tenantKeyPrefix + NAME, whose value is a tenantRecord in JSON.
// A tenant writes and deletes only the configuration keys under its own
// directory.TenantConfigPrefix, so only administrators create and delete
// tenants.
//
// A tenant's identity is its name (arbor://tenant/NAME in its
// certificates): every file system, blob and key space it owns is keyed by
// the name, and so is every credential. So a tenant deleted and created
// again by the same name must not find anything of the earlier one
// (issue 15): rather than an incarnation in every ownership record and
// certificate, the name is reused only once nothing of the earlier tenant
// remains.
//
//  1. tenant delete refuses while the tenant owns a file system, a live
//     blob or a key of its KV space (tenantRemains); then it deletes the
//     tenant's configuration keys (its KV root, whose tree is empty) and
//     leaves the record as a tombstone (DeletedUnixMS) that remembers
//     until when the credentials issued to it are valid.
//  2. tenant create refuses a name whose tombstone's credentials are still
//     valid (their holders would be the new tenant), and a name of which
//     anything remains (file systems, blobs, configuration keys: what a
//     deleted tenant's still-valid credential, or one arbor cert client
//     made outside the record, may have created since).
//  3. tenant credential records the expiry of what it issues before it
//     writes the credential (CredentialsUntilUnixMS), so (2) knows it.
//     Certificates made with arbor cert client --tenant are not recorded:
//     an operator who deletes a tenant must not make them for its name.
const tenantKeyPrefix = "tenant/"

// tenantRecord is what the directory keeps of a tenant.
type tenantRecord struct {
	Name          string `json:"name"`
	CreatedUnixMS int64  `json:"created_unix_ms"`
	// CredentialsUntilUnixMS is when the last-expiring credential that
	// arbor tenant credential issued for the tenant expires (0: none).
	CredentialsUntilUnixMS int64 `json:"credentials_until_unix_ms,omitempty"`
	// DeletedUnixMS, if set, makes the record a tombstone: the tenant was
	// deleted then, and its name is free once CredentialsUntilUnixMS has
	// passed and nothing of it remains.
	DeletedUnixMS int64 `json:"deleted_unix_ms,omitempty"`
}

// getTenant reads tenant name's record and its version; ok is false if
// there is none (a tombstone is returned, with ok true).
func getTenant(ctx context.Context, d *directory.Client, name string) (rec tenantRecord, version uint64, ok bool, err error) {
	e, err := d.GetConfig(ctx, &pb.GetConfigRequest{Key: tenantKeyPrefix + name})
	if errors.Is(err, directory.ErrNotFound) {
		return tenantRecord{}, 0, false, nil
	}
	if err != nil {
		return tenantRecord{}, 0, false, fmt.Errorf("tenant %q: %w", name, err)
	}
	if err := json.Unmarshal(e.GetValue(), &rec); err != nil || rec.Name != name {
		return tenantRecord{}, 0, false, fmt.Errorf("tenant record %q is damaged: %q", e.GetKey(), e.GetValue())
	}
	return rec, e.GetVersion(), true, nil
}

// maxRemainsListed bounds the file systems, blobs and keys tenantRemains
// names.
const maxRemainsListed = 5

// tenantRemains says what tenant name still owns: its file systems, live
// blobs, and its configuration keys (with anyConfig) or else the keys of
// its KV space (its configuration keys, the KV root among them, are then
// the caller's to delete). Empty: nothing.
func tenantRemains(ctx context.Context, a *app, target clusterTarget, d *directory.Client, name string, anyConfig bool) (string, error) {
	var parts []string
	fss, err := d.ListFileSystems(ctx, &pb.ListFileSystemsRequest{})
	if err != nil {
		return "", fmt.Errorf("list file systems: %w", err)
	}
	var names []string
	for _, f := range fss.GetFileSystems() {
		if f.GetTenant() == name {
			names = append(names, f.GetName())
		}
	}
	if len(names) > 0 {
		parts = append(parts, fmt.Sprintf("file systems %s (arbor fs delete)", strings.Join(names, ", ")))
	}
	tc, err := tract.NewClient(tract.ClientConfig{Directory: d, DialOptions: target.DialOptions(), Logger: a.logger})
	if err != nil {
		return "", err
	}
	defer tc.Close()
	blobs, err := tc.TenantBlobs(ctx, name, maxRemainsListed)
	if err != nil {
		return "", fmt.Errorf("list blobs: %w", err)
	}
	if len(blobs) > 0 {
		ids := make([]string, len(blobs))
		for i, g := range blobs {
			ids[i] = g.String()
		}
		more := ""
		if len(blobs) == maxRemainsListed {
			more = ", ..."
		}
		parts = append(parts, fmt.Sprintf("blobs %s%s (arbor blob rm)", strings.Join(ids, ", "), more))
	}
	keys, err := tenantConfigKeys(ctx, d, name)
	if err != nil {
		return "", err
	}
	switch {
	case len(keys) == 0 || !anyConfig && !slices.Contains(keys, kv.TenantSpace(name).RootKey):
	case anyConfig:
		parts = append(parts, fmt.Sprintf("configuration keys %s", strings.Join(keys, ", ")))
	default:
		kvs, err := kv.Dial(ctx, target.Addrs, kv.TenantSpace(name), a.logger, target.DialOptions()...)
		if err != nil {
			return "", fmt.Errorf("open tenant %q's key space: %w", name, err)
		}
		n := 0
		errEnough := errors.New("enough")
		err = kvs.Scan(ctx, nil, nil, func(_, _ []byte) error {
			n++
			return errEnough
		})
		_ = kvs.Close()
		if err != nil && !errors.Is(err, errEnough) {
			return "", fmt.Errorf("scan tenant %q's key space: %w", name, err)
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("keys in its KV space (arbor kv --tenant %s)", name))
		}
	}
	return strings.Join(parts, "; "), nil
}

// tenantConfigKeys lists the configuration keys under tenant name's
// directory.TenantConfigPrefix (its KV root and what it put there).
func tenantConfigKeys(ctx context.Context, d *directory.Client, name string) ([]string, error) {
	var out []string
	after := ""
	for {
		resp, err := d.ListConfig(ctx, &pb.ListConfigRequest{Prefix: directory.TenantConfigPrefix(name), StartAfter: after})
		if err != nil {
			return nil, fmt.Errorf("list tenant %q's configuration keys: %w", name, err)
		}
		for _, e := range resp.GetEntries() {
			out = append(out, e.GetKey())
			after = e.GetKey()
		}
		if len(resp.GetEntries()) == 0 || !resp.GetMore() {
			return out, nil
		}
	}
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
			return withDirectory(cmd, a, &cf, func(ctx context.Context, target clusterTarget, d *directory.Client) error {
				old, version, exists, err := getTenant(ctx, d, name)
				if err != nil {
					return err
				}
				now := time.Now()
				switch {
				case exists && old.DeletedUnixMS == 0:
					return fmt.Errorf("tenant %q exists", name)
				case exists && now.UnixMilli() < old.CredentialsUntilUnixMS:
					return fmt.Errorf("tenant %q was deleted, but credentials issued to it are valid until %s, and their holders would be the new tenant: wait until then or choose another name",
						name, time.UnixMilli(old.CredentialsUntilUnixMS).UTC().Format(time.RFC3339))
				}
				remains, err := tenantRemains(ctx, a, target, d, name, true)
				if err != nil {
					return fmt.Errorf("create tenant %q: %w", name, err)
				}
				if remains != "" {
					return fmt.Errorf("create tenant %q: what an earlier tenant of the name owned remains, and the new one would own it: %s", name, remains)
				}
				value, err := json.Marshal(tenantRecord{Name: name, CreatedUnixMS: now.UnixMilli()})
				if err != nil {
					return err
				}
				_, err = d.PutConfig(ctx, &pb.PutConfigRequest{Key: tenantKeyPrefix + name, Value: value, ExpectedVersion: proto.Uint64(version)})
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
			if r.DeletedUnixMS == 0 {
				out = append(out, r)
			}
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
		Short: "Delete a tenant that owns nothing any more (its credentials stay valid until they expire)",
		Long: `Delete a tenant: refused while it owns a file system, a blob or a key of
its KV space (delete them first), since a tenant created again by the
same name would own them. Its configuration keys (its KV root) go with it.
Its credentials stay valid until they expire, and until then the name
cannot be given to a new tenant (whose holders they would be).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := tenantArg(args)
			if err != nil {
				return err
			}
			return withDirectory(cmd, a, &cf, func(ctx context.Context, target clusterTarget, d *directory.Client) error {
				rec, version, exists, err := getTenant(ctx, d, name)
				if err != nil {
					return err
				}
				if !exists || rec.DeletedUnixMS != 0 {
					return fmt.Errorf("no tenant %q", name)
				}
				remains, err := tenantRemains(ctx, a, target, d, name, false)
				if err != nil {
					return fmt.Errorf("delete tenant %q: %w", name, err)
				}
				if remains != "" {
					return fmt.Errorf("delete tenant %q: it still owns %s; delete them first (a tenant created again by the name would own them)", name, remains)
				}
				keys, err := tenantConfigKeys(ctx, d, name)
				if err != nil {
					return err
				}
				for _, k := range keys {
					if _, err := d.DeleteConfig(ctx, &pb.DeleteConfigRequest{Key: k}); err != nil && !errors.Is(err, directory.ErrNotFound) {
						return fmt.Errorf("delete tenant %q's configuration key %q: %w", name, k, err)
					}
				}
				now := time.Now().UnixMilli()
				if rec.CredentialsUntilUnixMS <= now {
					_, err = d.DeleteConfig(ctx, &pb.DeleteConfigRequest{Key: tenantKeyPrefix + name, ExpectedVersion: proto.Uint64(version)})
				} else {
					rec.DeletedUnixMS = now
					var value []byte
					if value, err = json.Marshal(rec); err != nil {
						return err
					}
					_, err = d.PutConfig(ctx, &pb.PutConfigRequest{Key: tenantKeyPrefix + name, Value: value, ExpectedVersion: proto.Uint64(version)})
				}
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
				rec, version, exists, err := getTenant(ctx, d, name)
				if err != nil {
					return err
				}
				if !exists || rec.DeletedUnixMS != 0 {
					return fmt.Errorf("no tenant %q (arbor tenant create %s)", name, name)
				}
				is, err := ca.Issue(security.Request{Identity: security.Tenant(name), CommonName: holder, NotAfter: notAfter}, now)
				if err != nil {
					return err
				}
				// Recorded before the credential exists: a tenant deleted
				// and created again must know until when it is valid.
				if until := is.Cert.NotAfter.UnixMilli(); until > rec.CredentialsUntilUnixMS {
					rec.CredentialsUntilUnixMS = until
					value, err := json.Marshal(rec)
					if err != nil {
						return err
					}
					if _, err := d.PutConfig(ctx, &pb.PutConfigRequest{Key: tenantKeyPrefix + name, Value: value, ExpectedVersion: proto.Uint64(version)}); err != nil {
						return fmt.Errorf("record the credential's expiry in tenant %q's record: %w", name, err)
					}
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
	rec, _, exists, err := getTenant(ctx, c.Directory(), tenant)
	if errors.Is(err, directory.ErrPermissionDenied) {
		// A tenant's credential, which reads no tenant record: the
		// metadata server takes only its own name.
		return nil
	}
	if err != nil {
		return err
	}
	if !exists || rec.DeletedUnixMS != 0 {
		return fmt.Errorf("no tenant %q (arbor tenant create %s)", tenant, tenant)
	}
	return nil
}
