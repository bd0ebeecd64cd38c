package tract

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/arbor-storage/arbor/internal/security"
	tpb "github.com/arbor-storage/arbor/internal/tract/tractpb"
)

// Tenancy (issue 15). A blob belongs to the tenant recorded in its
// metadata at create (BlobMeta.tenant): the caller's authenticated tenant,
// or the tenant an administrator or a node names (a file system's tenant,
// for its files' blobs); empty is the cluster's own. A caller whose
// certificate names a tenant reaches only its own blobs: its blob
// operations are checked by the blob's primary under the blob's lock
// (blobOp), and its tract and shard reads and writes by the tractserver
// that serves them, against the owner of the blob life (incarnation) the
// request names. Only the primary of the blob's metadata row knows that
// life's fate, so the owner is asked of it (BlobMetas) and kept for at
// most ownerCacheTTL (blobOwners); the primary that deletes a blob drops
// what it kept of it at once, other servers may keep a deleted life for
// the TTL. A life's incarnation is 64 random bits, drawn anew at each
// create (newIncarnation), so a request naming a life never names another
// life of the same GUID. What keeps a stale owner from doing harm:
//
//  1. A tenant's write of a tract or shard that finds, under the tract's
//     lock, a stored version of another life of the blob is let through
//     only if the life it names is the blob's current one and the
//     tenant's, asked of the metadata row's primary afresh
//     (checkTenantLife): so a tenant whose blob was deleted, and re-created
//     by another tenant under the same GUID, can never replace what the
//     new life wrote, whatever it kept.
//  2. A write of a dead life into a tract the new life has not written
//     yet is never read as the new life's (tract invariant 8: reads name
//     their life), is replaced by the new life's first write of it, and
//     is reclaimed by the scrubber; after ownerCacheTTL every server
//     refuses the dead life outright.
//
// ListBlobs shows a tenant its own blobs only. Refusals are
// PERMISSION_DENIED (codes.PermissionDenied) and run nothing. Nodes and
// administrators reach every blob.

// maxBlobOwners bounds the owners a tractserver keeps; past it, it
// forgets them all (asking again costs one BlobMetas call per blob).
const maxBlobOwners = 1 << 16

// ownerCacheTTL bounds how long a tractserver trusts an owner it asked
// for: after it, a deleted life is refused everywhere (rule 2). Asking
// again costs one BlobMetas call per blob a tenant uses, per server.
const ownerCacheTTL = 2 * time.Second

// blobOwners caches the owner of the blob lives tenants named.
type blobOwners struct {
	mu sync.Mutex
	m  map[GUID]blobOwner
}

type blobOwner struct {
	incarnation uint64
	tenant      string
	// asked is when the metadata row's primary said so.
	asked time.Time
}

// forget drops what the cache keeps of blob g (its deletion).
func (o *blobOwners) forget(g GUID) {
	o.mu.Lock()
	delete(o.m, g)
	o.mu.Unlock()
}

func permissionDenied(format string, args ...any) *Error {
	return errorf(tpb.ErrorCode_PERMISSION_DENIED, "permission denied: "+format, args...)
}

// serviceDesc is the TractServer service with its tenancy guard.
func (s *Service) serviceDesc() *grpc.ServiceDesc {
	return security.GuardService(&tpb.TractServer_ServiceDesc, security.Guard{Check: s.checkTenancy, Filter: filterForTenant})
}

// checkTenancy refuses a tenant's request naming another tenant's blob.
func (s *Service) checkTenancy(ctx context.Context, method string, req any) error {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return nil
	}
	var err error
	switch r := req.(type) {
	case *tpb.BlobOpRequest:
		if r.GetTenant() != "" && r.GetTenant() != t {
			err = permissionDenied("tenant %q may not create a blob for tenant %q", t, r.GetTenant())
		}
		// The blob's owner is checked under its lock (blobOp).
	case *tpb.WriteTractRequest:
		err = s.ownBlob(ctx, r.GetDisk(), r.GetGuid(), r.GetIncarnation(), t)
	case *tpb.ReadTractRequest:
		err = s.ownBlob(ctx, r.GetDisk(), r.GetGuid(), r.GetIncarnation(), t)
	case *tpb.WriteShardRequest:
		err = s.ownBlob(ctx, r.GetDisk(), r.GetGuid(), r.GetIncarnation(), t)
	case *tpb.ReadShardRequest:
		err = s.ownBlob(ctx, r.GetDisk(), r.GetGuid(), r.GetIncarnation(), t)
	case *tpb.RepairStripeRequest:
		err = s.ownBlob(ctx, r.GetDisk(), r.GetGuid(), r.GetIncarnation(), t)
	case *tpb.ListBlobsRequest, *tpb.StatusRequest, *tpb.InventoryRequest:
		// ListBlobs is filtered; the others name no blob.
	default:
		err = permissionDenied("%s is not open to tenants", method)
	}
	return toStatus(ctx, err)
}

