// Package kv is Arbor's transactional ordered key-value store as users reach
// it (DESIGN.md §2.5 and §2.7): the distributed B-tree (internal/btree)
// over the cluster's extent store, run as a client library inside the
// caller's process. There is no KV server: like FSS's presentation layer,
// the client reads and writes extent pages itself, with MPSC, and needs
// only the directory's addresses. The arbor CLI's `arbor kv` commands are
// such a client.
//
// # Key spaces and their roots
//
// The cluster has one tree per key space (Space): the system space, where
// the metadata servers keep the file systems' metadata (SystemSpace:
// config key RootConfigKey, blocks owned by extent tenant Tenant); one
// space per tenant (TenantSpace, issue 15); and the administrators' own
// (AdminSpace). A space's tree lives in blocks owned by the space's extent
// owner, and the extent servers refuse a tenant's credential every block
// that is not owned by security.ExtentTenant of its authenticated name:
// a tenant's KV client reaches its own space only, and no KV credential
// reaches the file systems' metadata (only nodes and administrators can
// name the system space's blocks, and arbor kv never opens it). A space's
// root's tagged pointer (btree.PageRef, encoded by AppendBinary) is the
// value of the directory's config key Space.RootKey (for a tenant, under
// directory.TenantConfigPrefix, the only config keys its credential
// reaches). The first client that finds the key missing creates the tree
// in the lowest-numbered extent, for the space's owner, and records the
// root with a create-only compare-and-set; a client that loses that race
// frees the block it allocated and uses the winner's tree. The tree may
// allocate blocks in every extent that existed when the client opened it.
//
// # Keys and values
//
// Keys are at most btree.DefaultMaxKeyBytes (1 KiB) and values at most
// btree.DefaultMaxValueBytes (4 KiB); a transaction touches at most
// btree.MaxTxnValues (15) keys. Structured keys should use the
// order-preserving tuple encoding (internal/btree/tuple).
package kv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/arbor-storage/arbor/internal/btree"
	"github.com/arbor-storage/arbor/internal/btree/extentstore"
	"github.com/arbor-storage/arbor/internal/directory"
	dpb "github.com/arbor-storage/arbor/internal/directory/directorypb"
	"github.com/arbor-storage/arbor/internal/extent"
	"github.com/arbor-storage/arbor/internal/retry"
	"github.com/arbor-storage/arbor/internal/security"
)

const (
	// RootConfigKey is the directory config key holding the KV tree's root
	// pointer.
	RootConfigKey = "kv/root"
	// Tenant owns the KV tree's blocks (FSS §3 block ownership): no other
	// user's pointer can reach them.
	Tenant uint64 = 1
	// maxExtentPages bounds the pages of the extent map read at open.
	maxExtentPages = 1000
	// adminRootConfigKey is the config key of the administrators' space's
	// root.
	adminRootConfigKey = "admin/kv/root"
)

// Space is one KV key space: a tree whose root pointer is the directory
// config value RootKey and whose blocks are owned by extent tenant Owner.
type Space struct {
	RootKey string
	Owner   uint64
}

// SystemSpace is the cluster's own tree: the file systems' metadata,
// which the metadata servers keep (internal/fs).
func SystemSpace() Space { return Space{RootKey: RootConfigKey, Owner: Tenant} }

// TenantSpace is tenant t's key space, the only one its credentials reach.
func TenantSpace(t string) Space {
	return Space{RootKey: directory.TenantConfigPrefix(t) + "kv/root", Owner: security.ExtentTenant(t)}
}

// AdminSpace is the administrators' own key space (what arbor kv opens
// for an administrator that names no tenant).
func AdminSpace() Space {
	return Space{RootKey: adminRootConfigKey, Owner: security.AdminExtentTenant()}
}

