// Package kv is Arbor's transactional ordered key-value store as users reach
// it (DESIGN.md §2.5 and §2.7): the distributed B-tree (internal/btree)
// over the cluster's extent store, run as a client library inside the
// caller's process. There is no KV server: like FSS's presentation layer,
// the client reads and writes extent pages itself, with MPSC, and needs
// only the directory's addresses. The arbor CLI's `arbor kv` commands are
// such a client.
//
// # The root
//
// The cluster has one KV tree. Its root's tagged pointer (btree.PageRef,
// encoded by AppendBinary) is the value of the directory's config key
// RootConfigKey. The first client that finds the key missing creates the
// tree in the lowest-numbered extent, for tenant Tenant, and records the
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
)

// Directory is what the KV client needs of the directory: the extent map
// and node table (for the extent client) and the config KV (for the root).
// *directory.Client implements it.
type Directory interface {
	extent.Directory
	GetConfig(ctx context.Context, req *dpb.GetConfigRequest) (*dpb.ConfigEntry, error)
	PutConfig(ctx context.Context, req *dpb.PutConfigRequest) (*dpb.ConfigEntry, error)
}

// File systems (internal/fs) keep their metadata in the same tree, under
// keys whose first byte is in [FileSystemKeysFirst, FileSystemKeysLast]
// (the tuple encoding of a file system number). The kv commands refuse
// keys there, so that no user write can damage a file system.
const (
	FileSystemKeysFirst byte = 0x14
	FileSystemKeysLast  byte = 0x1c
)

// ReservedForFileSystems reports whether key lies in the file systems'
// part of the tree.
func ReservedForFileSystems(key []byte) bool {
	return len(key) > 0 && key[0] >= FileSystemKeysFirst && key[0] <= FileSystemKeysLast
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
// opens its KV tree (creating it on first use).
func Dial(ctx context.Context, addrs []string, logger *slog.Logger, opts ...grpc.DialOption) (*Store, error) {
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
	tr, err := OpenOnExtents(ctx, dir, ec, btree.Config{Logger: logger})
	if err != nil {
		ec.Close()
		dir.Close()
		return nil, err
	}
	return &Store{Tree: tr, closers: []func() error{dir.Close, ec.Close}}, nil
}

// OpenOnExtents opens the cluster's KV tree over the extent store's client
// ec (Open over extentstore.New(ec)). One listing first fills ec's cache:
// opening the tree reads every extent's geometry, one directory call each
// otherwise. A failure of that listing shows again, with context, in
// Open's own.
func OpenOnExtents(ctx context.Context, dir Directory, ec *extent.Client, cfg btree.Config) (*btree.Tree, error) {
	_, _ = ec.Extents(ctx)
	return Open(ctx, dir, extentstore.New(ec), cfg)
}

// Open opens the cluster's KV tree over store, creating it if the
// directory records none. cfg is the tree's configuration; Store, Root and
// Extents are filled in here.
//
// A cluster that is starting or failing over is waited for: while the
// cluster has no extent yet, an extent has no leader, or the directory
// does not answer, Open tries again with retry.Failover's backoff until
// ctx ends (or, if ctx has no deadline, for retry.DefaultOperation; see
// internal/retry). Only an answer that will not change (a corrupt root
// pointer, a refusal) fails at once.
func Open(ctx context.Context, dir Directory, store btree.PageStore, cfg btree.Config) (*btree.Tree, error) {
	ctx, cancel := retry.WithDefault(ctx, retry.DefaultOperation)
	defer cancel()
	var tr *btree.Tree
	err := retry.Do(ctx, retry.Policy{Backoff: retry.Failover, Retryable: transient}, func(ctx context.Context, _ int) error {
		var err error
		tr, err = open(ctx, dir, store, cfg)
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

func open(ctx context.Context, dir Directory, store btree.PageStore, cfg btree.Config) (*btree.Tree, error) {
	extents, err := listExtents(ctx, dir)
	if err != nil {
		return nil, err
	}
	root, err := findRoot(ctx, dir, store, extents)
	if err != nil {
		return nil, err
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
func findRoot(ctx context.Context, dir Directory, store btree.PageStore, extents []uint64) (btree.PageRef, error) {
	e, err := dir.GetConfig(ctx, &dpb.GetConfigRequest{Key: RootConfigKey})
	if err == nil {
		root, derr := btree.DecodePageRef(e.GetValue())
		if derr != nil {
			return btree.PageRef{}, fmt.Errorf("kv: config %q: %w", RootConfigKey, derr)
		}
		return root, nil
	}
	if !directory.IsNotFound(err) {
		return btree.PageRef{}, fmt.Errorf("kv: read config %q: %w", RootConfigKey, err)
	}
	if len(extents) == 0 {
		return btree.PageRef{}, ErrNoExtents
	}
	root, err := btree.Create(ctx, store, extents[0], Tenant)
	if err != nil {
		return btree.PageRef{}, fmt.Errorf("kv: create the tree: %w", err)
	}
	created := uint64(0)
	_, err = dir.PutConfig(ctx, &dpb.PutConfigRequest{Key: RootConfigKey, Value: root.AppendBinary(nil), ExpectedVersion: &created})
	if err == nil {
		return root, nil
	}
	// Another client recorded its tree first (or our write's outcome is
	// unknown): use whatever is recorded, and free our block if it is not
	// ours.
	e, gerr := dir.GetConfig(ctx, &dpb.GetConfigRequest{Key: RootConfigKey})
	if gerr != nil {
		return btree.PageRef{}, fmt.Errorf("kv: record the root: %w (then: %v)", err, gerr)
	}
	winner, derr := btree.DecodePageRef(e.GetValue())
	if derr != nil {
		return btree.PageRef{}, fmt.Errorf("kv: config %q: %w", RootConfigKey, derr)
	}
	if winner != root {
		block := root
		block.Page-- // the root is page 1 of its block (btree.Create)
		_, _ = store.Commit(ctx, []btree.Op{{Kind: btree.OpFreeBlock, Ref: block}})
	}
	return winner, nil
}