// ownBlob refuses unless life incarnation of blob guid belongs to tenant
// t.
func (s *Service) ownBlob(ctx context.Context, diskIndex uint32, guid []byte, incarnation uint64, t string) error {
	d, err := s.disk(diskIndex)
	if err != nil {
		return err
	}
	g, err := guidFromBytes(guid)
	if err != nil {
		return invalidf("%v", err)
	}
	owner, err := s.blobOwner(ctx, d, g, incarnation)
	if err != nil {
		return err
	}
	if owner != t {
		return permissionDenied("blob %s is not tenant %q's", g, t)
	}
	return nil
}

// blobOwner returns the tenant of life incarnation of blob g: the cached
// one (asked within ownerCacheTTL), or the blob's record from the primary
// of its metadata row. A blob that does not exist, or whose current life
// is another, is refused.
func (s *Service) blobOwner(ctx context.Context, d *disk, g GUID, incarnation uint64) (string, error) {
	s.owners.mu.Lock()
	o, ok := s.owners.m[g]
	s.owners.mu.Unlock()
	if ok && o.incarnation == incarnation && s.cfg.Now().Sub(o.asked) < ownerCacheTTL {
		return o.tenant, nil
	}
	return s.askBlobOwner(ctx, d, g, incarnation)
}

// askBlobOwner asks the primary of blob g's metadata row for the owner
// of its life incarnation, and keeps the answer.
func (s *Service) askBlobOwner(ctx context.Context, d *disk, g GUID, incarnation uint64) (string, error) {
	t, err := s.currentTable()
	if err != nil {
		return "", err
	}
	asked := s.cfg.Now()
	row := t.Rows[t.Locate(g, MetadataTract)]
	results, err := d.blobMetas(ctx, row.Slots[0], []*tpb.BlobRef{{Guid: g[:], RowVersion: row.Version}})
	if err != nil {
		return "", errorf(tpb.ErrorCode_NOT_READABLE, "ask for the owner of blob %s: %v", g, err)
	}
	r := results[0]
	switch {
	case r.GetCode() == tpb.ErrorCode_BLOB_NOT_FOUND:
		s.owners.forget(g)
		return "", permissionDenied("no blob %s", g)
	case r.GetCode() != tpb.ErrorCode_OK:
		return "", errorf(r.GetCode(), "ask for the owner of blob %s: %s", g, r.GetMessage())
	case r.GetMeta().GetIncarnation() != incarnation:
		s.owners.forget(g)
		return "", permissionDenied("blob %s: life %016x is not its current one", g, incarnation)
	}
	s.owners.mu.Lock()
	if len(s.owners.m) >= maxBlobOwners || s.owners.m == nil {
		s.owners.m = map[GUID]blobOwner{}
	}
	s.owners.m[g] = blobOwner{incarnation: incarnation, tenant: r.GetMeta().GetTenant(), asked: asked}
	s.owners.mu.Unlock()
	return r.GetMeta().GetTenant(), nil
}

// checkTenantLife is rule 1, under tract k's lock: a tenant's write of
// life incarnation of k's blob, where this disk holds a version of k
// written by life stored (0: none), goes on only if the two are the same
// life, or if the primary of the blob's metadata row says now that the
// life written is the blob's current one and the tenant's. Nodes' and
// administrators' writes are not checked.
func (d *disk) checkTenantLife(ctx context.Context, k tractKey, incarnation, stored uint64) error {
	t, ok := security.CallerTenant(ctx)
	if !ok || stored == 0 || stored == incarnation {
		return nil
	}
	owner, err := d.svc.askBlobOwner(ctx, d, k.guid, incarnation)
	if err != nil {
		return err
	}
	if owner != t {
		return permissionDenied("blob %s is not tenant %q's", k.guid, t)
	}
	return nil
}

// filterForTenant leaves other tenants' blobs out of a tenant's listing.
func filterForTenant(ctx context.Context, _ string, resp any) (any, error) {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		return resp, nil
	}
	if r, ok := resp.(*tpb.ListBlobsResponse); ok {
		kept := r.Blobs[:0]
		for _, b := range r.Blobs {
			if b.GetMeta().GetTenant() == t {
				kept = append(kept, b)
			}
		}
		r.Blobs = kept
	}
	return resp, nil
}

// blobTenant checks a blob operation's tenancy, under the blob's lock:
// a tenant reaches only a live blob of its own (a blob that does not
// exist is answered as such), and a created blob is for the caller's
// tenant, or the one an administrator or a node names. It returns the
// tenant a create records.
func blobTenant(ctx context.Context, req *tpb.BlobOpRequest, old *tpb.BlobMeta, live bool) (string, error) {
	t, ok := security.CallerTenant(ctx)
	if !ok {
		if req.GetTenant() != "" {
			if err := security.CheckName(req.GetTenant()); err != nil {
				return "", invalidf("tenant: %v", err)
			}
		}
		return req.GetTenant(), nil
	}
	if live && old.GetTenant() != t {
		return "", permissionDenied("blob is not tenant %q's", t)
	}
	return t, nil
}