// SpaceOf is the key space a caller of identity id opens by default: a
// tenant's own, or the administrators' for an administrator (or a caller
// of an insecure cluster, which has no identity).
func SpaceOf(id security.Identity) Space {
	if id.Kind == security.KindTenant {
		return TenantSpace(id.Name)
	}
	return AdminSpace()
}

// Directory is what the KV client needs of the directory: the extent map
// and node table (for the extent client) and the config KV (for the root).
// *directory.Client implements it.
type Directory interface {
	extent.Directory
	GetConfig(ctx context.Context, req *dpb.GetConfigRequest) (*dpb.ConfigEntry, error)
	PutConfig(ctx context.Context, req *dpb.PutConfigRequest) (*dpb.ConfigEntry, error)
}

// ErrNoExtents is returned when the cluster has no extent to create the
// tree in yet (the extent manager creates the first ones once storage
// nodes have registered).
var ErrNoExtents = errors.New("kv: the cluster has no extents yet")

// Store is an open KV store: the B-tree client and what it runs on.
type Store struct {
	*btree.Tree
	closers []func() error
}

// Close closes the tree client and its connections.
func (s *Store) Close() error {
	s.Tree.Close()
	var errs []error
	for _, c := range slices.Backward(s.closers) {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// Dial connects to the cluster whose directory members are at addrs and
// opens the tree of key space sp (creating it on first use).
func Dial(ctx context.Context, addrs []string, sp Space, logger *slog.Logger, opts ...grpc.DialOption) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dir, err := directory.Dial(addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("kv: connect to the directory: %w", err)
	}
	ec, err := extent.NewClient(extent.ClientConfig{Directory: dir, DialOptions: opts, Logger: logger})
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("kv: extent client: %w", err)
	}
	tr, err := OpenOnExtents(ctx, dir, ec, sp, btree.Config{Logger: logger})
	if err != nil {
		ec.Close()
		dir.Close()
		return nil, err
	}
	return &Store{Tree: tr, closers: []func() error{dir.Close, ec.Close}}, nil
}

// OpenOnExtents opens the tree of key space sp over the extent store's
// client ec (Open over extentstore.New(ec)). One listing first fills ec's cache:
// opening the tree reads every extent's geometry, one directory call each
// otherwise. A failure of that listing shows again, with context, in
// Open's own.
func OpenOnExtents(ctx context.Context, dir Directory, ec *extent.Client, sp Space, cfg btree.Config) (*btree.Tree, error) {
	_, _ = ec.Extents(ctx)
	return Open(ctx, dir, extentstore.New(ec), sp, cfg)
}

// Open opens the tree of key space sp over store, creating it if the
// directory records none. cfg is the tree's configuration; Store, Root and
// Extents are filled in here.
//
// A cluster that is starting or failing over is waited for: while the
// cluster has no extent yet, an extent has no leader, or the directory
// does not answer, Open tries again with retry.Failover's backoff until
// ctx ends (or, if ctx has no deadline, for retry.DefaultOperation; see
// internal/retry). Only an answer that will not change (a corrupt root
// pointer, a refusal) fails at once.
func Open(ctx context.Context, dir Directory, store btree.PageStore, sp Space, cfg btree.Config) (*btree.Tree, error) {
	ctx, cancel := retry.WithDefault(ctx, retry.DefaultOperation)
	defer cancel()
	var tr *btree.Tree
	err := retry.Do(ctx, retry.Policy{Backoff: retry.Failover, Retryable: transient}, func(ctx context.Context, _ int) error {
		var err error
		tr, err = open(ctx, dir, store, sp, cfg)
		return err
	})
	return tr, err
}

