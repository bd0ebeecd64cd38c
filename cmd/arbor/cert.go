package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/arbor-storage/arbor/internal/security"
	"github.com/arbor-storage/arbor/internal/server"
)

// defaultCAName names a CA made without --name.
const defaultCAName = "arbor"

func newCertCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Make a cluster CA and the certificates of nodes and clients",
		Long: `Make the credentials of mutual TLS (see README, Security).

A cluster has one CA (arbor cert ca). Every node gets a certificate for the
hosts it is dialled at (arbor cert node), served and presented with
arbor server --tls-dir. Every client gets a credential file (arbor cert
client) that the CLI and mounts take with --credentials or
$` + credentialsEnv + `. The identity is in the certificate, as a URI
subject alternative name: arbor://node/NAME, arbor://admin or
arbor://tenant/T. Keys are ECDSA P-256; nothing is overwritten.`,
	}
	cmd.AddCommand(newCertCACmd(a), newCertNodeCmd(a), newCertClientCmd(a))
	return cmd
}

func newCertCACmd(a *app) *cobra.Command {
	var out, name string
	cmd := &cobra.Command{
		Use:     "ca --out DIR",
		Short:   "Make a cluster CA: DIR/ca.crt and DIR/ca.key",
		Example: "  arbor cert ca --out /etc/arbor/ca",
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if out == "" {
				return errors.New("--out is required: the directory to write ca.crt and ca.key to")
			}
			ca, err := security.NewCA(name, time.Now())
			if err != nil {
				return err
			}
			if err := ca.Save(out); err != nil {
				return fmt.Errorf("write the CA: %w", err)
			}
			fmt.Fprintf(a.stdout, "CA %q written to %s (%s, %s); valid until %s\nKeep %s secret: whoever holds it can make credentials of the cluster.\n",
				ca.Cert.Subject.CommonName, out, security.CACertFile, security.CAKeyFile, ca.Cert.NotAfter.UTC().Format(time.RFC3339),
				filepath.Join(out, security.CAKeyFile))
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write ca.crt and ca.key to (created if missing)")
	cmd.Flags().StringVar(&name, "name", defaultCAName, "the CA's name (its certificate's subject)")
	return cmd
}

// certValidity turns --valid-for into a Request's validity (zero: the
// default).
func certValidity(validFor time.Duration, now time.Time) (time.Time, error) {
	switch {
	case validFor == 0:
		return time.Time{}, nil
	case validFor < 0:
		return time.Time{}, fmt.Errorf("--valid-for %v must be positive", validFor)
	}
	return now.Add(validFor), nil
}

func newCertNodeCmd(a *app) *cobra.Command {
	var caDir, name, out string
	var hosts []string
	var validFor time.Duration
	cmd := &cobra.Command{
		Use:   "node --ca DIR --name N --host H... --out DIR",
		Short: "Make a node's certificate: DIR/node.crt, node.key and ca.crt, for arbor server --tls-dir DIR",
		Example: `  arbor cert node --ca /etc/arbor/ca --name node-1 --host 10.0.0.1 --host n1.example.com --out /etc/arbor/tls
  arbor server --tls-dir /etc/arbor/tls ...`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			switch {
			case caDir == "":
				return errors.New("--ca is required: the directory of the CA (arbor cert ca)")
			case name == "":
				return errors.New("--name is required: the node's name")
			case out == "":
				return errors.New("--out is required: the directory to write the node's credentials to")
			}
			ca, err := security.LoadCA(caDir)
			if err != nil {
				return err
			}
			now := time.Now()
			notAfter, err := certValidity(validFor, now)
			if err != nil {
				return err
			}
			is, err := ca.Issue(security.Request{Identity: security.Node(name), Hosts: hosts, NotAfter: notAfter}, now)
			if err != nil {
				return err
			}
			if err := writeCAFile(out, ca); err != nil {
				return err
			}
			if err := writeIssued(out, server.NodeCertFileName, server.NodeKeyFileName, is); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "node certificate of %s for %v written to %s (%s, %s, %s); valid until %s\n",
				security.Node(name), hosts, out, server.NodeCertFileName, server.NodeKeyFileName, server.CAFileName,
				is.Cert.NotAfter.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&caDir, "ca", "", "directory of the CA (ca.crt, ca.key)")
	cmd.Flags().StringVar(&name, "name", "", "the node's name (its identity arbor://node/NAME)")
	cmd.Flags().StringSliceVar(&hosts, "host", nil, "a host name or IP address the node is dialled at (repeat, or comma-separated)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write node.crt, node.key and ca.crt to")
	cmd.Flags().DurationVar(&validFor, "valid-for", 0, "validity (default one year)")
	return cmd
}

func newCertClientCmd(a *app) *cobra.Command {
	var caDir, name, out, tenant string
	var admin bool
	var validFor time.Duration
	cmd := &cobra.Command{
		Use:   "client --ca DIR --name NAME (--tenant T | --admin) --out DIR",
		Short: "Make a client credential: DIR/NAME.pem (certificate, key and CA in one file), and NAME.crt, NAME.key",
		Example: `  arbor cert client --ca /etc/arbor/ca --name alice --admin --out ~/.arbor
  arbor status --cluster 10.0.0.1:7080 --credentials ~/.arbor/alice.pem`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			switch {
			case caDir == "":
				return errors.New("--ca is required: the directory of the CA (arbor cert ca)")
			case name == "":
				return errors.New("--name is required: the holder's name (the file names and the certificate's subject)")
			case out == "":
				return errors.New("--out is required: the directory to write the credential to")
			case admin == (tenant != ""):
				return errors.New("give exactly one of --tenant T (a tenant's client) and --admin (an administrator)")
			}
			if err := security.CheckName(name); err != nil {
				return fmt.Errorf("--name: %w", err)
			}
			id := security.Admin()
			if tenant != "" {
				id = security.Tenant(tenant)
			}
			now := time.Now()
			notAfter, err := certValidity(validFor, now)
			if err != nil {
				return err
			}
			path, is, err := writeClientCredential(caDir, out, name, id, notAfter, now)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "credential of %s (%s) written to %s; valid until %s\n",
				id, name, path, is.Cert.NotAfter.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&caDir, "ca", "", "directory of the CA (ca.crt, ca.key)")
	cmd.Flags().StringVar(&name, "name", "", "the holder's name")
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant the client belongs to (identity arbor://tenant/T)")
	cmd.Flags().BoolVar(&admin, "admin", false, "an administrator (identity arbor://admin)")
	cmd.Flags().StringVar(&out, "out", "", "directory to write NAME.pem, NAME.crt and NAME.key to")
	cmd.Flags().DurationVar(&validFor, "valid-for", 0, "validity (default one year)")
	return cmd
}

// writeClientCredential issues a client certificate of id with the CA of
// caDir and writes out/name.crt, name.key and the credential file
// out/name.pem, whose path it returns.
func writeClientCredential(caDir, out, name string, id security.Identity, notAfter, now time.Time) (string, *security.Issued, error) {
	ca, err := security.LoadCA(caDir)
	if err != nil {
		return "", nil, err
	}
	is, err := ca.Issue(security.Request{Identity: id, CommonName: name, NotAfter: notAfter}, now)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(out, name+".pem")
	if _, err := os.Stat(path); err == nil {
		return "", nil, fmt.Errorf("%s exists; nothing is overwritten", path)
	}
	if err := writeIssued(out, name+".crt", name+".key", is); err != nil {
		return "", nil, err
	}
	if err := security.WriteNewFile(path, ca.Credential(is), 0o600); err != nil {
		return "", nil, err
	}
	return path, is, nil
}

// writeIssued writes a certificate and its key (0600) into dir, refusing
// to overwrite either.
func writeIssued(dir, certName, keyName string, is *security.Issued) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, n := range []string{certName, keyName} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			return fmt.Errorf("%s exists; nothing is overwritten", filepath.Join(dir, n))
		}
	}
	if err := security.WriteNewFile(filepath.Join(dir, keyName), is.KeyPEM, 0o600); err != nil {
		return err
	}
	return security.WriteNewFile(filepath.Join(dir, certName), is.CertPEM, 0o644)
}

// writeCAFile puts the CA's certificate into dir as ca.crt, unless the
// same one is already there.
func writeCAFile(dir string, ca *security.CA) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, server.CAFileName)
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, ca.CertPEM):
		return nil
	case err == nil:
		return fmt.Errorf("%s holds another CA's certificate; nothing is overwritten", path)
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return security.WriteNewFile(path, ca.CertPEM, 0o644)
}