// transient reports whether an error of open may go away by itself: no
// extents yet, an extent without a leader or whose outcome is unknown, or a
// directory that gave no answer (an election, a node down).
func transient(err error) bool {
	switch {
	case errors.Is(err, ErrNoExtents), errors.Is(err, btree.ErrUnavailable), errors.Is(err, btree.ErrAmbiguous),
		errors.Is(err, extent.ErrUnavailable), errors.Is(err, extent.ErrAmbiguous), errors.Is(err, btree.ErrGaveUp):
		return true
	case errors.Is(err, btree.ErrCorrupt), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	var de *directory.Error
	if errors.As(err, &de) {
		return !directory.IsRefusal(err)
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

func open(ctx context.Context, dir Directory, store btree.PageStore, sp Space, cfg btree.Config) (*btree.Tree, error) {
	extents, err := listExtents(ctx, dir)
	if err != nil {
		return nil, err
	}
	root, err := findRoot(ctx, dir, store, sp, extents)
	if err != nil {
		return nil, err
	}
	if root.Tenant != sp.Owner {
		return nil, fmt.Errorf("kv: config %q: the root %v is not owned by the space's owner %d: %w", sp.RootKey, root, sp.Owner, btree.ErrCorrupt)
	}
	if !slices.Contains(extents, root.Extent) {
		extents = append([]uint64{root.Extent}, extents...)
	}
	cfg.Store, cfg.Root, cfg.Extents = store, root, extents
	tr, err := btree.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("kv: open the tree at %v: %w", root, err)
	}
	return tr, nil
}

func listExtents(ctx context.Context, dir Directory) ([]uint64, error) {
	var ids []uint64
	var after uint64
	for range maxExtentPages {
		resp, err := dir.ListExtents(ctx, &dpb.ListExtentsRequest{StartAfter: after})
		if err != nil {
			return nil, fmt.Errorf("kv: list extents: %w", err)
		}
		for _, e := range resp.GetExtents() {
			ids = append(ids, e.GetExtentId())
			after = max(after, e.GetExtentId())
		}
		if len(resp.GetExtents()) == 0 || !resp.GetMore() {
			break
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// findRoot reads the root pointer, or creates the tree and records it.
func findRoot(ctx context.Context, dir Directory, store btree.PageStore, sp Space, extents []uint64) (btree.PageRef, error) {
	e, err := dir.GetConfig(ctx, &dpb.GetConfigRequest{Key: sp.RootKey})
	if err == nil {
		root, derr := btree.DecodePageRef(e.GetValue())
		if derr != nil {
			return btree.PageRef{}, fmt.Errorf("kv: config %q: %w", sp.RootKey, derr)
		}
		return root, nil
	}
	if !directory.IsNotFound(err) {
		return btree.PageRef{}, fmt.Errorf("kv: read config %q: %w", sp.RootKey, err)
	}
	if len(extents) == 0 {
		return btree.PageRef{}, ErrNoExtents
	}
	root, err := btree.Create(ctx, store, extents[0], sp.Owner)
	if err != nil {
		return btree.PageRef{}, fmt.Errorf("kv: create the tree: %w", err)
	}
	created := uint64(0)
	_, err = dir.PutConfig(ctx, &dpb.PutConfigRequest{Key: sp.RootKey, Value: root.AppendBinary(nil), ExpectedVersion: &created})
	if err == nil {
		return root, nil
	}
	// Another client recorded its tree first (or our write's outcome is
	// unknown): use whatever is recorded, and free our block if it is not
	// ours.
	e, gerr := dir.GetConfig(ctx, &dpb.GetConfigRequest{Key: sp.RootKey})
	if gerr != nil {
		return btree.PageRef{}, fmt.Errorf("kv: record the root: %w (then: %v)", err, gerr)
	}
	winner, derr := btree.DecodePageRef(e.GetValue())
	if derr != nil {
		return btree.PageRef{}, fmt.Errorf("kv: config %q: %w", sp.RootKey, derr)
	}
	if winner != root {
		block := root
		block.Page-- // the root is page 1 of its block (btree.Create)
		_, _ = store.Commit(ctx, []btree.Op{{Kind: btree.OpFreeBlock, Ref: block}})
	}
	return winner, nil
}
